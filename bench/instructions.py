"""Instructions an event costs, part by part, counted by valgrind: a figure the machine's load
does not move (issue 33: "if one core truly cannot do it, show it with instruction counts per
part on the worst shape").

    python -m bench.instructions [--shape shared-type] [--events 2000] [--output FILE]

Each figure is the difference between two runs under `valgrind --tool=cachegrind
--cache-sim=no` that differ only in the work measured (the same set-up, imports and start in
both), over the number of events: instructions an event. Two of them are whole servers over
real HTTP (wrk is not under valgrind; a client in this process sends the events on 8 kept-alive
connections): the ceiling (bench/ceiling.py) and `receiver serve` on the shape's rules, until
every event is routed and every notification sent. The others are the receiver's parts in
process (bench/instr_parts.py): ingest without HTTP, the store's accept, routing with the
shape's rules, with none, and without the session projection.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import servers, streams
from receiver import signature

BENCH = Path(__file__).resolve().parent

VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
REFS = re.compile(r"I\s+refs:\s+([\d,]+)")
PARTS = ("ingest", "store", "route", "route-bare", "route-noproj")
CONNECTIONS = 8
START_LIMIT = 300.0  # seconds for a server to answer under valgrind (its imports are slow)
DRAIN_LIMIT = 600.0  # seconds for every event of a run to be routed and sent, under valgrind


def refs(text: str) -> int:
    found = REFS.findall(text)
    if not found:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{text[-2000:]}")
    return int(found[-1].replace(",", ""))


def part(name: str, shape: str, count: int, run: bool) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    argv = [*VALGRIND, sys.executable, "-m", "bench.instr_parts", name, shape, str(count)]
    done = subprocess.run(
        [*argv, "1" if run else "0"], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    return refs(done.stderr)


def send(port: int, bodies: list[bytes], secret: str) -> None:
    """Every body POSTed once, on CONNECTIONS kept-alive connections; each must be accepted."""
    failures: list[str] = []

    def worker(share: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for body in share:
            headers = {
                "content-type": "application/json",
                signature.SIGNATURE_HEADER: signature.sign(secret.encode(), body),
            }
            conn.request("POST", "/v1/events", body, headers)
            answer = conn.getresponse()
            answer.read()
            if answer.status not in (200, 202):
                failures.append(f"{answer.status}")
        conn.close()

    threads = [
        threading.Thread(target=worker, args=(bodies[i::CONNECTIONS],)) for i in range(CONNECTIONS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries refused: {failures[:5]}")


def _waiting(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        unrouted = conn.execute("SELECT count(*) FROM events WHERE routed_at IS NULL").fetchone()
        unsent = conn.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()
    return int(unrouted[0]) + int(unsent[0])


def server(kind: str, shape: streams.Shape, count: int, run: bool, work: Path) -> int:
    """A whole server under valgrind: started, sent the events (or none), drained, stopped."""

    port = servers.free_port()
    sink = servers.Sink()
    db = work / f"{kind}-{int(run)}.db"
    env = {
        **os.environ,
        "PYTHONHASHSEED": "0",
        "PYTHONPATH": str(BENCH.parent),
        "RECEIVER_SECRETS": servers.SECRET,
        "RECEIVER_PORT": str(port),
        "RECEIVER_DB": str(db),
        "RECEIVER_RULES": str(BENCH / "no-rules.yaml" if kind == "bare" else shape.rules),
        "RECEIVER_LOG_LEVEL": "warning",
        "BENCH_SINK_PORT": str(sink.port),
    }
    if kind == "ceiling":
        argv = [sys.executable, "-m", "bench.ceiling", "--port", str(port)]
    else:  # "receiver" on the shape's rules, "bare" on none
        argv = [sys.executable, "-m", "receiver", "serve"]
    log = work / f"{kind}-{int(run)}.valgrind"
    proc = subprocess.Popen(
        [*VALGRIND, f"--log-file={log}", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_LIMIT
        while not servers.answers(port, "/healthz"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} did not start under valgrind; see {log}")
            time.sleep(0.5)
        if run:
            send(port, _bodies(shape, count), servers.SECRET)
            if kind != "ceiling":
                deadline = time.monotonic() + DRAIN_LIMIT
                while _waiting(db):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the receiver did not drain in {DRAIN_LIMIT:.0f} s")
                    time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(START_LIMIT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        sink.stop()
    return refs(log.read_text())


def _bodies(shape: streams.Shape, count: int) -> list[bytes]:
    import json

    return [json.dumps(e).encode() for e in shape.deliveries(count, 7, "h")]


def measure(shape: streams.Shape, count: int) -> dict[str, float]:
    """Instructions an event for the servers and each part (two valgrind runs apiece)."""
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("ceiling", "receiver", "bare"):
            base = server(kind, shape, count, False, Path(tmp))
            full = server(kind, shape, count, True, Path(tmp))
            figures[kind] = (full - base) / count
            print(f"{kind}: {figures[kind]:,.0f} instructions an event", file=sys.stderr)
    for name in PARTS:
        full = part(name, shape.name, count, True)
        figures[name] = (full - part(name, shape.name, count, False)) / count
        print(f"{name}: {figures[name]:,.0f} instructions an event", file=sys.stderr)
    return figures


def report(shape: streams.Shape, count: int, f: dict[str, float]) -> list[str]:
    k = 1000.0
    http = f["ceiling"]
    rest = f["receiver"] - f["ingest"] - f["store"] - f["route"]
    rules, projection = f["route"] - f["route-bare"], f["route"] - f["route-noproj"]
    rows = [
        ("the ceiling, whole (HTTP, HMAC, JSON, 202)", f["ceiling"]),
        ("the receiver, whole (`receiver serve`, stored, routed, sent)", f["receiver"]),
        ("the receiver with no rule (bench/no-rules.yaml), whole", f["bare"]),
        ("ingest in process (checks, HMAC, JSON, validation, 202; no HTTP)", f["ingest"]),
        ("the store's accept (rows, dedupe, group commit)", f["store"]),
        ("routing, the shape's rules", f["route"]),
        ("- of which the rules (routing less routing with no rule)", rules),
        ("- of which the session projection (routing less routing without it)", projection),
        ("the rest: HTTP, the event loop, sends, timers (whole less the parts)", rest),
    ]
    lines = [
        "| part | thousand instructions an event | share of the receiver | vs the ceiling |",
        "|---|---:|---:|---:|",
    ]
    for label, value in rows:
        lines.append(
            f"| {label} | {value / k:,.0f} | {value / f['receiver']:.0%} | {value / http:.2f}x |"
        )
    half = 2 * http
    lines += [
        "",
        f"Half the ceiling needs the receiver at two ceilings' instructions an event or less"
        f" ({half / k:,.0f} thousand); it takes {f['receiver'] / k:,.0f} thousand"
        f" ({f['receiver'] / http:.2f} ceilings), so on one core it sustains about"
        f" {http / f['receiver']:.2f}x of the ceiling if time follows instructions; with no"
        f" rule at all, {f['bare'] / k:,.0f} thousand ({http / f['bare']:.2f}x).",
    ]
    return lines


def section(shape_name: str = "shared-type", count: int = 2000) -> list[str]:
    """`make bench`'s instructions part: the measurement and its section of bench/RESULTS.md."""
    shape = next(s for s in streams.SHAPES if s.name == shape_name)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    figures = measure(shape, count)
    return [
        "## Instructions an event, part by part",
        "",
        f'Run on {started} (`make bench BENCH_ARGS="--parts instructions"`, bench/'
        f"instructions.py), the {shape.name} shape ({shape.rules.name}), {count:,} events a"
        " run. Each figure is the difference between two runs under `valgrind --tool="
        "cachegrind --cache-sim=no` that differ only in the work measured (the same set-up,"
        " imports and start in both), over the events: instructions an event, which the"
        " machine's load does not move. The whole servers get the events over real HTTP on 8"
        " kept-alive connections (the receiver until every event is routed and every"
        " notification sent); the parts run in process (bench/instr_parts.py).",
        "",
        *report(shape, count, figures),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="shared-type")
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    shape = next(s for s in streams.SHAPES if s.name == args.shape)
    figures = measure(shape, args.events)
    lines = report(shape, args.events, figures)
    print("\n".join(lines))
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
