"""The servers `make bench` measures, each on core 0 (the ceiling, the receiver,
adnanh/webhook), and the sink the bench rules' notifications go to."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import extra

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SECRET = "bench-secret-0123456789abcdef"
SERVER_CPU = "0"
LOAD_CPU = "1"
TARGETS = ("ceiling", "receiver", "webhook")


# -- the notification sink ------------------------------------------------------------------


class Sink:
    """A local HTTP server the bench rules' json:// notifier posts to; it only counts."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: dict[str, float] = {}  # e2e event id -> when its notification arrived
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                now = time.perf_counter()
                for event_id in extra.find_event_ids(body.decode(errors="replace")):
                    sink.seen.setdefault(event_id, now)
                sink.count += 1
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


# -- servers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    path: str
    ready: str  # a GET path answering 200 when up, or "" to wait for the port
    log: Path
    db: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    start_within: float = 30.0  # seconds to answer `ready` before the run gives up
    stop_within: float = 20.0  # seconds after SIGTERM before SIGKILL

    def start(self, pin: bool) -> Server:
        argv = ["taskset", "-c", SERVER_CPU, *self.argv] if pin else self.argv
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + self.start_within
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"{self.name} exited {self.proc.returncode}; see {self.log}:\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            if answers(self.port, self.ready):
                return self
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"{self.name} did not start within {self.start_within:g}s; see {self.log}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_within)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def answers(port: int, path: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            if not path:
                return True
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def make_server(
    name: str,
    work: Path,
    sink_port: int,
    *,
    db: Path | None = None,
    env_extra: dict[str, str] | None = None,
    workers: int = 0,
) -> Server:
    port = free_port()
    env = {
        **os.environ,
        "RECEIVER_SECRETS": SECRET,
        "BENCH_SECRET": SECRET,
        "BENCH_SINK_PORT": str(sink_port),
        "PYTHONPATH": str(ROOT),
    }
    log = work / f"{name}.log"
    if name == "ceiling":
        return Server(
            name,
            [sys.executable, "-m", "bench.ceiling", "--port", str(port)],
            env,
            port,
            "/v1/events",
            "/healthz",
            log,
        )
    if name == "receiver":
        db = db or work / f"receiver-{time.monotonic_ns()}.db"
        env |= {
            "RECEIVER_PORT": str(port),
            "RECEIVER_DB": str(db),
            "RECEIVER_RULES": str(BENCH / "rules.yaml"),
            "RECEIVER_LOG_LEVEL": "warning",
            **(env_extra or {}),
        }
        argv = [sys.executable, "-m", "receiver", "serve"]
        if workers:
            # What `--workers` means for uvicorn; receiver serve runs one process.
            argv = [sys.executable, "-m", "uvicorn", "--factory", "receiver.app:from_env"]
            argv += ["--port", str(port), "--workers", str(workers), "--no-access-log"]
            argv += ["--log-level", "warning", "--no-server-header"]
        return Server(
            name,
            argv,
            env,
            port,
            "/v1/events",
            "/healthz",
            log,
            db=db,
        )
    webhook = shutil.which("webhook")
    assert webhook is not None
    return Server(
        name,
        [
            webhook,
            "-ip",
            "127.0.0.1",
            "-port",
            str(port),
            "-template",
            "-hooks",
            str(BENCH / "webhook-hooks.json"),
        ],
        env,
        port,
        "/hooks/events",
        "",
        log,
    )
