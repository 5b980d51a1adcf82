"""The real receiver as a child process: `python -m receiver serve` under uvicorn on a free port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from receiver import signature
from tests.servers import free_port

SECRET = "test-secret-0123456789"
STARTUP_TIMEOUT = 20.0


class Receiver:
    """Start, stop, kill and restart the receiver on one database file and port."""

    def __init__(
        self,
        tmp: Path,
        *,
        rules: str | None = None,
        env: dict[str, str] | None = None,
        secret: str = SECRET,
    ) -> None:
        self.tmp = tmp
        self.db = tmp / "receiver.db"
        self.rules = tmp / "rules.yaml"
        if rules is not None or not self.rules.exists():
            self.rules.write_text(rules or "rules:\n  - name: all\n    notify: [console]\n")
        self.log = tmp / "receiver.log"
        self.port = free_port()
        self.secret = secret
        self.env = {
            **os.environ,
            "RECEIVER_PORT": str(self.port),
            "RECEIVER_DB": str(self.db),
            "RECEIVER_RULES": str(self.rules),
            "RECEIVER_SECRETS": secret,
            "RECEIVER_LOG_LEVEL": "debug",
            "RECEIVER_RETRY_INITIAL": "0.3",
            "RECEIVER_NOTIFY_TIMEOUT": "3",
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "receiver", "serve"], env=self.env, stdout=log, stderr=log
        )
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"receiver exited {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise AssertionError(f"receiver did not start in {STARTUP_TIMEOUT}s:\n{self.logs()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def post(
        self, body: bytes, headers: dict[str, str] | None = None, client: httpx.Client | None = None
    ) -> httpx.Response:
        return (client or httpx).post(
            f"{self.url}/v1/events",
            content=body,  # type: ignore[attr-defined, no-any-return]
            headers=headers or {},
            timeout=15,
        )

    def send(self, event: dict[str, Any], client: httpx.Client | None = None) -> httpx.Response:
        body = json.dumps(event).encode()
        return self.post(
            body, {signature.SIGNATURE_HEADER: signature.sign(self.secret.encode(), body)}, client
        )

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=10)

    def metric(self, name: str, labels: str = "") -> float:
        """A sample's value from /metrics, 0 if absent."""
        wanted = f"{name}{{{labels}}}" if labels else name
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


def signed(body: bytes, secret: str = SECRET) -> dict[str, str]:
    return {signature.SIGNATURE_HEADER: signature.sign(secret.encode(), body)}
