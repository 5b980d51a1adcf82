"""The read API bench's servers: the receiver on the big store, a bare Starlette endpoint
returning the same JSON (`python -m bench.api --serve-bare`); started and stopped as every
bench server is (bench.servers), the notification sink its Sink."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bench.api_store import (
    BENCH,
    ROOT,
    SECRET,
)
from bench.servers import Server, free_port


def _server(name: str, argv: list[str], env: dict[str, str], log: Path) -> Server:
    """A server on a free port, up once its /healthz answers."""
    port = free_port()
    argv = [a.replace("{port}", str(port)) for a in argv]
    env = {**env, "RECEIVER_PORT": str(port)}
    return Server(name, argv, env, port, "", "/healthz", log, start_within=60, stop_within=30)


def receiver_server(db: Path, work: Path, sink_port: int) -> Server:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RECEIVER_SECRETS": SECRET,
        "RECEIVER_DB": str(db),
        "RECEIVER_RULES": str(BENCH / "rules.yaml"),
        "RECEIVER_LOG_LEVEL": "warning",
        "BENCH_SINK_PORT": str(sink_port),
    }
    argv = [sys.executable, "-m", "receiver", "serve"]
    return _server("receiver", argv, env, work / "receiver.log")


def bare_server(body: Path, work: Path) -> Server:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "bench.api", "--serve-bare", "--port", "{port}"]
    return _server("bare", [*argv, "--body", str(body)], env, work / "bare.log")


def serve_bare(port: int, body: Path) -> None:
    """A bare Starlette endpoint answering GET /v1/sessions/{id} with body's JSON, on the
    uvicorn settings of `receiver serve`: what the receiver's GET costs beyond the stack."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from receiver.cli import server_config
    from receiver.settings import Settings

    data = json.loads(body.read_text())

    async def one(request: Request) -> Response:
        return JSONResponse(data)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [Route("/v1/sessions/{id}", one), Route("/healthz", healthz)]
    app = Starlette(routes=routes)
    uvicorn.Server(server_config(app, Settings(port=port))).run()
