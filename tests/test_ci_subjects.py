""".ci/subjects.py: commits after the base keep a subject of at most 72 characters and a
blank line before the body; the base and older commits are not checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "subjects.py"


def _git(repo: Path, *args: str) -> str:
    who = {"NAME": "t", "EMAIL": "t@example.com"}
    env = {f"GIT_{role}_{k}": v for role in ("AUTHOR", "COMMITTER") for k, v in who.items()}
    env["HOME"] = str(repo)  # no user's git config
    env["PATH"] = os.environ["PATH"]
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _check(repo: Path, base: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), base], cwd=repo, capture_output=True, text=True
    )


def test_a_long_subject_after_the_base_fails_and_one_before_it_does_not(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    _commit(tmp_path, "x" * 90)  # older history stays as it is
    base = _commit(tmp_path, "the base")
    _commit(tmp_path, "y" * 72 + "\n\nwhy, with figures")
    assert _check(tmp_path, base).returncode == 0
    _commit(tmp_path, "z" * 73)
    done = _check(tmp_path, base)
    assert done.returncode == 1
    assert "subject is 73 characters (at most 72)" in done.stdout


def test_a_body_without_a_blank_line_fails(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    base = _commit(tmp_path, "the base")
    _commit(tmp_path, "short\nbody right under it")
    done = _check(tmp_path, base)
    assert done.returncode == 1 and "no blank line" in done.stdout


def test_a_base_not_in_the_clone_fails_and_says_so(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    _commit(tmp_path, "only")
    done = _check(tmp_path, "0" * 40)
    assert done.returncode == 1 and "is not in this clone" in done.stdout
