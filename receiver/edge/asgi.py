"""The ASGI app's shape: POST /v1/events straight to ingest, and the one table that turns
every error into the JSON error body."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ExceptionHandler, Receive, Scope, Send

from receiver.edge.ingest import IngestEndpoint
from receiver.errors import RequestError

# The name the app logged these lines under before they moved here; log filters rely on it.
log = logging.getLogger("receiver")


class ReceiverApp(Starlette):
    """The Starlette app, with POST /v1/events sent straight to the ingest endpoint.

    The hot path skips Starlette's middleware and router (about a tenth of the CPU
    a delivery costs); every other request, and the lifespan, go through Starlette
    as usual. The route stays registered too, so a POST under a root path still works.
    """

    def __init__(self, ingest: IngestEndpoint, **options: Any) -> None:
        super().__init__(**options)
        # Starlette answers "/healthz/" with a 307 to "/healthz" on the host the request's
        # Host header names (any host a client likes); here it is a JSON 404 like any path.
        self.router.redirect_slashes = False
        self.ingest = ingest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == "/v1/events"
            and scope["method"] == "POST"
            and not scope.get("root_path")
        ):
            try:
                await self.ingest(scope, receive, send)
            except Exception:
                # What ServerErrorMiddleware would do: log it, answer the JSON 500.
                log.exception("internal error on POST /v1/events")
                with contextlib.suppress(Exception):
                    await _INTERNAL_ERROR(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _CODES.get(exc.status_code, "http_error")
    message = f"{request.method} {request.url.path}: {exc.detail.lower()}"
    return JSONResponse(
        {"error": {"code": code, "message": message}},
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _request_error(request: Request, exc: Exception) -> Response:
    """A refused request (receiver.errors.RequestError): its status, code and message."""
    assert isinstance(exc, RequestError)
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)


_INTERNAL_ERROR = JSONResponse(
    {"error": {"code": "internal_error", "message": "internal error; see the receiver's log"}},
    status_code=500,
)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return _INTERNAL_ERROR


# Each error to its response, once: a refused request, Starlette's 404/405, anything else.
EXCEPTION_HANDLERS: dict[Any, ExceptionHandler] = {
    HTTPException: _http_error,
    RequestError: _request_error,
    Exception: _internal_error,
}
