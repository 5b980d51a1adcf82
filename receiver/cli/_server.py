"""The uvicorn settings `receiver serve` runs with, in one process or in each worker."""

from __future__ import annotations

from typing import Any

from receiver.settings import Settings


def server_config(app: Any, settings: Settings) -> Any:
    """The uvicorn settings `receiver serve` runs with (the bench's ceiling uses them too)."""
    import uvicorn

    from receiver.edge.http import guarded_protocol

    metrics = getattr(getattr(app, "state", None), "metrics", None)
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        # Requests in flight get half the shutdown grace; sends in flight what is left.
        # (Typed int, but uvicorn only hands it to asyncio.wait_for: a float is fine.)
        timeout_graceful_shutdown=settings.shutdown_grace / 2,  # type: ignore[arg-type]
        server_header=False,
        limit_concurrency=settings.limit_concurrency or None,
        http=guarded_protocol(
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            on_refused=(lambda code: metrics.rejected[code].inc()) if metrics else None,
        ),
    )
