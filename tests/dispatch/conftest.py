"""Fixtures of the routing tests on a clock the test drives."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import FakeClock, InProcessReceiver


@pytest.fixture
def start(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[[str], InProcessReceiver]]:
    """start(rules): the app under uvicorn on the module's `clock` fixture, stopped after."""
    running: list[InProcessReceiver] = []

    def _start(rules: str) -> InProcessReceiver:
        server = InProcessReceiver(tmp_path, rules, clock).start()
        running.append(server)
        return server

    yield _start
    for server in running:
        if server.thread.is_alive():
            server.stop()
