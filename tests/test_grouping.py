"""`make test` runs `--dist loadgroup`: a file whose tests share a module-scoped fixture (a
server, a Chromium) is one group that runs in one worker (tests/conftest.py marks it). xdist
groups by tagging node ids in each worker; pytest 9.2 ignores the tag (pytest-xdist#1386),
and every group was spread over the workers without a word, each starting its module's
fixtures once per worker. This runs the installed pytest and xdist on two groups."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = """
import os

import pytest

pytestmark = pytest.mark.xdist_group("{group}")


@pytest.mark.parametrize("n", range(6))
def test_one(n):
    with open(os.environ["SEEN"], "a") as seen:
        seen.write("{group} " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_each_group_runs_in_one_worker(tmp_path: Path) -> None:
    for group in ("a", "b"):
        (tmp_path / f"test_{group}.py").write_text(TESTS.format(group=group))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    seen = tmp_path / "seen.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q"]
        + ["-p", "no:randomly", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={"SEEN": str(seen), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = {}
    for line in seen.read_text().splitlines():
        group, worker = line.split()
        workers.setdefault(group, set()).add(worker)
    assert workers.keys() == {"a", "b"}
    assert all(len(ran_in) == 1 for ran_in in workers.values()), workers
