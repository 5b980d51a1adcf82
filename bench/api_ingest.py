"""The read API bench's ingest part: the pre-signed stream flat out against a copy of the
store, alone and with reads beside it."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.api_load import (
    Run,
    get,
    write_paths,
    write_stream,
    wrk,
    wrk_argv,
    wrk_result,
)
from bench.api_reads import Bench
from bench.api_servers import receiver_server
from bench.api_store import (
    TARGET_INGEST_RATIO,
    TARGET_P99_RATIO,
    log,
    stamp,
)
from bench.servers import Server, Sink

MODES = {  # what runs beside ingest: the table's label
    "alone": "nothing",
    "point": "point reads",
    "lists": "filtered lists",
    "aggregates": "30d aggregates",
}


@dataclass
class Ingest:
    mode: str
    round: int
    run: Run
    backlog: int  # events not routed yet when wrk stopped
    drain: float | None  # seconds to route them, None if not within 120 s
    beside: str  # what the reads beside did


def _unrouted(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        count: int = conn.execute("SELECT count(*) FROM events WHERE routed_at IS NULL").fetchone()[
            0
        ]
        return count


def _drain(db: Path, limit: float = 120.0) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if _unrouted(db) == 0:
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def _copy_store(b: Bench) -> Path:
    db = b.work / "ingest.db"
    for suffix in ("", "-wal"):
        source = Path(f"{b.store.path}{suffix}")
        if source.exists():
            shutil.copyfile(source, f"{db}{suffix}")
    return db


def _remove_store(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def _warm_up(b: Bench, server: Server, warmup: Path, db: Path) -> None:
    """The warm-up stream, then its backlog routed before the measured run starts."""
    if b.warmup:
        wrk(
            server.port,
            "events.lua",
            [str(warmup), "/v1/events"],
            seconds=b.warmup,
            connections=b.connections,
            pin=b.pin,
        )
    if _drain(db) is None:
        raise SystemExit("ingest: the warm-up was not routed within 120s")


def ingest_run(
    b: Bench, mode: str, round_no: int, stream: Path, warmup: Path, sink: Sink, mixes: Path
) -> Ingest:
    """Ingest flat out on a fresh copy of the store: alone, with reads paced to b.read_rate
    beside it ("point" or "lists": the paths in mixes / f"{mode}.paths"), or with
    /v1/scores?window=30d back to back on one connection ("aggregates")."""
    db = _copy_store(b)
    server = receiver_server(db, b.work, sink.port)
    beside: subprocess.Popen[str] | None = None
    stop = threading.Event()
    took: list[float] = []
    looper: threading.Thread | None = None
    events = ["/v1/events"]
    try:
        server.start(b.pin)
        _warm_up(b, server, warmup, db)
        if mode in ("point", "lists"):
            argv = wrk_argv(
                server.port,
                "reads.lua",
                [str(mixes / f"{mode}.paths"), b.key, f"{b.read_rate:g}"],
                seconds=b.seconds + 2,
                connections=8,
                pin=b.pin,
            )
            beside = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            time.sleep(1)  # the reads run before ingest starts and after it stops
        elif mode == "aggregates":
            path = "/v1/scores?window=30d&groupBy=page"

            def loop() -> None:
                while not stop.is_set():
                    took.append(get(server.port, path, b.key)[2])

            looper = threading.Thread(target=loop, daemon=True)
            looper.start()
            time.sleep(1)
        run = wrk(
            server.port,
            "events.lua",
            [str(stream), *events],
            seconds=b.seconds,
            connections=b.connections,
            pin=b.pin,
        )
        backlog = _unrouted(db)
        note = "-"
        if beside is not None:
            out, err = beside.communicate(timeout=b.seconds + 60)
            r = wrk_result(out, err, beside.returncode, run.load)
            note = (
                f"{r.rps:,.0f} reads/s, p50 {r.p50:.1f} ms, p99 {r.p99:.1f} ms, errors {r.errors}"
            )
        if looper is not None:
            stop.set()
            looper.join(60)
            if took:
                ms = sorted(t * 1000 for t in took)
                note = f"{len(ms)} aggregates, p50 {ms[len(ms) // 2]:.0f} ms, max {ms[-1]:.0f} ms"
        drain = _drain(db) if backlog else 0.0
    finally:
        stop.set()
        if beside is not None and beside.poll() is None:
            beside.kill()
            beside.wait(5)
        server.stop()
        if looper is not None:
            looper.join(60)
        _remove_store(db)
    return Ingest(mode, round_no, run, backlog, drain, note)


def part_ingest(b: Bench, mixes: dict[str, list[str]], sink: Sink) -> list[str]:
    """(d) ingest alone vs with reads beside it, and with aggregates beside it."""
    started = stamp()
    stream, warmup = b.work / "stream.tsv", b.work / "warmup.tsv"
    write_stream(stream, count=b.ingest_events, seed=1, run="bench")
    write_stream(warmup, count=20_000, seed=2, run="warmup")
    for name, paths in mixes.items():
        write_paths(b.work / f"{name}.paths", paths)
    results: list[Ingest] = []
    for round_no in range(1, b.rounds + 1):
        for mode in MODES:
            log(f"ingest {round_no}: {mode} ...")
            got = ingest_run(b, mode, round_no, stream, warmup, sink, b.work)
            log(
                f"  {got.run.rps:,.0f} accepted/s, p50 {got.run.p50:.2f} ms, p99 "
                f"{got.run.p99:.2f} ms; backlog {got.backlog}; beside: {got.beside}"
            )
            results.append(got)
    lines = [
        "### Ingest with reads beside it",
        "",
        f"{started} bench/run.py's kind of stream (bench/events.lua, pre-signed, wrk "
        f"-c{b.connections} flat out for {b.seconds:g}s after {b.warmup:g}s of warm-up) into a "
        f"fresh copy of the {b.store.sessions:,}-session store, each run: alone; with "
        f"{b.read_rate:g} reads/s beside it (bench/reads.lua paced, 8 connections, from 1 s "
        "before ingest starts to 1 s after it stops), of two mixes: point reads (in turn, by "
        "random id: a session, its score, its score history, and a random user's list) and "
        "filtered lists (the queries of the table above, in turn); and with GET "
        "/v1/scores?window=30d&groupBy=page back to back on one connection. The server has core "
        "0 to itself, so the CPU the reads take is CPU ingest loses; but a read must not stall "
        f"it beyond that. Targets: accepted/s >= {TARGET_INGEST_RATIO:g}x of alone, p99 <= "
        f"{TARGET_P99_RATIO:g}x.",
        "",
        "| beside | round | accepted/s | p50 ms | p99 ms | vs alone | p99 vs alone | targets "
        "| not routed at the end (drained in) | what ran beside | load |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    alone = {r.round: r for r in results if r.mode == "alone"}
    for r in results:
        base = alone[r.round].run
        rate, p99 = r.run.rps / base.rps, r.run.p99 / base.p99
        verdict = "-"
        if r.mode != "alone":
            verdict = ", ".join(
                [
                    "rate " + ("met" if rate >= TARGET_INGEST_RATIO else "missed"),
                    "p99 " + ("met" if p99 <= TARGET_P99_RATIO else "missed"),
                ]
            )
        drained = f"{r.drain:.1f}s" if r.drain is not None else "not within 120s"
        label = MODES[r.mode] + (f", {b.read_rate:g}/s" if r.mode in ("point", "lists") else "")
        lines.append(
            f"| {label} | {r.round} | {r.run.rps:,.0f} | {r.run.p50:.2f} | {r.run.p99:.2f} | "
            f"{rate:.2f}x | {p99:.2f}x | {verdict} | {r.backlog:,} ({drained}) | {r.beside} | "
            f"{r.run.load} |"
        )
    return [*lines, ""]
