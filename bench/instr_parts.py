"""One part of the receiver's work on a stream shape, run under valgrind by bench/instructions.py.

    python -m bench.instr_parts PART SHAPE COUNT RUN

Every run does the same set-up for COUNT events of SHAPE (building and signing them, and for
the store's parts a SQLite file holding them); RUN=1 then does the part's work on them and
RUN=0 does not, so the difference between the two runs' instruction counts is the part's
work alone, set-up, imports and interpreter start excluded:

    ingest        the ingest endpoint as an ASGI app, in process (no HTTP): size and
                  signature checks, JSON, validation, the 202; its store answers at once
    store         the SQLite store's accept: the rows, the dedupe, group commit (32 at once)
    route         the router on the stored events: the rules' decisions (in their thread),
                  the routing transaction (alerts, outbox, the session projection, marks)
    route-bare    the same with no rule: what routing costs an event that no rule wants
    route-noproj  the same as route, with the session projection left out
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import streams
from receiver import signature
from receiver.dispatch.router import Router
from receiver.edge.ingest import IngestEndpoint
from receiver.events import parse
from receiver.metrics import Metrics
from receiver.rules import load_text
from receiver.rules.load import load_file
from receiver.store import open_store

BENCH = Path(__file__).resolve().parent

SECRET = b"bench-secret"
GROUP = 32  # accepts in flight at once, as wrk's 32 connections keep them


def bodies(shape: streams.Shape, count: int) -> list[bytes]:
    return [json.dumps(e).encode() for e in shape.deliveries(count, 7, "i")]


async def ingest(shape: streams.Shape, count: int, run: bool) -> None:
    class Events:
        async def accept(self, event: Any, raw: bytes, trace: Any = None) -> str:
            return "new"

    class Store:
        events = Events()

    endpoint = IngestEndpoint(
        store=Store(),  # type: ignore[arg-type]
        secrets=[SECRET],
        max_body=65536,
        metrics=Metrics(),
        max_event_age=8 * 86400,
        max_clock_skew=300,
    )
    requests = []
    for body in bodies(shape, count):
        headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"),
            (b"x-service-signature", signature.sign(SECRET, body).encode()),
        ]
        scope = {
            "type": "http", "method": "POST", "path": "/v1/events", "headers": headers,
            "client": ("127.0.0.1", 1),
        }  # fmt: skip
        requests.append((scope, body))
    if not run:
        return

    answers: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answers.append(message["status"])

    for scope, body in requests:

        async def receive(body: bytes = body) -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        await endpoint(scope, receive, send)
    assert answers.count(202) == count, answers[:5]


async def stored(shape: streams.Shape, count: int, db: Path, run: bool) -> Any:
    """A store holding the shape's events (all of them when run is False or the part is
    not the store's: then the set-up stores them, the same way in both runs)."""
    store = open_store(str(db), synchronous="full")
    await store.open()
    events = [(parse(body), body) for body in bodies(shape, count)]
    if run:
        for start in range(0, len(events), GROUP):
            group = events[start : start + GROUP]
            await asyncio.gather(*(store.events.accept(e, raw) for e, raw in group))
    return store


async def route(shape: streams.Shape, count: int, db: Path, run: bool, mode: str) -> None:
    store = await stored(shape, count, db, True)
    env = {**os.environ, "BENCH_SINK_PORT": "9"}
    ruleset = load_text("rules: []\n") if mode == "bare" else load_file(shape.rules, env)
    router = Router(store, lambda: ruleset, metrics=Metrics(), on_routed=lambda: None)
    if mode == "noproj":  # what the session projection costs: the batches without it
        kind = await store.transact(lambda tx: type(tx.sessions))
        kind.project = lambda self, facts: None
    if run:
        while await router.route_pending():
            pass
    await store.close()


def main() -> None:
    part, shape_name, count, run = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    shape = next(s for s in streams.SHAPES if s.name == shape_name)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "instr.db"
        if part == "ingest":
            asyncio.run(ingest(shape, count, run))
        elif part == "store":

            async def store_part() -> None:
                store = await stored(shape, count, db, run)
                await store.close()

            asyncio.run(store_part())
        elif part.startswith("route"):
            mode = part.partition("-")[2]
            asyncio.run(route(shape, count, db, run, mode))
        else:
            raise SystemExit(f"no part {part!r}")


if __name__ == "__main__":
    main()
