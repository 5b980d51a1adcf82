"""Limits shared by the /v1 API's handlers: the size of a request body.

body = await limits.read_body(request)   # PayloadTooLargeError past API_MAX_BODY
"""

from __future__ import annotations

from starlette.requests import Request

from receiver.errors import PayloadTooLargeError

# Bytes an API request body may have: a subscription (a URL of 2,048 characters at most
# and a few event names) or an action fits many times over. Ingest has its own limit,
# RECEIVER_MAX_BODY; this one is fixed.
API_MAX_BODY = 16 * 1024


async def read_body(request: Request, limit: int = API_MAX_BODY) -> bytes:
    """The request's body, refused with 413 payload_too_large as soon as it is known to
    be over limit: by its Content-Length before a byte is read, else while it streams."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise PayloadTooLargeError(
            f"body of {int(length)} bytes exceeds the API's limit of {limit} bytes"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"body exceeds the API's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
