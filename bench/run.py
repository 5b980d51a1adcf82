"""`make bench`: the receiver's ingest path against a ceiling and adnanh/webhook, side by side.

One invocation, one machine: each server is pinned to core 0 (taskset -c 0),
wrk and this script to core 1, and every target gets the same pre-signed
request stream (bench/events.lua). Targets run in rounds, ceiling -> receiver ->
webhook, twice, so drift on a shared machine shows as a difference between
rounds instead of hiding in one target's figure. Writes bench/RESULTS.md.

For the receiver, "accepted/s" (202s a second while wrk runs) is only half the
story: an event accepted is not yet routed, and the router can fall behind. So
each receiver run also reports the sustained figure, events stored and routed a
second from the first accept to the moment the last stored event is routed, and
the routing lag (routed_at - received_at, read from the SQLite file afterwards).
And each round runs the receiver once more, paced at --paced (default 80%) of the
flat-out rate it just measured, for the lag below saturation.

    .venv/bin/python -m bench.run                 # what `make bench` runs
    .venv/bin/python -m bench.run --duration 5 --rounds 1 --events 20000   # a quick look
    .venv/bin/python -m bench.run --parts postgres   # one part (bench/pg.py); RESULTS.md
                                                     # keeps the sections of the others
    .venv/bin/python -m bench.run --parts streams    # every stream shape (bench/streams.py)
                                                     # against the ceiling of its round
    .venv/bin/python -m bench.run --parts scaling    # serve --workers 1 and 2, shared-type

The stream: --events distinct signed events (default 400000) from the same
random walk `receiver simulate` uses. The receiver gets a fresh database each
run and the warm-up replays a separate file, so as long as a run sends fewer
requests than --events the receiver sees no duplicate; the measured share of
duplicates is reported either way (requests answered minus rows stored).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    admin,
    api,
    backtest,
    fanout,
    instructions,
    pg,
    receiver_parts,
    scaling_part,
    statements,
    stream_part,
    tracing_part,
)
from bench.load import Result, measure, write_stream, wrk
from bench.receiver_parts import line
from bench.report import lag_table, merge, report, table, write_figures
from bench.servers import BENCH, LOAD_CPU, SECRET, TARGETS, Sink, make_server
from receiver import rules

# the measured stream, the warm-up stream, the measured stream's events
Stream = tuple[Path, Path, list[dict[str, Any]]]

PARTS = (
    "throughput",
    "e2e",
    "growth",
    "prune",
    "memory",
    "workers",
    "postgres",
    "admin",
    "fanout",
    "api",
    "backtest",
    "statements",
    "recording",
    "streams",
    "tracing",
    "scaling",
    "instructions",
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=15, help="seconds per measured run")
    parser.add_argument("--warmup", type=int, default=3, help="seconds of warm-up per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--events", type=int, default=400_000, help="distinct signed events in the measured stream"
    )
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--output", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument(
        "--figures",
        type=Path,
        default=BENCH / "figures.json",
        help="where the throughput part writes its figures for `make bench-check`",
    )
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}"
    )
    parser.add_argument(
        "--paced",
        type=float,
        default=0.8,
        help="share of the receiver's burst rate for the paced run each round (0: none)",
    )
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=0,
        help="events/s for the paced run instead (to compare builds at one offered rate)",
    )
    parser.add_argument("--e2e-rate", type=float, default=1000, help="events/s for e2e")
    parser.add_argument("--e2e-seconds", type=int, default=10)
    parser.add_argument(
        "--growth-events", type=int, default=10_000_000, help="events in the cached big store"
    )
    parser.add_argument(
        "--prune-events", type=int, default=300_000, help="old events for the pruning run"
    )
    parser.add_argument(
        "--soak", type=int, default=120, help="seconds of sustained load for memory (600: issue)"
    )
    args = parser.parse_args()
    args.parts = [p for p in args.parts.split(",") if p]
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    return args


def setup(args: argparse.Namespace, notes: list[str]) -> tuple[list[str], bool]:
    """The targets there are, and whether this script can keep off the servers' core."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk webhook")
    targets = [t for t in args.targets.split(",") if t]
    if "webhook" in targets and shutil.which("webhook") is None:
        targets.remove("webhook")
        notes.append("webhook skipped: not installed (apt-get install -y webhook)")
        print("note: webhook is not installed; skipping it", file=sys.stderr)
    pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    if pin:
        os.sched_setaffinity(0, {int(LOAD_CPU)})  # this script and its sink stay off core 0
    else:
        notes.append("NOT PINNED: taskset missing or fewer than 2 cores")
    return targets, pin


def write_streams(args: argparse.Namespace, work: Path, notes: list[str]) -> Stream:
    started = time.monotonic()
    stream, warmup = work / "stream.tsv", work / "warmup.tsv"
    sent = write_stream(stream, count=args.events, seed=1, run="bench")
    write_stream(warmup, count=20_000, seed=2, run="warmup")
    ruleset = rules.load_file(BENCH / "rules.yaml")
    matching = sum(1 for event in sent if ruleset.route(event))
    notes.append(
        f"stream: {args.events} distinct events (random walk of 200 sessions), "
        f"{matching} ({matching / len(sent):.2%}) match a rule and notify the "
        f"json:// sink; warm-up replays a separate 20000-event file"
    )
    print(
        f"{len(sent)} signed events written in {time.monotonic() - started:.1f}s; "
        f"{matching} match a rule",
        file=sys.stderr,
    )
    return stream, warmup, sent


def throughput(
    args: argparse.Namespace, work: Path, sink: Sink, current: Stream, targets: list[str], pin: bool
) -> tuple[list[Result], list[Result]]:
    """Each round, each target flat out; the receiver once more paced (--paced)."""
    stream, warmup, _ = current
    results: list[Result] = []
    paced: list[Result] = []  # the receiver at --paced of its burst rate, each round
    for round_no in range(1, args.rounds + 1 if "throughput" in args.parts else 1):
        for name in targets:
            server = make_server(name, work, sink.port)
            print(f"round {round_no}: {name} ...", file=sys.stderr, flush=True)
            result = measure(server, round_no, args, stream, warmup, pin)
            print(f"  {line(result)}; {'; '.join(result.notes)}", file=sys.stderr)
            results.append(result)
            if name == "receiver" and (args.paced or args.paced_rate):
                rate = args.paced_rate or args.paced * result.rps
                server = make_server(name, work, sink.port)
                print(
                    f"round {round_no}: receiver paced to {rate:,.0f}/s ...",
                    file=sys.stderr,
                    flush=True,
                )
                result = measure(server, round_no, args, stream, warmup, pin, rate=rate)
                print(f"  {line(result)}; {'; '.join(result.notes)}", file=sys.stderr)
                paced.append(result)
    return results, paced


def other_parts(
    args: argparse.Namespace, work: Path, sink: Sink, current: Stream, pin: bool
) -> list[str]:
    """The sections of the parts asked for beyond the throughput table, in PARTS order."""
    stream, warmup, sent = current
    handed = {"secret": SECRET, "make_server": make_server, "measure": measure}
    parts: dict[str, Callable[[], list[str]]] = {
        "e2e": lambda: receiver_parts.run_e2e(args, work, sink, pin),
        "growth": lambda: receiver_parts.run_growth(args, work, sink, stream, warmup, pin),
        "prune": lambda: receiver_parts.run_prune(args, work, sink, stream, warmup, pin),
        "memory": lambda: receiver_parts.run_memory(args, work, sink, stream, warmup, pin),
        "workers": lambda: receiver_parts.run_workers(args, work, sink, stream, warmup, pin),
        "postgres": lambda: pg.run_postgres(
            args, work, sink.port, stream, warmup, pin, make_server=make_server, wrk=wrk
        ),
        "admin": lambda: admin.measure(1_000_000, 20),
        "fanout": lambda: fanout.measure(1000, 10, 50),
        "statements": lambda: statements.measure(20_000, BENCH / "rules.yaml"),
        "api": lambda: api.run_part(args, work, pin),
        "backtest": lambda: backtest.measure(),
        "recording": lambda: receiver_parts.run_recording(args, work, sink, stream, warmup, pin),
        "streams": lambda: stream_part.run_part(
            args, work, sink.port, pin, current=(stream, warmup, sent), **handed
        ),
        "tracing": lambda: tracing_part.run(
            args, work, sink.port, stream, warmup, pin, make_server, measure
        ),
        "instructions": lambda: instructions.section(),
        "scaling": lambda: scaling_part.run_part(
            args, work, sink.port, pin, current=(stream, warmup), **handed
        ),
    }
    sections: list[str] = []
    for part, fn in parts.items():
        if part in args.parts:
            sections += fn()
    return sections


def main() -> None:
    args = parse_args()
    notes: list[str] = []
    targets, pin = setup(args, notes)
    with tempfile.TemporaryDirectory(prefix="receiver-bench-") as tmp:
        work = Path(tmp)
        sink = Sink()
        os.environ["BENCH_SINK_PORT"] = str(sink.port)
        current = write_streams(args, work, notes)
        try:
            results, paced = throughput(args, work, sink, current, targets, pin)
            sections = other_parts(args, work, sink, current, pin)
        finally:
            sink.stop()
        notes.append(f"json:// sink received {sink.count} notifications over all receiver runs")
    text = "\n".join(sections)
    if "throughput" in args.parts:
        text = report(results, paced, args, notes) + "\n" + text
    if set(args.parts) != set(PARTS) and args.output.exists():
        text = merge(args.output.read_text(), text, head="throughput" in args.parts)
    args.output.write_text(text)
    if results:
        write_figures(args.figures, results, args)
        print("\n".join(table(results)))
    if paced:
        print("\n" + "\n".join(lag_table(results, paced)))
    print(f"\nwritten to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
