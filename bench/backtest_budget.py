"""What a week's backtest costs an event, in instructions, and what a minute would allow.

    python -m bench.backtest_budget [--seconds 7200]   (bench/backtest.py calls budget())

The backtest part times `receiver backtest` over the bench's week; this says where those
seconds go in a figure the machine's load does not move. Each command runs under
`valgrind --tool=cachegrind --cache-sim=no` twice, over the first `seconds` of the week and
over twice that: the difference over the events between the two is what an event costs,
the start (imports, rules, the report) left out. Three commands, in one process each
(--jobs 1): bench/no-rules.yaml against itself (the floor: reading, decoding and moving
each event's alert, with the replay's own bookkeeping), bench/rules.yaml against no rules,
bench/backtest-rules.yaml against no rules; a rules file's own cost is its command's less
the floor.

The minute's budget: this machine's instructions a second in the replay (the one-process
command's instructions, both files, over its CPU time on the whole week, which the backtest
part measures) times two cores times 60 s, over the week's events. As shipped, each file
runs in a process of its own, so the floor is paid twice.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import week

BENCH = Path(__file__).resolve().parent
VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
REFS = re.compile(r"I\s+refs:\s+([\d,]+)")
RATE = 10.0  # the week's events a second (bench/backtest.py)
NO_RULES = BENCH / "no-rules.yaml"
FILES = {
    "floor": NO_RULES,
    "current": BENCH / "rules.yaml",
    "candidate": BENCH / "backtest-rules.yaml",
}


def instructions(db: Path, candidate: Path, start: float, seconds: float) -> int:
    """valgrind's instruction count of `receiver backtest candidate --against no-rules` over
    [start, start + seconds) of the store, in one process."""
    command = [
        *VALGRIND, sys.executable, "-m", "receiver", "backtest", str(candidate),
        "--against", str(NO_RULES), "--from", str(start), "--to", str(start + seconds),
        "--db", str(db), "--json", "--jobs", "1",
    ]  # fmt: skip
    env = {**os.environ, "BENCH_SINK_PORT": "9", "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    found = REFS.findall(done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"receiver backtest under valgrind failed:\n{done.stderr[-3000:]}")
    return int(found[-1].replace(",", ""))


def per_event(db: Path, start: float, seconds: float) -> dict[str, float]:
    """Instructions an event of each command (the slope between seconds and twice that);
    two runs at a time (two cores)."""
    runs = [(name, span) for name in FILES for span in (seconds, 2 * seconds)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(lambda run: instructions(db, FILES[run[0]], start, run[1]), runs))
    found = dict(zip(runs, counts, strict=True))
    events = seconds * RATE
    return {name: (found[(name, 2 * seconds)] - found[(name, seconds)]) / events for name in FILES}


def cached(db: Path, start: float, seconds: float) -> dict[str, float]:
    """per_event(), kept in bench/.cache by the code it measured: counts do not move with the
    machine's load, only with receiver/ and the bench's rules files, so a run of committed
    code that was counted before reuses the count (8 minutes of valgrind on two cores)."""
    paths = ["receiver", *(str(p.relative_to(BENCH.parent)) for p in FILES.values())]
    root = BENCH.parent

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)

    tree = git("rev-parse", "HEAD:receiver")
    dirty = git("status", "--porcelain", "--", *paths).stdout.strip()
    if tree.returncode != 0 or dirty:  # not a checkout, or uncommitted changes: count again
        return {**per_event(db, start, seconds), "seconds": seconds}
    rules = git("rev-parse", *(f"HEAD:{p}" for p in paths[1:])).stdout.split()
    key = "-".join([tree.stdout.strip()[:12], *(r[:8] for r in rules), f"{seconds:g}"])
    path = BENCH / ".cache" / f"backtest-budget-{key}.json"
    if path.exists():
        return dict(json.loads(path.read_text()))
    cost = {**per_event(db, start, seconds), "seconds": seconds}
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(cost))
    return cost


def report(cost: dict[str, float], count: int, one_cpu: float, target: float) -> list[str]:
    """The lines for bench/RESULTS.md. one_cpu: the CPU seconds of the week's backtest in one
    process (--jobs 1: both files, the floor paid once)."""
    floor, current, candidate = cost["floor"], cost["current"], cost["candidate"]
    own_current, own_candidate = current - floor, candidate - floor
    one = floor + own_current + own_candidate
    per_second = one * count / one_cpu
    budget = per_second * 2 * target / count
    shipped = 2 * floor + own_current + own_candidate
    slower = floor + max(own_current, own_candidate)
    k = 1000
    return [
        f"Where the week's time goes, in instructions an event (valgrind, `python"
        f" bench/backtest_budget.py`; each the slope between the first {cost['seconds']:g} s"
        f" of the week and twice that, so the start is left out):",
        "",
        "| part | thousand instructions an event |",
        "|---|---:|",
        f"| the floor: reading, decoding, moving the alert, the replay's bookkeeping"
        f" | {floor / k:.1f} |",
        f"| bench/rules.yaml's rules (the current file) | {own_current / k:.1f} |",
        f"| bench/backtest-rules.yaml's rules (the candidate) | {own_candidate / k:.1f} |",
        f"| as shipped, two processes: each pays the floor | {shipped / k:.1f} |",
        f"| the slower process alone | {slower / k:.1f} |",
        "",
        f"This machine ran the replay at {per_second / 1e9:.2f} billion instructions a second"
        f" (one process's {one / k:.1f} thousand an event over its {one_cpu:.0f} s of CPU on"
        f" the week). A week in {target:.0f} s on two cores allows {budget / k:.1f} thousand"
        f" instructions an event for everything: the shipped design takes"
        f" {shipped / budget:.1f} times that, one process {one / budget:.1f} times; the floor"
        f" alone is {floor / budget:.2f} of it.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=7200.0)
    parser.add_argument("--one-cpu", type=float, help="CPU s of the week in one process")
    args = parser.parse_args()
    count = int(RATE * 7 * 86400)
    db = week.store(count, RATE)
    cost = cached(db, week.START, args.seconds)
    for name in FILES:
        print(f"{name}: {cost[name]:,.0f} instructions an event")
    if args.one_cpu:
        print("\n".join(report(cost, count, args.one_cpu, week.TARGET)))


if __name__ == "__main__":
    main()
