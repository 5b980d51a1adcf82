"""Stores agree: the same scenario on the in-memory store (receiver.store.memory, the
backtest's) and on SQLite gives the same outbox rows and open alerts.

The memory store has the routing transaction's roles only: no action engine (acks,
resolves and snoozes need the whole Store), no leases. So the scenario compared is the
seed's without its actions and without crashes in a send; crashes between steps and in a
transaction stay (the memory store keeps what was committed: its transaction is a copy
of every table, put back if it raises). The memory run repeats the SQLite run's schedule:
the same operations, routing turns, timer turns and sends at the same virtual times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from receiver import events as receiver_events
from receiver.dispatch.router import Router
from receiver.metrics import Metrics
from receiver.store.memory import MemoryStore
from receiver.store.silences import add_silence
from tests.sim.generate import Op, Scenario, check
from tests.sim.invariants import Violation
from tests.sim.run import Run, SimCrash, run_scenario

EVERY = 5  # one seed in EVERY is also run on the memory store (it costs two more runs)
UNSUPPORTED = ("ack", "resolve", "snooze", "redeliver", "enable")


def comparable(s: Scenario) -> Scenario:
    """The seed's scenario without what the memory store cannot do (and no send fails:
    its worker delivers every row)."""
    ops = [
        o
        for o in s.ops
        if o.kind not in UNSUPPORTED and not (o.kind == "crash" and o.data["where"] == "in-send")
    ]
    return Scenario(s.seed, s.start, s.rules, ops)


class MemoryRun:
    """The SQLite run's schedule replayed on a MemoryStore, through the same Router."""

    def __init__(self, scenario: Scenario, schedule: list[tuple[float, str, int]]) -> None:
        self.scenario = scenario
        self.schedule = schedule
        self.now = scenario.start
        self.rulesets = [check(text) for text in scenario.rules]
        self.ruleset = self.rulesets[0]
        self.store = MemoryStore(clock=lambda: self.now)
        self._crash_next_tx = False
        self._real_transact = self.store.transact
        self.store.transact = self._transact  # type: ignore[method-assign]
        self._lean_savepoints()
        self.router = self._router()

    def _lean_savepoints(self) -> None:
        """A copy of every table (what a crash in a transaction puts back) is taken only
        for a transaction a crash is drawn for; no savepoint inside one takes another (the
        timers enter one for each chain, and most of a memory run was those copies). A
        block that fails otherwise is a bug: the SQLite run undoes its writes and this one
        keeps them, so the stores disagree and say so."""
        tx = self.store.tx
        whole = tx.savepoint
        depth = [0]

        @contextlib.contextmanager
        def savepoint() -> Iterator[None]:
            if depth[0] or not self._crash_next_tx:
                yield
                return
            depth[0] += 1
            try:
                with whole():
                    yield
            finally:
                depth[0] -= 1

        tx.savepoint = savepoint  # type: ignore[method-assign]

    def _router(self) -> Router:
        return Router(
            self.store,  # type: ignore[arg-type]  # the routing transaction's part of a Store
            lambda: self.ruleset,
            metrics=Metrics(),
            on_routed=lambda: None,
            clock=lambda: self.now,
        )

    async def _transact(self, fn: Callable[[Any], Any]) -> Any:
        def wrapped(tx: Any) -> Any:
            result = fn(tx)
            if self._crash_next_tx:
                self._crash_next_tx = False
                raise SimCrash("kill -9 before the commit")
            return result

        return await self._real_transact(wrapped)

    async def _guarded(self, work: Callable[[], Any]) -> Any:
        try:
            return await work()
        except SimCrash:
            self.router = self._router()  # what the Router kept in memory is gone
            return None

    async def run(self) -> None:
        for at, what, index in self.schedule:
            self.now = at
            if what == "op":
                await self._apply(self.scenario.ops[index])
            elif what == "route":
                for _ in range(100):
                    routed = await self._guarded(lambda: self.router.route_pending())
                    if routed == 0 and not self._crash_next_tx:
                        break
            elif what == "tick":
                await self._guarded(lambda: self.router.tick())
            else:
                self.store.tx.scratch.deliver_due(self.now)

    async def _apply(self, op: Op) -> None:
        kind, data = op.kind, op.data
        if kind == "event":
            body = data["body"]
            event = receiver_events.validate(dict(body))
            await self.store.events.accept(event, json.dumps(body, sort_keys=True).encode())
        elif kind == "silence":
            until = self.now + float(data["for"])
            # The one way a silence is added (store.silences), as the SQLite run's: an
            # until-resolved one notes the alerts it matches now and ends with them.
            await self.store.transact(
                lambda tx: add_silence(
                    tx, data["match"], "sim", self.now, until, after=data.get("after")
                )
            )
        elif kind == "unsilence":
            ids = [s.id for s in self.store.tx.silences.recent(limit=1000)]
            if ids:
                sid = sorted(ids)[data["nth"] % len(ids)]
                await self.store.transact(lambda tx: tx.silences.expire(sid, self.now))
        elif kind == "reload":
            self.ruleset = self.rulesets[data["file"] % len(self.rulesets)]
        elif kind == "crash":
            if data["where"] == "in-tx":
                self._crash_next_tx = True
            else:
                self.router = self._router()


def final_state(run: Run) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What the stores are compared on: the outbox rows (without their ids) and the open
    alerts, read from the SQLite file at the end of a run."""
    rows = run.query("SELECT event_id, rule, notifier, target, kind, state FROM outbox")
    return sorted(rows), sorted(run.query("SELECT id, episode FROM alerts WHERE state = 'open'"))


def stores_agree(s: Scenario, done: tuple[Run, tuple[list[Any], list[Any]]] | None = None) -> None:
    """Memory and SQLite give the same outcome for a seed: the same rows and open alerts.

    (Rows compared without their ids: two rows falling due in one turn of the timers may
    be written in either order.) done: the seed's SQLite run and its final_state, reused
    when the scenario needed no cut."""
    same = comparable(s)
    if done is not None and len(same.ops) == len(s.ops) and not s.fails and not s.subscribers:
        sqlite, state = done
    else:
        states: list[tuple[list[Any], list[Any]]] = []

        async def capture(run: Run, final: bool, routed: list[str]) -> None:
            if final:
                states.append(final_state(run))

        sqlite = run_scenario(same, capture)
        state = states[0]
    memory = MemoryRun(same, sqlite.schedule)
    asyncio.run(memory.run())
    rows = sorted(
        (r.event_id, r.rule, r.notifier, r.target, r.kind, r.state)
        for r in memory.store.tx.scratch.rows()
    )
    opened = sorted((a.id, a.episode) for a in memory.store.tx.alerts.list_open(limit=100_000))
    for name, a, b in (("outbox rows", state[0], rows), ("open alerts", state[1], opened)):
        a = [tuple(x) for x in a]
        if a != b:
            first = next((x, y) for x, y in zip([*a, None], [*b, None], strict=False) if x != y)
            raise Violation(
                "stores agree",
                f"{name} differ (SQLite {len(a)}, memory {len(b)}); first difference:"
                f" SQLite {first[0]} / memory {first[1]}",
            )
