"""`make bench`'s scaling part (issue 33, item 2's fallback): `receiver serve --workers 1`
and `--workers 2` on one SQLite file, on the worst stream shape (shared-type,
bench/streams.py), a few rounds, each against the ceiling of the same round; its section
of bench/RESULTS.md.

    .venv/bin/python -m bench.run --parts scaling
    .venv/bin/python -m bench.run --parts scaling --rounds 1 --duration 5 --events 60000 \\
        --output /tmp/scaling.md          # a smoke run: never RESULTS.md

Each round: the ceiling (bench/ceiling.py on the current stream, core 0), the receiver with
one worker and with two (the order swapped each round, so neither always runs first), the
ceiling again. One worker runs on core 0, as every other part's receiver; two workers get
cores 0 and 1 (the only second core there is, which wrk shares). bench/run.py hands in its
server and measurement functions (make_server, measure), as it does to bench/stream_part.py.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import stream_part, streams

SHAPE = "shared-type"
WORKERS = (1, 2)
CORES = {1: {0}, 2: {0, 1}}  # the receiver's cores for each count of workers
READY_WITHIN = 60.0  # seconds for every worker to serve, after the first answers
# A worker's counters' creation time, in its /metrics: no two processes share it.
_CREATED = re.compile(r'^receiver_events_created\{result="accepted"\} (\S+)$', re.M)


def run_part(
    args: argparse.Namespace,
    work: Path,
    sink_port: int,
    pin: bool,
    *,
    current: tuple[Path, Path],
    secret: str,
    make_server: Callable[..., Any],
    measure: Callable[..., Any],
) -> list[str]:
    """args.rounds rounds of the ceiling, one worker and two, the ceiling; the section."""
    ran = stream_part.code()
    shape = streams.SHAPES[streams.NAMES.index(SHAPE)]
    stream, warmup = work / "scaling.tsv", work / "scaling-warmup.tsv"
    streams.write(stream, shape.deliveries(args.events, 1, "scaling"), secret)
    warm = shape.deliveries(stream_part.WARMUP_EVENTS, 2, "scalingwarm")
    streams.write(warmup, warm, secret)
    rows: list[dict[str, Any]] = []
    for round_no in range(1, args.rounds + 1):
        order = WORKERS if round_no % 2 else WORKERS[::-1]
        ceilings = [_ceiling(args, work, sink_port, pin, round_no, current, make_server, measure)]
        runs = []
        for count in order:
            server = make_server(
                "receiver",
                work,
                sink_port,
                env_extra={
                    "RECEIVER_RULES": str(shape.rules),
                    "RECEIVER_WORKERS": str(count),
                    "RECEIVER_ADMIN": "off",  # --workers needs it off: off for both
                },
            )
            _all_workers_first(server, count, pin)
            print(f"scaling {round_no}: {count} worker(s) ...", file=sys.stderr, flush=True)
            r = measure(server, round_no, args, stream, warmup, pin)
            print(f"  {stream_part.describe(r)}", file=sys.stderr, flush=True)
            runs.append((count, r))
        ceilings.append(
            _ceiling(args, work, sink_port, pin, round_no, current, make_server, measure)
        )
        rows += [row(count, round_no, _figures(r), ceilings) for count, r in runs]
    return section(args, rows, summarize(rows), ran)


def _ceiling(
    args: argparse.Namespace,
    work: Path,
    sink_port: int,
    pin: bool,
    round_no: int,
    current: tuple[Path, Path],
    make_server: Callable[..., Any],
    measure: Callable[..., Any],
) -> float:
    print(f"scaling {round_no}: ceiling ...", file=sys.stderr, flush=True)
    r = measure(make_server("ceiling", work, sink_port), round_no, args, *current, pin)
    print(f"  {r.rps:,.0f}/s", file=sys.stderr, flush=True)
    return float(r.rps)


def _all_workers_first(server: Any, count: int, pin: bool) -> None:
    """Make server.start() return only once all count workers serve (the first answering
    is not enough: the warm-up would go to it alone), on CORES[count] when pinned."""
    started = server.start

    def start(pin: bool) -> None:
        started(pin)
        if pin:
            for pid in (server.proc.pid, *_children(server.proc.pid)):
                os.sched_setaffinity(pid, CORES[count])
        deadline = time.monotonic() + READY_WITHIN
        seen: set[str] = set()
        while len(seen) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"{count} workers did not all serve within {READY_WITHIN:g}s")
            url = f"http://127.0.0.1:{server.port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as answer:  # a new connection each
                found = _CREATED.search(answer.read().decode())
            if found is not None:
                seen.add(found.group(1))

    server.start = start


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _figures(r: Any) -> dict[str, Any]:
    """What a run of bench/run.py's measure() gives that this part reports."""
    return {
        "sustained_rps": r.routing.sustained if r.routing is not None else None,
        "accepted_rps": r.rps,
        "p99_ms": r.p99_ms,
        "cpu_us": r.cpu_us,
        "errors": ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-",
        "load": r.load,
    }


# -- the figures (pure) ---------------------------------------------------------------------


def row(workers: int, round_no: int, run: dict[str, Any], ceilings: list[float]) -> dict[str, Any]:
    """One run: its figures, the round's ceiling (the mean of the runs before and after) and
    stored+routed/s over it (None when the run's events were not all routed)."""
    ceiling = sum(ceilings) / len(ceilings) if ceilings else 0.0
    sustained = run["sustained_rps"]
    return {
        "workers": workers,
        "round": round_no,
        "ceiling_rps": round(ceiling),
        "ceiling_runs": [round(c) for c in ceilings],
        "accepted_rps": round(run["accepted_rps"]),
        "sustained_rps": None if sustained is None else round(sustained),
        "ratio": round(sustained / ceiling, 3) if sustained is not None and ceiling else None,
        "p99_ms": round(run["p99_ms"], 2),
        "cpu_us": None if run["cpu_us"] is None else round(run["cpu_us"]),
        "errors": run["errors"],
        "load": run["load"],
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per count of workers, the means over the rounds (stored+routed/s and the ratio to
    the ceiling None if any run was not all routed) and the worst p99; per round, two
    workers' stored+routed/s over one's, and its mean (the scaling figure)."""
    counts: dict[int, Any] = {}
    for workers in WORKERS:
        mine = [r for r in rows if r["workers"] == workers]
        if not mine:
            continue
        complete = all(r["sustained_rps"] is not None for r in mine)
        cpu = [r["cpu_us"] for r in mine if r["cpu_us"] is not None]
        counts[workers] = {
            "sustained_rps": _mean([r["sustained_rps"] for r in mine]) if complete else None,
            "ratio": _mean([r["ratio"] for r in mine], 3) if complete else None,
            "p99_ms": max(r["p99_ms"] for r in mine),
            "cpu_us": _mean(cpu) if cpu else None,
        }
    by_round: dict[int, dict[int, Any]] = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["workers"]] = r["sustained_rps"]
    scaling = {
        number: round(runs[2] / runs[1], 3)
        for number, runs in sorted(by_round.items())
        if runs.get(1) and runs.get(2) is not None
    }
    mean = _mean(list(scaling.values()), 3) if scaling else None
    return {"workers": counts, "scaling": scaling, "scaling_mean": mean}


def _mean(values: list[float], digits: int = 0) -> Any:
    mean = sum(values) / len(values)
    return round(mean, digits) if digits else round(mean)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def section(
    args: argparse.Namespace, rows: list[dict[str, Any]], summary: dict[str, Any], ran: str = ""
) -> list[str]:
    """The report's "Worker processes: scaling" section."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    loads = [float(r["load"].split()[1]) for r in rows if r["load"]]
    mean = summary["scaling_mean"]
    each = ", ".join(f"{v:.2f}" for v in summary["scaling"].values())
    lines = [
        "## Worker processes: scaling",
        "",
        f'Run on {when} (`make bench BENCH_ARGS="--parts scaling"`), {args.rounds} round(s).'
        f" `receiver serve --workers 1` and `--workers 2` (RECEIVER_ADMIN=off for both) on"
        f" one SQLite file, the {SHAPE} stream (bench/streams.py, the worst shape); each"
        " round: the ceiling (core 0), one worker and two (the order swapped each round), the"
        f" ceiling again; {args.duration}s of wrk -t1 -c{args.connections} flat out a run"
        f" after {args.warmup}s of warm-up (once every worker serves), a fresh file each run."
        " One worker on core 0; two on cores 0 and 1, the second shared with wrk (2 cores):"
        " the ratio to the ceiling compares two cores with the ceiling's one. stored+routed/s,"
        " p99 and CPU as in the stream shapes part (CPU: the parent's and its workers')."
        + (
            f" The 1-minute load average was {min(loads):.2f} to {max(loads):.2f} as the runs"
            " started."
            if loads
            else ""
        )
        + (f" {ran}" if ran else ""),
        "",
        "| workers | stored+routed/s (mean) | ratio to the ceiling | p99 ms (worst) |"
        " CPU µs an event |",
        "|---:|---:|---:|---:|---:|",
    ]
    for workers, s in summary["workers"].items():
        lines.append(
            f"| {workers} | {_fmt(s['sustained_rps'], ',')} | {_fmt(s['ratio'], '.2f')}x |"
            f" {s['p99_ms']:.2f} | {_fmt(s['cpu_us'], ',')} |"
        )
    lines += [
        "",
        f"Two workers over one: **{_fmt(mean, '.2f')}x** stored+routed/s"
        + (f" (each round {each})." if each else "."),
        "",
        "| workers | round | ceiling/s (before, after) | accepted/s | stored+routed/s | ratio |"
        " p99 ms | CPU µs an event | errors | load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        before_after = ", ".join(f"{c:,}" for c in r["ceiling_runs"])
        lines.append(
            f"| {r['workers']} | {r['round']} | {r['ceiling_rps']:,} ({before_after}) |"
            f" {r['accepted_rps']:,} | {_fmt(r['sustained_rps'], ',')} |"
            f" {_fmt(r['ratio'], '.2f')} | {r['p99_ms']:.2f} | {_fmt(r['cpu_us'], ',')} |"
            f" {r['errors']} | {r['load']} |"
        )
    return [*lines, ""]
