"""Reading an HTTP target's answer, for the channels that post to one (subscribers, ntfy):
the start of its body for the attempt log, never the rest, and its Retry-After."""

from __future__ import annotations

import email.utils

import httpx

__all__ = ["EXCERPT", "EXCERPT_SHOWN", "read_excerpt", "retry_after"]

EXCERPT = 4096  # bytes of a target's answer read at most; the rest is never read
EXCERPT_SHOWN = 300  # characters of it kept in the attempt's error


async def read_excerpt(response: httpx.Response) -> str:
    """The start of a response's body (EXCERPT bytes at most, as text, one line) for the
    attempt log. The rest is never read: leaving the stream closes the connection, so a
    subscriber answering with 300 MB costs us 4 KB."""
    chunks: list[bytes] = []
    size = 0
    if response.is_stream_consumed:  # an answer given whole (a test's mock transport)
        chunks.append(response.content[:EXCERPT])
    else:
        async for chunk in response.aiter_raw():
            chunks.append(chunk)
            size += len(chunk)
            if size >= EXCERPT:
                break
    text = b"".join(chunks)[:EXCERPT].decode("utf-8", "replace")
    return " ".join(text.split())[:EXCERPT_SHOWN]


def retry_after(value: str | None, now: float) -> float | None:
    """Retry-After as seconds from now: a number of seconds, or an HTTP date."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError):
        return None
