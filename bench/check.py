"""`make bench-check`: a quick throughput run against the last committed figures.

    .venv/bin/python bench/check.py [--tolerance 0.15]

Runs bench/run.py's throughput part briefly (one round, 8 s, the ceiling and the
receiver only; its RESULTS.md goes to a scratch file) and compares the receiver's
stored+routed/s as a share of the ceiling measured in the same run with the share in
bench/figures.json as last committed (`git show HEAD:bench/figures.json`). Exits 1
when it dropped by more than the tolerance (15%): a ratio, so a slower or busier
machine moves both sides alike. Not part of `make test`: one machine's noise is
enough to trip a timed check now and then, and a regression guard that cries wolf is
switched off.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def committed() -> dict[str, Any]:
    """bench/figures.json as of the last commit (the working copy's if never committed)."""
    shown = subprocess.run(
        ["git", "show", "HEAD:bench/figures.json"], cwd=ROOT, capture_output=True, text=True
    )
    if shown.returncode == 0:
        return dict(json.loads(shown.stdout))
    return dict(json.loads((BENCH / "figures.json").read_text()))


def quick(work: Path) -> dict[str, Any]:
    figures = work / "figures.json"
    subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--parts", "throughput", "--rounds", "1",
         "--duration", "8", "--events", "150000", "--targets", "ceiling,receiver",
         "--paced", "0", "--output", str(work / "RESULTS.md"), "--figures", str(figures)],
        cwd=ROOT, check=True,
    )  # fmt: skip
    return dict(json.loads(figures.read_text()))


def verdict(base: dict[str, Any], now: dict[str, Any], tolerance: float) -> tuple[bool, str]:
    """Whether now's ratio to the ceiling is within tolerance of base's, and a line saying so."""
    if not base.get("ratio") or not now.get("ratio"):
        return False, "no ratio to compare: a run had no receiver and ceiling round"
    change = now["ratio"] / base["ratio"] - 1
    line = (
        f"stored+routed / ceiling: {now['ratio']:.3f} now vs {base['ratio']:.3f} committed"
        f" ({base['written']}): {change:+.1%} (allowed: -{tolerance:.0%})"
    )
    return change >= -tolerance, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args()
    base = committed()
    with tempfile.TemporaryDirectory(prefix="receiver-bench-check-") as tmp:
        now = quick(Path(tmp))
    ok, line = verdict(base, now, args.tolerance)
    for r in now["rounds"]:
        print(
            f"quick run: ceiling {r['ceiling_rps']:,}/s, receiver accepted {r['accepted_rps']:,}/s,"
            f" stored+routed {r['sustained_rps']:,}/s, p99 {r['p99_ms']} ms ({r['load']})"
        )
    print(("OK: " if ok else "REGRESSION: ") + line)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
