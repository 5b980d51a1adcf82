"""The fake upstream as a child process: `python -m receiver simulate --serve-api` on a free
port, as tests and the demo run it; stopped by its fixture (and by conftest if left)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests import harness
from tests.servers import free_port

KEYS = {"free": "ar_test_free", "pro": "ar_test_pro", "enterprise": "ar_test_ent"}


class FakeUpstream:
    """`receiver simulate --serve-api` with one key per plan (KEYS) and a fixed seed."""

    def __init__(
        self,
        tmp: Path,
        *,
        sessions: int = 3,
        population: int = 30,
        seed: int = 7,
        tick: float = 0.2,
        speed: float = 600.0,
        threshold: float = 40.0,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = tmp / f"fake-upstream-{self.port}.log"
        self.args = [
            sys.executable, "-m", "receiver", "simulate", "--serve-api",
            "--listen", f"127.0.0.1:{self.port}",
            "--api-key", " ".join(f"{key}:{plan}" for plan, key in KEYS.items()),
            "--sessions", str(sessions), "--population", str(population),
            "--seed", str(seed), "--tick", str(tick), "--speed", str(speed),
            "--threshold", str(threshold),
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> FakeUpstream:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log)
        harness._running.add(self.proc)
        deadline = time.monotonic() + harness.STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"fake upstream exited:\n{self.log.read_text()}")
            try:
                harness.http_client.get(f"http://127.0.0.1:{self.port}/_fake/stats", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"fake upstream did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None:
            code = harness.stop_process(self.proc)
            self.proc = None
            assert code == 0, f"fake upstream exited {code}:\n{self.log.read_text()}"

    def get(self, path: str, plan: str = "enterprise", **params: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {KEYS[plan]}"}
        return harness.http_client.get(
            f"{self.url}{path}", headers=headers, params=params, timeout=10
        )

    def stats(self) -> dict[str, Any]:
        body: dict[str, Any] = harness.http_client.get(
            f"http://127.0.0.1:{self.port}/_fake/stats", timeout=10
        ).json()
        return body

    def env(self, plan: str = "enterprise") -> dict[str, str]:
        """The receiver's settings to talk to this fake with the plan's key."""
        return {
            "RECEIVER_UPSTREAM_URL": self.url,
            "RECEIVER_UPSTREAM_KEY": KEYS[plan],
            "RECEIVER_UPSTREAM_PLAN": plan,
        }
