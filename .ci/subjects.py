"""Commit subjects stay short: every commit since BASE has a first line of at most 72
characters and, when it has a body, a blank line before it.

    python3 .ci/subjects.py [BASE]

BASE (default fdc90ad) is the commit before the rule was checked; older history is left as
it is, not rewritten. Exits 1 naming each commit that breaks it, and when BASE is not in
the clone (a shallow clone: fetch the history first).
"""

from __future__ import annotations

import subprocess
import sys

BASE = "fdc90ad"
LIMIT = 72


def problems(base: str) -> list[str]:
    found = subprocess.run(
        ["git", "log", "--format=%h%x00%B%x01", f"{base}..HEAD"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = []
    for entry in filter(str.strip, found.stdout.split("\x01")):
        short, message = entry.strip("\n").split("\x00", 1)
        lines = message.splitlines()
        subject = lines[0] if lines else ""
        if len(subject) > LIMIT:
            out.append(f"{short}: subject is {len(subject)} characters (at most {LIMIT}): {subject}")
        if len(lines) > 1 and lines[1].strip():
            out.append(f"{short}: no blank line between the subject and the body: {subject}")
    return out


def main(argv: list[str]) -> int:
    base = argv[0] if argv else BASE
    known = subprocess.run(["git", "cat-file", "-e", f"{base}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        print(f"subjects: base commit {base} is not in this clone (git fetch --unshallow)")
        return 1
    found = problems(base)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
