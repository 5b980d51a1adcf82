"""`.ci/subjects.py` (run by `make lint`): commit subjects since its base are at most 72
characters, checked in a real throwaway git repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SUBJECTS = Path(__file__).resolve().parent.parent / ".ci" / "subjects.py"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "commit", "--allow-empty", "-q", "-m", message)
    return git(repo, "rev-parse", "--short", "HEAD")


def check(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SUBJECTS), *args], cwd=repo, capture_output=True, text=True
    )


def test_a_subject_over_72_after_the_base_fails_naming_the_commit(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    base = commit(tmp_path, "x" * 200)  # before the rule: left as it is
    commit(tmp_path, "a" * 72)
    long = commit(tmp_path, "b" * 73)
    commit(tmp_path, "short\n\n" + "a body line may be as long as it needs " * 5)
    done = check(tmp_path, "--base", base)
    assert done.returncode == 1
    said = f"{long}: subject is 73 characters (at most 72): {'b' * 73}"
    assert done.stderr.splitlines() == [said]
    assert done.stdout.strip() == f"subjects: 3 commits since {base}, 1 over 72"


def test_subjects_within_the_limit_pass(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    base = commit(tmp_path, "x" * 200)
    commit(tmp_path, "store: one migration runner for both SQL backends")
    done = check(tmp_path, "--base", base)
    assert (done.returncode, done.stderr) == (0, "")


def test_a_clone_without_the_base_checks_every_commit_it_holds(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    long = commit(tmp_path, "y" * 80)
    done = check(tmp_path, "--base", "0" * 40)
    assert done.returncode == 1 and done.stderr.startswith(f"{long}: subject is 80 characters")


def test_this_repository_keeps_to_it() -> None:
    done = check(SUBJECTS.parent.parent)
    assert done.returncode == 0, done.stderr
