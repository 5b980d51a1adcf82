"""`receiver backtest` over a week at 10 events/s: how long the replay takes, on two cores.

    python -m bench.backtest [--rate 10] [--days 7] [--output bench/RESULTS.md]

Builds (once, cached in bench/.cache) a SQLite store of rate x days events (6,048,000 for
a week at 10/s) by direct bulk insert: 2,000 sessions at a time, each with a hundred events
(drops and recoveries, interventions fired and resolved, then session.stopped), so alerts
open and resolve all week. Then runs `receiver backtest` as an operator does, with
bench/backtest-rules.yaml (hold, resolve, repeat, a digest, an active window with defer, a
throttle, a heartbeat) against bench/rules.yaml, and reads the events/s it prints: as
shipped (each rules file replayed in a process of its own, on two cores), then with
--jobs 1 (both in one process, on one core); then the floor, the same week with
bench/no-rules.yaml against itself (no rule to place an event: what reading, decoding and
moving the alerts cost). Writes the "## Backtest" section of bench/RESULTS.md (the rest is
kept).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import backtest_budget, extra, week
from bench.week import START, TARGET

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

SECTION = "## Backtest"


def measure(rate: float = 10.0, days: float = 7.0) -> list[str]:
    count = int(rate * days * extra.DAY)
    db = week.store(count, rate)
    end = START + days * extra.DAY
    files = (BENCH / "backtest-rules.yaml", BENCH / "rules.yaml")
    report, wall, peak, cpu = backtest(db, *files, end)
    took = float(report["seconds"])
    # The same on one core, both files in one process: what the second process buys.
    one, one_wall, one_peak, one_cpu = backtest(db, *files, end, jobs=1)
    # The floor: the same replay with no rule in either file. What is left is reading and
    # decoding the events, moving each one's alert, and the replay's own bookkeeping.
    floor, floor_wall, _, floor_cpu = backtest(
        db, BENCH / "no-rules.yaml", BENCH / "no-rules.yaml", end
    )
    bare = float(floor["seconds"])
    budget = _budget(db, count, one_cpu)
    same = {**one, "seconds": 0} == {**report, "seconds": 0}
    cand, cur = report["candidate"], report["current"]
    verdict = "met" if wall <= TARGET else "missed"
    return [
        SECTION,
        "",
        f"`receiver backtest` of a week at {rate:g} events/s ({count:,} events, stored in"
        f" SQLite) with bench/backtest-rules.yaml against bench/rules.yaml ({extra.uptime()}):",
        "",
        f"- as shipped, each file replayed in a process of its own on two cores: replay"
        f" {took:.1f} s, {count / took:,.0f} events/s; the whole command (start, rules,"
        f" report): {wall:.1f} s, CPU {cpu} (both processes). Target: a week in under"
        f" {TARGET:.0f} s: **{verdict}**.",
        f"- both files in one process (`--jobs 1`), one core: replay"
        f" {float(one['seconds']):.1f} s, the whole command {one_wall:.1f} s, CPU {one_cpu};"
        f" {'the same report' if same else '**a different report** (a bug)'}.",
        f"- the floor, bench/no-rules.yaml against itself (the events read, decoded and each"
        f" moved through its alert; no rule to place them): replay {bare:.1f} s, the whole"
        f" command {floor_wall:.1f} s, CPU {floor_cpu} (both processes). The new rules' own work"
        " is the rest of the first figure.",
        f"- candidate: {cand['sent']:,} notifications sent, {cand['alerts_opened']:,} alerts"
        f" opened; current: {cur['sent']:,} sent; alerts missed {report['missed_count']:,},"
        f" added {report['added_count']:,}.",
        f"- peak memory (VmHWM of the larger process): two processes {peak}, one {one_peak}.",
        "",
        *budget,
    ]


def _budget(db: Path, count: int, one_cpu: str) -> list[str]:
    """Where the week's time goes in instructions an event (bench/backtest_budget.py), and
    what a minute allows; a line saying why not where valgrind or GNU time is missing."""
    seconds = re.match(r"[\d.]+", one_cpu)
    if not _has("valgrind") or seconds is None:
        return ["Instructions an event: not measured (needs valgrind and GNU time).", ""]
    cost = backtest_budget.cached(db, START, 7200.0)
    return [*backtest_budget.report(cost, count, float(seconds.group()), TARGET), ""]


def backtest(
    db: Path, candidate: Path, against: Path, end: float, *, jobs: int | None = None
) -> tuple[Any, float, str, str]:
    """`receiver backtest candidate --against against` over the week, as an operator runs it
    (on the cores it may use; jobs=1: one process, pinned to one core): its JSON report, the
    whole command's seconds, its peak memory, the CPU seconds of all its processes."""
    command = [
        sys.executable, "-m", "receiver", "backtest", str(candidate),
        "--against", str(against), "--from", str(START), "--to", str(end),
        "--db", str(db), "--json",
    ]  # fmt: skip
    pin: list[str] = []
    if jobs is not None:
        command += ["--jobs", str(jobs)]
    if _has("taskset"):
        # On the machine's every core, not on the ones this process may use: bench/run.py
        # keeps itself (and so what it starts) off core 0, and a command that inherited one
        # core would replay both files in one process and be reported as shipped.
        every = f"0-{(os.cpu_count() or 1) - 1}"
        pin = ["taskset", "-c", "0" if jobs == 1 else every]
    if Path("/usr/bin/time").exists():  # GNU time: the largest process's peak resident size
        pin = ["/usr/bin/time", "-f", "peak memory: %M KiB, cpu: %U user %S sys", *pin]
    env = {**os.environ, "BENCH_SINK_PORT": "9"}
    started = time.monotonic()
    done = subprocess.run(pin + command, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"receiver backtest failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), wall, _peak(done.stderr), _cpu(done.stderr)


def _peak(stderr: str) -> str:
    found = re.search(r"peak memory: (\d+) KiB", stderr)
    return f"{int(found.group(1)) // 1024:,} MiB" if found else "not measured (no GNU time)"


def _cpu(stderr: str) -> str:
    found = re.search(r"cpu: ([\d.]+) user ([\d.]+) sys", stderr)
    if not found:
        return "not measured (no GNU time)"
    return f"{float(found.group(1)) + float(found.group(2)):.1f} s"


def _has(name: str) -> bool:
    return subprocess.run(["which", name], capture_output=True).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--output", type=Path, default=BENCH / "RESULTS.md")
    args = parser.parse_args()
    lines = measure(args.rate, args.days)
    print("\n".join(lines))
    extra_write(lines, args.output)


def extra_write(lines: list[str], output: Path) -> None:
    """Replace this section of the results file (or append it), keeping the rest."""
    text = output.read_text() if output.exists() else ""
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    block = "\n".join(lines) + "\n"
    text = pattern.sub(block, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + block
    output.write_text(text)


if __name__ == "__main__":
    main()
