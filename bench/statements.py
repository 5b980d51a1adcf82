"""SQL statements per event: how many the store runs to keep one event and to route it.

    .venv/bin/python -m bench.statements [--events 20000] [--rules bench/rules.yaml]

In one process, on a fresh SQLite file: the bench stream's events (the random walk
`receiver simulate` sends) accepted 32 at a time, as ingest's group commit takes them
under load, then routed by the router's own route_pending() with the bench rules. The
SQLite connection's trace callback counts every statement run (a BEGIN, a SAVEPOINT,
each row of an executemany). Issue 20 aims for at most 5 a routed event on average.
Writes the "## SQL statements per event" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from collections import Counter
from itertools import islice
from pathlib import Path

from bench.admin import write_section
from receiver import events, rules
from receiver.dispatch.router import Router
from receiver.metrics import Metrics
from receiver.simulator.walk import event_stream
from receiver.store.sqlite import SQLiteStore

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

SECTION = "## SQL statements per event"
AIM = 5.0


def kind(sql: str) -> str:
    """A statement's family: its verb and table ("INSERT outbox", "BEGIN")."""
    words = re.findall(r"[A-Za-z_]+", sql)
    if not words:
        return "?"
    verb = words[0].upper()
    lowered = [w.lower() for w in words]
    for marker in ("into", "from", "update"):
        if marker in lowered:
            at = lowered.index(marker) + 1
            if at < len(words):
                return f"{verb} {words[at]}"
    return verb


async def count(n: int, rules_file: Path) -> tuple[Counter[str], Counter[str], int, float]:
    """Statements while accepting n events and while routing them; routed; routing s."""
    stream = list(islice(event_stream(seed=1, sessions=200, threshold=40, run="stmts"), n))
    os.environ.setdefault("BENCH_SINK_PORT", "9")  # nothing is sent here: routing only
    ruleset = rules.load_file(rules_file)
    with tempfile.TemporaryDirectory(prefix="receiver-bench-stmts-") as tmp:
        store = SQLiteStore(Path(tmp) / "s.db", clock=time.time)
        await store.open()
        seen: Counter[str] = Counter()
        conn = store._conn  # bench only: the store's own connection, to count on it
        assert conn is not None
        conn.set_trace_callback(lambda sql: seen.update([kind(sql)]))
        try:
            validated = [events.validate(e) for e in stream]
            for start in range(0, n, 32):
                chunk = validated[start : start + 32]
                await asyncio.gather(
                    *(store.events.accept(e, e.model_dump_json().encode()) for e in chunk)
                )
            accepting = Counter(seen)
            seen.clear()
            router = Router(store, lambda: ruleset, metrics=Metrics(), on_routed=lambda: None)
            routed, started = 0, time.perf_counter()
            while (done := await router.route_pending()) > 0:
                routed += done
            took = time.perf_counter() - started
            return accepting, Counter(seen), routed, took
        finally:
            conn.set_trace_callback(None)
            await store.close()


def measure(n: int, rules_file: Path) -> list[str]:
    accepting, routing, routed, took = asyncio.run(count(n, rules_file))
    per_accept = sum(accepting.values()) / n
    per_route = sum(routing.values()) / max(routed, 1)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        SECTION,
        "",
        f"Written by `python bench/statements.py` on {when}: {n:,} events of the bench"
        f" stream into a fresh SQLite file, accepted 32 at a time (one group commit each),"
        f" then {routed:,} routed by route_pending() with `{rules_file.name}` in"
        f" {took:.1f} s (one process, counted by the connection's trace callback; every"
        " row of an executemany counts).",
        "",
        f"- Keeping an event: {per_accept:.2f} statements.",
        f"- Routing it: {per_route:.2f} statements (aim: at most {AIM:g}:"
        f" {'met' if per_route <= AIM else 'missed'}).",
        "",
        "| while routing | statements | per event |",
        "|---|---:|---:|",
    ]
    for name, c in routing.most_common(15):
        lines.append(f"| `{name}` | {c:,} | {c / max(routed, 1):.3f} |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rules", type=Path, default=BENCH / "rules.yaml")
    parser.add_argument("--output", type=Path, default=BENCH / "RESULTS.md")
    args = parser.parse_args()
    lines = measure(args.events, args.rules)
    print("\n".join(lines))
    write_section(lines, args.output)


if __name__ == "__main__":
    main()
