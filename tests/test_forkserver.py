"""The fork server the harness starts servers with (tests/forkserver.py): each child is
`receiver ARGS` with the environment and log it was given, and its exit status comes back
as subprocess.Popen's returncode would, told apart from earlier children by start, not by
pid."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from receiver import __version__
from tests.forkserver import ForkServer


@pytest.fixture
def forks() -> Iterator[ForkServer]:
    server = ForkServer()
    try:
        yield server
    finally:
        server.stop()


def test_a_child_runs_the_command_line_with_its_environment_and_log(
    forks: ForkServer, tmp_path: Path
) -> None:
    log = tmp_path / "out.log"
    env = {**os.environ, "RECEIVER_DB": "postgresql://nobody@127.0.0.1:1/x"}
    child = forks.start(["--version"], env, log)
    assert child.wait(30) == 0
    assert f"attention-receiver, version {__version__}" in log.read_text()
    # A setting the child's environment alone carries reaches the command: refused here.
    bad = {**env, "RECEIVER_DB_PREPARE_THRESHOLD": "x"}
    refused = forks.start(["serve", "--port", "0"], bad, log)
    assert refused.wait(30) != 0
    assert "RECEIVER_DB_PREPARE_THRESHOLD" in log.read_text()


@pytest.mark.e2e
def test_exit_statuses_are_as_popen_gives_them_each_by_its_own_start(
    forks: ForkServer, tmp_path: Path
) -> None:
    log = tmp_path / "out.log"
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: all\n    notify: [console]\n")
    env = {
        **os.environ,
        "RECEIVER_DB": str(tmp_path / "r.db"),
        "RECEIVER_RULES": str(rules),
        "RECEIVER_PORT": "0",
    }
    server = forks.start(["serve"], env, log)
    deadline = time.monotonic() + 60
    while not log.exists() or "receiving on http" not in log.read_text():
        assert server.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        server.wait(0.1)
    server.kill()
    assert server.wait(30) == -signal.SIGKILL
    # Another start is its own, whatever pid it gets: the last one's status is not its.
    again = forks.start(["--version"], env, log)
    assert again.poll() in (None, 0) and again.wait(30) == 0
    assert server.returncode == -signal.SIGKILL


def test_it_ends_when_its_test_process_closes_its_input() -> None:
    forks = ForkServer()
    forks.stop()
    assert forks.proc.returncode == 0
    assert not forks.alive()


def test_the_harness_cli_captures_output_and_error_apart_as_subprocess_run_does() -> None:
    from tests.harness import run_cli

    shown = run_cli(["--version"], dict(os.environ))
    assert (shown.returncode, shown.stderr) == (0, "")
    assert f"attention-receiver, version {__version__}" in shown.stdout
    wrong = run_cli(["no-such-command"], dict(os.environ))
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert "No such command 'no-such-command'" in wrong.stderr
