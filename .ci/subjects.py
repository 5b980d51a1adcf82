"""`make lint`'s history check: every commit subject since BASE is at most 72 characters.

    python .ci/subjects.py [--base COMMIT] [--max 72]

`git log --oneline` is the changelog: a subject says what changed in at most 72
characters (Starlette's median is 47, Alertmanager's 60), then a blank line, then the why
and the figures in the body. Commits before BASE (when this rule began) are left as they
are. In a clone without BASE (a shallow one), every commit it holds is checked. Exits 1
naming each commit whose subject is too long, with its length.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

BASE = "fdc90ad"  # the last commit before the rule held
MAX = 72


def subjects(base: str, cwd: str | None = None) -> list[tuple[str, str]]:
    """(short hash, subject) of every commit after base on HEAD, or of every commit held when
    base is not in this clone."""
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{base}^{{commit}}"], cwd=cwd, capture_output=True
    )
    span = [f"{base}..HEAD"] if known.returncode == 0 else ["HEAD"]
    out = subprocess.run(
        ["git", "log", "--format=%h%x00%s", *span],
        cwd=cwd, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [tuple(line.split("\0", 1)) for line in out.splitlines() if line]  # type: ignore[misc]


def too_long(found: list[tuple[str, str]], limit: int = MAX) -> list[str]:
    """A line for each subject over limit characters."""
    return [
        f"{commit}: subject is {len(subject)} characters (at most {limit}): {subject[:80]}"
        for commit, subject in found
        if len(subject) > limit
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE)
    parser.add_argument("--max", type=int, default=MAX)
    args = parser.parse_args(argv)
    found = subjects(args.base)
    problems = too_long(found, args.max)
    for line in problems:
        print(line, file=sys.stderr)
    print(f"subjects: {len(found)} commits since {args.base}, {len(problems)} over {args.max}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
