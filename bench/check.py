"""`make bench-check`: a quick run of every stream shape against the last committed figures.

    .venv/bin/python -m bench.check [--tolerance 0.15]

Runs bench/run.py's streams part briefly (one round, 8 s a run: the ceiling, the receiver
on each shape of bench/streams.py, the ceiling again; its RESULTS.md goes to a scratch
file) and compares the worst shape's stored+routed/s as a share of the ceiling measured in
the same round with the worst shape's share in bench/figures.json as last committed
(`git show HEAD:bench/figures.json`, its "streams" entry). Exits 1 when it dropped by more
than the tolerance (15%): a ratio, so a slower or busier machine moves both sides alike.
The worst shape of the quick run need not be the committed one: the guard is on the
floor, whichever stream sets it; each shape's change is printed beside. Not part of
`make test`: one machine's noise is enough to trip a timed check now and then, and a
regression guard that cries wolf is switched off.
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
        [sys.executable, "-m", "bench.run", "--parts", "streams", "--rounds", "1",
         "--duration", "8", "--events", "150000", "--paced", "0",
         "--output", str(work / "RESULTS.md"), "--figures", str(figures)],
        cwd=ROOT, check=True,
    )  # fmt: skip
    return dict(json.loads(figures.read_text()))


def floor(figures: dict[str, Any]) -> tuple[str, float | None]:
    """The worst shape and its ratio to the ceiling; figures written before the streams
    part existed have only the throughput part's ratio (the current stream)."""
    streams = figures.get("streams")
    if streams is None:
        return "current (throughput part)", figures.get("ratio")
    worst = streams.get("worst") or {}
    return str(worst.get("shape")), worst.get("ratio")


def verdict(base: dict[str, Any], now: dict[str, Any], tolerance: float) -> tuple[bool, str]:
    """Whether now's worst ratio to the ceiling is within tolerance of base's, and a line
    saying so."""
    (base_shape, base_ratio), (now_shape, now_ratio) = floor(base), floor(now)
    if not base_ratio or not now_ratio:
        return False, "no ratio to compare: a shape was not all routed, or no ceiling ran"
    change = now_ratio / base_ratio - 1
    written = (base.get("streams") or base).get("written", "?")
    line = (
        f"worst stored+routed / ceiling: {now_ratio:.3f} now ({now_shape}) vs {base_ratio:.3f}"
        f" committed ({base_shape}, {written}): {change:+.1%} (allowed: -{tolerance:.0%})"
    )
    return change >= -tolerance, line


def shapes(base: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """A line a shape of the quick run: its ratio now against the committed one."""
    committed_shapes = (base.get("streams") or {}).get("shapes", {})
    lines = []
    for r in now.get("streams", {}).get("runs", []):
        was = (committed_shapes.get(r["shape"]) or {}).get("ratio")
        change = f" ({r['ratio'] / was - 1:+.1%})" if was and r["ratio"] else ""
        lines.append(
            f"quick run: {r['shape']}: ceiling {r['ceiling_rps']:,}/s, accepted "
            f"{r['accepted_rps']:,}/s, stored+routed {r['sustained_rps'] or 0:,}/s, ratio "
            f"{r['ratio'] or 0:.3f} vs {was or 0:.3f} committed{change}, p99 {r['p99_ms']} ms"
            f" ({r['load']})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args()
    base = committed()
    with tempfile.TemporaryDirectory(prefix="receiver-bench-check-") as tmp:
        now = quick(Path(tmp))
    ok, line = verdict(base, now, args.tolerance)
    print("\n".join(shapes(base, now)))
    print(("OK: " if ok else "REGRESSION: ") + line)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
