"""The parts of `make bench` on the receiver alone beyond the side-by-side table: end to
end, a big store, pruning, memory under a soak, workers, and what the record costs."""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path

from bench import extra
from bench.load import (
    Result,
    measure,
    wrk,
)
from bench.servers import (
    SECRET,
    Sink,
    make_server,
)


def line(r: Result) -> str:
    errors = ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-"
    line = f"{r.rps:,.0f} events/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, errors {errors}"
    if r.routing is not None:
        line += (
            f"; stored+routed {r.routing.sustained:,.0f}/s, routing lag max "
            f"{r.routing.lag_max:.2f} s, p99 {r.routing.lag_p99:.2f} s"
        )
    return line


def run_e2e(args: argparse.Namespace, work: Path, sink: Sink, pin: bool) -> list[str]:
    server = make_server("receiver", work, sink.port)
    stream = extra.e2e_stream(int(args.e2e_rate * args.e2e_seconds), SECRET)
    load = extra.uptime()
    server.start(pin)
    try:
        sent = extra.steady_post(server.port, stream, args.e2e_rate)
        deadline = time.monotonic() + 15
        wanted = [i for i in sent if i.startswith("evt_e2e_")]
        while time.monotonic() < deadline and not all(i in sink.seen for i in wanted):
            time.sleep(0.1)
    finally:
        server.stop()
    got = extra.e2e_latencies(sent, sink.seen)
    if not got.get("received"):
        return ["## End to end", "", f"no notification reached the sink ({load})", ""]
    return [
        "## End to end: POST -> json:// sink",
        "",
        f"{args.e2e_rate:g} events/s for {args.e2e_seconds}s, one in {extra.NOTIFY_EVERY} "
        f"matching `checkout-drops` ({got['sent']:.0f} notifications); time from sending the "
        f"POST to the sink receiving the notification ({load}):",
        "",
        "| received | p50 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|",
        f"| {got['received']:.0f}/{got['sent']:.0f} | {got['p50_ms']:.1f} | "
        f"{got['p99_ms']:.1f} | {got['max_ms']:.1f} |",
        "",
    ]


def run_growth(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    big = extra.growth_db(args.growth_events)
    assert extra.git_ignored(big), f"{big} must be git-ignored"
    per_event = extra.db_bytes(big) / args.growth_events
    keep = {"RECEIVER_RETENTION": "3650d"}
    lines = [
        "## Growth",
        "",
        f"Ingest with {args.growth_events:,} events already stored (cached "
        f"bench/.cache/{big.name}, built by direct bulk insert) vs an empty store; "
        f"{per_event:,.0f} bytes on disk per stored event (database file, all indexes).",
        "",
        "| store | run | events/s | p50 ms | p99 ms | load |",
        "|---|---|---:|---:|---:|---|",
    ]
    ratios = []
    for round_no in range(1, args.rounds + 1):
        figures = {}
        for label in ("empty", "10M"):
            restore = extra.Restore(big) if label == "10M" else None
            db = big if label == "10M" else None
            server = make_server("receiver", work, sink.port, db=db, env_extra=keep)
            load = extra.uptime()
            print(f"growth {round_no}: {label} store ...", file=sys.stderr, flush=True)
            try:
                r = measure(server, round_no, args, stream, warmup, pin)
            finally:
                if restore is not None:
                    restore()
            print(f"  {line(r)}", file=sys.stderr, flush=True)
            figures[label] = r
            lines.append(
                f"| {label} | {round_no} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} "
                f"| {load} |"
            )
        ratios.append(figures["10M"].rps / figures["empty"].rps)
    lines += ["", "10M / empty: " + ", ".join(f"{x:.2f}" for x in ratios) + " (target >= 0.9)", ""]
    return lines


def run_prune(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    lines = [
        "## Retention pruning under load",
        "",
        f"A store holding {args.prune_events:,} routed events 40-60 days old, with the default "
        "RECEIVER_RETENTION=30d, so the pruner (500 rows a transaction, 50 ms pause) deletes "
        "them while wrk runs; vs a fresh store.",
        "",
        "| store | run | events/s | p50 ms | p99 ms | pruned during the run | load |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    ratios = []
    for round_no in range(1, args.rounds + 1):
        p99 = {}
        for label in ("steady", "pruning"):
            db = None
            if label == "pruning":
                db = work / f"prune-{round_no}.db"
                now = time.time()
                extra.build_db(
                    db, args.prune_events, oldest=now - 60 * 86400, newest=now - 40 * 86400
                )
            server = make_server("receiver", work, sink.port, db=db)
            load = extra.uptime()
            print(f"prune {round_no}: {label} ...", file=sys.stderr, flush=True)
            r = measure(server, round_no, args, stream, warmup, pin)
            print(f"  {line(r)}", file=sys.stderr, flush=True)
            pruned = "-"
            if db is not None:
                with sqlite3.connect(db) as conn:
                    left = conn.execute(
                        "SELECT count(*) FROM events WHERE id LIKE 'evt_old_%'"
                    ).fetchone()[0]
                pruned = f"{args.prune_events - left:,}"
            p99[label] = r.p99_ms
            lines.append(
                f"| {label} | {round_no} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
                f"{pruned} | {load} |"
            )
        ratios.append(p99["pruning"] / p99["steady"])
    lines += [
        "",
        "p99 pruning / steady: " + ", ".join(f"{x:.2f}" for x in ratios) + " (target <= 2)",
        "",
    ]
    return lines


def run_memory(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    server = make_server("receiver", work, sink.port)
    load = extra.uptime()
    print(f"memory: {args.soak}s of load ...", file=sys.stderr, flush=True)
    server.start(pin)
    try:
        assert server.proc is not None
        conns = args.connections
        wrk(server.port, server.path, warmup, seconds=args.warmup, connections=conns, pin=pin)
        start_rss = extra.rss_kib(server.proc.pid)
        sampler = extra.RssSampler(server.proc.pid, every=max(1.0, args.soak / 60))
        got = wrk(server.port, server.path, stream, seconds=args.soak, connections=conns, pin=pin)
        samples = sampler.stop()
    finally:
        server.stop()
    if not samples:
        return []
    rss = [kib for _, kib in samples]
    first, last, peak = rss[0], rss[-1], max(rss)
    rate = got["requests"] / (got["duration_us"] / 1e6)
    note = (
        f"{got['requests']:,} requests; the {args.events:,}-event stream repeats, so later "
        "passes are duplicates"
        if got["requests"] > args.events
        else f"{got['requests']:,} requests"
    )
    return [
        "## Memory under sustained load",
        "",
        f"{args.soak}s of wrk at 32 connections ({rate:,.0f} events/s; {note}; {load}); VmRSS "
        f"sampled every {max(1.0, args.soak / 60):g}s. After warm-up {start_rss / 1024:.1f} MiB.",
        "",
        "| first sample MiB | last MiB | peak MiB | last vs first |",
        "|---:|---:|---:|---:|",
        f"| {first / 1024:.1f} | {last / 1024:.1f} | {peak / 1024:.1f} | "
        f"{(last - first) / first:+.1%} |",
        "",
        f"From the 10% mark ({samples[len(samples) // 10][0]:.0f}s, once SQLite's 64 MiB page"
        f" cache has filled) to the end: {rss[len(rss) // 10] / 1024:.1f} -> {last / 1024:.1f} MiB"
        f" ({(last - rss[len(rss) // 10]) / rss[len(rss) // 10]:+.1%}).",
        "",
        "Samples (s, MiB): " + ", ".join(f"{t:.0f}: {kib / 1024:.1f}" for t, kib in samples),
        "",
    ]


def run_workers(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    lines = [
        "## Worker processes on one SQLite file",
        "",
        "`uvicorn --factory receiver.app:from_env --workers N`, all processes on core 0.",
        "",
        "| workers | run | events/s | p50 ms | p99 ms | errors | load |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for round_no in range(1, args.rounds + 1):
        for n in (1, 2):
            # Created first: workers migrating a fresh file at once fail ("database is locked").
            db = work / f"workers-{round_no}-{n}.db"
            extra.build_db(db, 0, oldest=0, newest=0)
            server = make_server("receiver", work, sink.port, workers=n, db=db)
            load = extra.uptime()
            print(f"workers {round_no}: {n} ...", file=sys.stderr, flush=True)
            r = measure(server, round_no, args, stream, warmup, pin)
            print(f"  {line(r)}", file=sys.stderr, flush=True)
            errors = ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-"
            lines.append(
                f"| {n} | {round_no} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
                f"{errors} | {load} |"
            )
    return [*lines, ""]


def run_recording(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    """The receiver as shipped against itself with routing's record for explain switched off
    (bench/no_recording.py), alternately, each round: what the record costs the router."""
    lines = [
        "## What recording the routing decisions costs",
        "",
        "The receiver as shipped (routing records each batch's rules file for `GET",
        "/v1/events/:id/explain`) and the same with that record switched off",
        "(bench/no_recording.py), alternately, flat out.",
        "",
        "| run | receiver | stored+routed/s | p99 ms | record's cost | load |",
        "|---|---|---:|---:|---:|---|",
    ]
    costs: list[float] = []
    for round_no in range(1, args.rounds + 1):
        figures: dict[str, float] = {}
        for variant in ("not recorded", "recorded"):
            server = make_server("receiver", work, sink.port)
            if variant == "not recorded":
                server.argv = [sys.executable, "-m", "bench.no_recording"]
            print(f"recording {round_no}: {variant} ...", file=sys.stderr, flush=True)
            r = measure(server, round_no, args, stream, warmup, pin)
            rate = r.routing.sustained if r.routing is not None else 0.0
            figures[variant] = rate
            base = figures.get("not recorded") or 0.0
            cost = f"{1 - rate / base:+.1%}" if variant == "recorded" and base else "-"
            if variant == "recorded" and base:
                costs.append(1 - rate / base)
            lines.append(
                f"| {round_no} | {variant} | {rate:,.0f} | {r.p99_ms:.2f} | {cost} | {r.load} |"
            )
    if costs:
        lines += [
            "",
            f"The record's cost over the {len(costs)} rounds: {sum(costs) / len(costs):+.1%} on"
            f" average (each round {', '.join(f'{c:+.1%}' for c in costs)}; + is slower). The"
            " rounds' spread is this machine's noise as much as the record: the budget is 10%.",
        ]
    return [*lines, ""]
