"""The read API bench's servers: the receiver on the big store, a bare Starlette endpoint
returning the same JSON (`python -m bench.api --serve-bare`), and the notification sink."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.api_store import (
    BENCH,
    ROOT,
    SECRET,
    SERVER_CPU,
)

# -- servers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A server process on core 0 (when pinning), stopped by stop() whatever happened."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = log_path
        self.port = free_port()
        self.env["RECEIVER_PORT"] = str(self.port)
        self.argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, pin: bool) -> Server:
        argv = ["taskset", "-c", SERVER_CPU, *self.argv] if pin else self.argv
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"{self.name} exited {self.proc.returncode}; see {self.log}:\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            if _answers(self.port, "/healthz"):
                return self
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"{self.name} did not start within 60s; see {self.log}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def _answers(port: int, path: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


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
    return Server("receiver", argv, env, work / "receiver.log")


def bare_server(body: Path, work: Path) -> Server:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "bench.api", "--serve-bare", "--port", "{port}"]
    return Server("bare", [*argv, "--body", str(body)], env, work / "bare.log")


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


class Sink:
    """Where the bench rules' json:// notifier posts (under 0.1% of the ingest stream)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
