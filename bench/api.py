"""`make bench`, part api: the /v1 read API on a SQLite store of 1,000,000 sessions.

    .venv/bin/python -m bench.api                       # all of it; writes "## Read API"
    .venv/bin/python -m bench.api --sessions 100000 --duration 5 --rounds 1   # a quick look
    .venv/bin/python -m bench.run --parts api           # the same, as a part of `make bench`

The store: a file migrated by the product (`receiver db migrate`), then filled with
synthetic sessions by direct inserts into `sessions` and `session_scores`: each session's
events (score drops and recoveries, interventions, a stop now and then) are folded by the
product's own receiver.sessions.Summary.fold, so every mark and derived column is what
the router would have written. About 20,000 users, 50 pages, 10 cohorts, integer scores,
started over the last 30 days. Built once per size and schema version, and again when it
is a day old (the windows of /v1/scores are relative to now), under bench/.cache/.

What it measures, the server pinned to core 0 and every load generator to core 1:

- one: GET /v1/sessions/:id vs a bare Starlette endpoint returning the same JSON on the
  same uvicorn settings (this file, --serve-bare), in the same run; req/s, p50, p99.
- list: GET /v1/sessions with filters, under 32 connections and with 1 (p99 under 32
  connections is mostly queueing; 1 connection is the latency of one request).
- scores: GET /v1/scores?window=30d, per groupBy, one request at a time.
- ingest: the pre-signed stream of bench/run.py (bench/events.lua) flat out against a copy
  of the store, alone; with 200 reads/s beside it (bench/reads.lua, paced), of point reads
  (a session, its score, its history, a user's list) or of the filtered lists; and with
  /v1/scores?window=30d back to back.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.api_ingest import (
    part_ingest,
)
from bench.api_reads import Bench, part_list, part_one, part_scores, read_mixes
from bench.api_servers import receiver_server, serve_bare
from bench.api_store import (
    BENCH,
    COHORTS,
    LOAD_CPU,
    PAGES,
    SECTION,
    SERVER_CPU,
    SESSIONS,
    USERS,
    cached_store,
    log,
)
from bench.servers import Sink

# -- running it -----------------------------------------------------------------------------

PARTS = ("one", "list", "scores", "ingest")


def run_part(args: argparse.Namespace, work: Path, pin: bool) -> list[str]:
    """The "## Read API" section of bench/RESULTS.md: what bench/run.py --parts api calls.

    Takes the options of bench/run.py it shares (duration, warmup, rounds, connections) and
    this file's own (api_sessions, read_rate, ingest_events, api_parts) when present."""
    store = cached_store(getattr(args, "api_sessions", SESSIONS))
    b = Bench(
        store=store,
        work=work,
        pin=pin,
        seconds=args.duration,
        warmup=args.warmup,
        rounds=args.rounds,
        connections=args.connections,
        read_rate=getattr(args, "read_rate", 200.0),
        ingest_events=getattr(args, "ingest_events", 200_000),
        now=time.time(),
    )
    parts = getattr(args, "api_parts", ",".join(PARTS)).split(",")
    age = (time.time() - store.built_at) / 3600
    lines = [
        SECTION,
        "",
        "Written by bench/api.py; each part says when it ran (a run of some parts, `bench/api.py "
        f"--parts`, keeps the others'). The store: {store.sessions:,} sessions of about {USERS:,} "
        f"users over the last 30 days, {len(PAGES)} pages, {len(COHORTS)} cohorts, scores 0-100, "
        "75% active, 17% dropped, 8% stopped; migrated by `receiver db migrate`, then filled by "
        "direct inserts of summaries folded by receiver.sessions (bench/.cache/"
        f"{store.path.name}, built in {store.build_seconds:.0f}s, {age:.1f} h ago; "
        f"{store.path.stat().st_size / 2**20:,.0f} MiB). `receiver serve` on core "
        f"{SERVER_CPU}{'' if pin else ' (NOT PINNED)'}, wrk and this script on core {LOAD_CPU}, "
        "an enterprise key (no plan limit).",
        "",
    ]
    sink = Sink()
    server = receiver_server(store.path, work, sink.port)
    try:
        server.start(pin)
        if "one" in parts:
            lines += part_one(b, server)
        if "list" in parts:
            lines += part_list(b, server)
        if "scores" in parts:
            lines += part_scores(b, server)
        mixes = read_mixes(b, server.port) if "ingest" in parts else {}
        server.stop()  # ingest runs on copies of the store, the reads' server stopped
        if "ingest" in parts:
            lines += part_ingest(b, mixes, sink)
    finally:
        server.stop()
        sink.stop()
    return lines


def write_section(path: Path, lines: list[str]) -> None:
    """Put the section into path: in place of the one there, else at the end. Of the one
    there, the `### ` parts this run did not measure (--parts) are kept."""
    old = path.read_text().splitlines() if path.exists() else []
    if SECTION in old:
        start = old.index(SECTION)
        end = next((i for i in range(start + 1, len(old)) if old[i].startswith("## ")), len(old))
        _, kept = _parts(old[start:end])
        head, fresh = _parts(lines)
        merged = [*head]
        for key, part in {**kept, **fresh}.items():
            merged += fresh.get(key, part)
        new = [*old[:start], *merged, *old[end:]]
    else:
        new = [*old, *([""] if old and old[-1] else []), *lines]
    path.write_text("\n".join(new).rstrip("\n") + "\n")


def _parts(lines: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The lines before the first `### ` heading, and each `### ` part by its heading."""
    head: list[str] = []
    parts: dict[str, list[str]] = {}
    current = head
    for line in lines:
        if line.startswith("### "):
            current = parts[line] = []
        current.append(line)
    if head and head[-1]:
        head.append("")
    for part in parts.values():
        if part[-1]:
            part.append("")
    return head, parts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[1:]),
    )
    parser.add_argument(
        "--sessions",
        dest="api_sessions",
        type=int,
        default=SESSIONS,
        help="sessions in the store (built once per size, cached)",
    )
    parser.add_argument("--duration", type=int, default=15, help="seconds per measured wrk run")
    parser.add_argument("--warmup", type=int, default=3, help="seconds of warm-up per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--read-rate", type=float, default=200.0, help="reads/s beside ingest")
    parser.add_argument(
        "--ingest-events",
        type=int,
        default=200_000,
        help="distinct signed events in the ingest stream",
    )
    parser.add_argument(
        "--parts",
        dest="api_parts",
        default=",".join(PARTS),
        help=f"comma-separated, of: {', '.join(PARTS)}",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=BENCH / "RESULTS.md",
        help="the file whose Read API section is written (the rest is kept)",
    )
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--body", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        assert args.body is not None
        serve_bare(args.port, args.body)
        return
    if unknown := set(args.api_parts.split(",")) - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    if pin:
        os.sched_setaffinity(0, {int(LOAD_CPU)})  # this script stays off the server's core
    with tempfile.TemporaryDirectory(prefix="receiver-bench-api-") as tmp:
        lines = run_part(args, Path(tmp), pin)
    write_section(args.output, lines)
    print("\n".join(lines))
    log(f"written to {args.output} ({SECTION})")


if __name__ == "__main__":
    main()
