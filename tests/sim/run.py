"""The runner: one scenario through the real pipeline on a virtual clock.

What runs is the receiver's own code: events are accepted by the SQLite store
(receiver.store.SQLiteStore, a real file), routed by receiver.dispatch.router.Router
(route_pending: rules, the alert state machine, the lifecycle, the outbox), whose timers
(Router.tick: repeats, escalation steps, what a silence held, the heartbeat) run at the
moments the virtual clock passes; acks, resolves and snoozes go through
receiver.dispatch.actions.perform, the one action engine. Nothing is sent: the runner is
the notify worker, claiming due rows under their lease (store.outbox.claim_due) and
recording each send before marking it delivered.

Crashes are kill -9: the Router (all it keeps in memory) is dropped and the store closed
and opened again from its file. "in-tx" makes the next routing or timers transaction fail
after its work is done and before it commits (rolled back: it is re-run after the
restart); "in-send" crashes after a row was sent and before its delivery was recorded
(it is sent again when its lease runs out: at least once, at most once per lease).

The same scenario gives the same trace, line for line: ids come from the scenario, the
store's counters and the clock are the runner's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from receiver import events as receiver_events
from receiver.dispatch import pipeline
from receiver.dispatch.alerts import Transition
from receiver.dispatch.router import TIMERS_GAP, WAKE_EVERY, Router
from receiver.metrics import Metrics
from receiver.rules import Ruleset
from receiver.rules.maintenance import next_boundary
from receiver.store import SQLiteStore, open_store
from receiver.store.records import Attempt, OutboxRow
from tests.sim import sends
from tests.sim.fronts import Fronts
from tests.sim.generate import Op, Scenario, check
from tests.sim.subscribers import Subscribers, steady_ids

LEASE = 30.0  # the runner's send lease (the worker's default is 60 s; shorter finds more)
TICK_EVERY = 60.0  # the timers look at least this often within a gap (besides when due) ...
MAX_TICKS = 16  # ... but at most this many times a gap; and at each moment one falls due
MAX_DUE = 1000  # (a bound on those: a repeat every 5 minutes over an idle 2 hours is 24)


Checker = Callable[["Run", bool, list[str]], Awaitable[None]]  # (run, final, routed now)


class SimCrash(Exception):
    """A kill -9 at this point (raised inside a transaction: it is rolled back)."""


@dataclass
class Seen:
    """What the run observed: the transitions routing applied (committed ones only), the
    sends, and the rules file in force, for the invariants (tests.sim.invariants)."""

    transitions: dict[str, tuple[str, str | None, int | None, str]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # event ids in the order routed
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)  # first accepted body
    rulesets: dict[str, Ruleset] = field(default_factory=dict)  # by digest
    sends: list[tuple[int, float]] = field(default_factory=list)  # (row id, at)
    delivered: dict[int, float] = field(default_factory=dict)  # row id -> marked at
    resolved_by: dict[tuple[str, int], str] = field(default_factory=dict)  # -> ruleset digest
    resolved_at: dict[tuple[str, int], float] = field(default_factory=dict)  # -> when
    # Failed sends (tests.sim.sends): row id -> when it failed; and in the order things
    # happened (a count, as two happen at one virtual instant), when it went dead, was
    # retried by an operator, and when each episode resolved.
    failed: dict[int, list[float]] = field(default_factory=dict)
    died: dict[int, list[int]] = field(default_factory=dict)
    revived: dict[int, list[int]] = field(default_factory=dict)
    resolved_seq: dict[tuple[str, int], int] = field(default_factory=dict)
    routed_seq: dict[str, int] = field(default_factory=dict)  # event id -> when routed
    seq: int = 0

    def tick(self) -> int:
        self.seq += 1
        return self.seq


class Run:
    """One scenario on one SQLite file; check(run) after every step raises a Violation."""

    def __init__(
        self, scenario: Scenario, db: Path, checker: Checker | None = None, url: str | None = None
    ) -> None:
        self.scenario = scenario
        self.db = db
        self.url = url  # a postgresql:// database to run on instead of the SQLite file db
        self.checker = checker
        self.now = scenario.start
        self.trace: list[str] = []
        self.seen = Seen()
        self.rulesets = [check(text) for text in scenario.rules]
        self.ruleset = self.rulesets[0]
        self._boundary: tuple[Ruleset, float, float | None] | None = None  # _next_boundary()
        self._remember(self.ruleset)
        self.store: SQLiteStore | None = None
        self.router: Router | None = None
        self.silences: list[int] = []
        self._pending: dict[str, tuple[str, str | None, int | None, str]] = {}
        self._crash_next_tx = False
        self._crash_in_send = False
        self._look_again: float | None = None
        self._reader: sqlite3.Connection | None = None
        self._pg: Any = None  # the PostgreSQL tier's reading connection (psycopg)
        self.step = 0
        self.fronts = Fronts(self)  # the front ends actions come through
        self.subscribers = Subscribers(self)  # webhook subscribers (tests.sim.subscribers)
        self.clock = lambda: self.now
        self.marks: dict[str, Any] = {}  # where an invariant stopped reading (tests.sim.filed)
        # What ran when: (time, "op" | "route" | "tick" | "deliver", op index), for another
        # store to run the same (tests.sim.agree).
        self.schedule: list[tuple[float, str, int]] = []

    # -- the store, the router, crashes ----------------------------------------------------

    def _remember(self, ruleset: Ruleset) -> None:
        self.seen.rulesets.setdefault(ruleset.digest, ruleset)

    async def open(self) -> None:
        if self.url is not None:  # the PostgreSQL tier (make sim PG=1)
            self.store = open_store(self.url, clock=lambda: self.now, pool_size=2)  # type: ignore[assignment]
        else:
            self.store = SQLiteStore(self.db, synchronous="off", clock=lambda: self.now)
        await self.store.open()
        original = self.store.transact

        async def transact(fn: Callable[[Any], Any]) -> Any:
            self._pending = {}

            def wrapped(tx: Any) -> Any:
                result = fn(tx)
                if self._crash_next_tx:
                    self._crash_next_tx = False
                    raise SimCrash("kill -9 before the commit")
                return result

            result = await original(wrapped)
            for event_id, seen in self._pending.items():  # committed: keep what it applied
                if event_id not in self.seen.transitions:
                    self.seen.order.append(event_id)
                    self.seen.routed_seq[event_id] = self.seen.tick()
                self.seen.transitions[event_id] = seen
                if seen[0] == "resolve" and seen[1] is not None and seen[2] is not None:
                    self.seen.resolved_by[(seen[1], seen[2])] = seen[3]
                    self.seen.resolved_at.setdefault((seen[1], seen[2]), self.now)
                    self.seen.resolved_seq.setdefault((seen[1], seen[2]), self.seen.tick())
            self._pending = {}
            return result

        self.store.transact = transact  # type: ignore[method-assign]
        self.router = Router(
            self.store,
            lambda: self.ruleset,
            metrics=Metrics(),
            on_routed=lambda: None,
            clock=lambda: self.now,
        )
        await self.subscribers.open()

    async def crash(self, why: str) -> None:
        """kill -9: what the Router and the worker kept in memory is gone; the file stays."""
        self.trace.append(f"{self.now - self.scenario.start:.3f} crash {why}")
        assert self.store is not None
        await self.store.close()
        self.store = self.router = None
        await self.open()

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
        if self._reader is not None:
            self._reader.close()
        if self._pg is not None:
            self._pg.close()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """A read of the file, for the invariants (the runner's own connection)."""
        if self.url is not None:
            return pg_query(self, sql, params)
        if self._reader is None:
            self._reader = sqlite3.connect(self.db)
        return self._reader.execute(sql, params).fetchall()

    # -- the steps -------------------------------------------------------------------------

    async def guarded(self, work: Callable[[], Any]) -> None:
        try:
            await work()
        except SimCrash as exc:
            await self.crash(f"in a transaction ({exc})")

    async def route(self) -> None:
        assert self.router is not None
        self.schedule.append((self.now, "route", 0))
        self.subscribers.news()  # health events stored since: accepted like any event
        for _ in range(100):
            routed = 0

            async def one() -> None:
                nonlocal routed
                assert self.router is not None
                routed = await self.router.route_pending()

            await self.guarded(one)
            if routed == 0 and not self._crash_next_tx:
                return

    async def tick(self) -> None:
        self.schedule.append((self.now, "tick", 0))

        async def one() -> None:
            assert self.router is not None
            await self.router.tick()

        await self.guarded(one)

    async def deliver(self) -> None:
        """The notify worker's part: every due row claimed under a lease and sent (recorded
        here), then marked delivered, claiming again while a claim finds rows (a row waits
        for the earlier ones of its alert to its target); "in-send" crashes before a mark."""
        assert self.store is not None
        self.schedule.append((self.now, "deliver", 0))
        for _ in range(5):
            await self._deliver_due()
            if not self.subscribers.news():
                return
            await self.route()  # a subscriber's health changed: its event is routed now

    async def _deliver_due(self) -> None:
        assert self.store is not None
        for _ in range(20):
            if not self.query("SELECT 1 FROM outbox WHERE state IN ('pending', 'held', 'sending')"):
                return  # nothing to claim: no store cycle
            rows = await self.store.outbox.claim_due(now=self.now, limit=1000, lease=LEASE)
            if not rows or not await self._send(rows):
                return

    async def _send(self, rows: list[OutboxRow]) -> bool:
        """Send claimed rows; False when a crash came in the middle."""
        assert self.store is not None
        for row in sorted(rows, key=lambda r: r.id):
            self.seen.sends.append((row.id, self.now))
            self.trace.append(
                f"{self.now - self.scenario.start:.3f} send #{row.id} {row.kind} {row.rule}"
                f" -> {row.notifier}[{row.target}] event={row.event_id}"
            )
            if self._crash_in_send:
                self._crash_in_send = False
                await self.crash("after a send, before its outcome was recorded")
                return False
            if row.kind == "webhook":
                self.trace.append(f"  subscriber: {await self.subscribers.send(row)}")
                continue
            how = sends.outcome(self, row)
            if how != "delivered":
                self.trace.append(f"  failed #{row.id} ({how}): {await sends.fail(self, row, how)}")
                continue
            await self.store.outbox.mark_delivered(
                row.id, now=self.now, attempt=Attempt(self.now, 0, 200)
            )
            self.seen.delivered.setdefault(row.id, self.now)
        return True

    async def settle(self) -> None:
        """Route what is waiting, run the timers due now, send what is due; the timers look
        again WAKE_EVERY later (what a source or silence that ended held is woken then)."""
        await self.route()
        await self.tick()
        await self.route()
        await self.deliver()
        self._look_again = self.now + WAKE_EVERY

    def next_due(self) -> float:
        """The next moment a timer or a send falls due after now, read from the file: a
        held or pending row, a lease that runs out, a repeat, an escalation step, a digest
        that closes, a silence that ends, quiet hours that end, a flap that settles (the
        router's own next step, as escalation steps are), a maintenance window's boundary,
        the heartbeat."""
        now = self.now
        (found,) = self.query(
            "SELECT min(t) FROM ("
            " SELECT min(next_at) AS t FROM outbox WHERE state IN ('pending', 'held')"
            "  AND next_at > ?"
            " UNION ALL SELECT min(lease_until) FROM outbox WHERE state = 'sending'"
            "  AND lease_until > ?"
            " UNION ALL SELECT min(next_repeat_at) FROM notices WHERE next_repeat_at > ?"
            " UNION ALL SELECT min(next_at) FROM escalations WHERE next_at > ?"
            " UNION ALL SELECT min(closes_at) FROM groups WHERE state = 'open' AND closes_at > ?"
            " UNION ALL SELECT min(ends_at) FROM silences WHERE expired_at IS NULL"
            "  AND ends_at > ?"
            " UNION ALL SELECT min(settle_at) FROM flaps WHERE settle_at > ?) AS due",
            (now,) * 7,
        )[0]
        due = math.inf if found is None else float(found)
        (late,) = self.query("SELECT min(next_at) FROM escalations WHERE next_at <= ?", (now,))[0]
        if late is not None:  # a step due now (a chain woken this turn): the router looks
            due = min(due, now + TIMERS_GAP)  # again TIMERS_GAP later (Router._timers_due_in)
        for (name,) in self.query(
            "SELECT rule FROM notices WHERE suppressed_since IS NOT NULL UNION SELECT rule"
            " FROM escalations WHERE suppressed_since IS NOT NULL AND next_at IS NULL"
        ):  # what waits may be muted: the router's timers (every IDLE_POLL) see that end
            rule = self.ruleset.by_name.get(name)
            if rule is not None and rule.active is not None:
                opens = rule.active.next_open(now)
                due = min(due, opens) if opens > now else due
        # A maintenance window's start or end: the router's timers wake then (its notices,
        # and what it held woken), as dispatch.maintenance.boundaries says.
        boundary = self._next_boundary(now)
        if boundary is not None:
            due = min(due, boundary)
        beat = self.ruleset.heartbeat
        if beat is not None:
            (last,) = self.query("SELECT max(received_at) FROM events")[0]
            at = (last or self.scenario.start) + beat.silent_for
            if at > now:
                due = min(due, at)
        return due

    def _next_boundary(self, now: float) -> float | None:
        """next_boundary() of the rules in force, worked out again only once the clock
        passed the last one found or the rules changed (it reads 8 days of each window)."""
        cached = self._boundary
        if cached is None or cached[0] is not self.ruleset or not (now < (cached[2] or 0.0)):
            found = next_boundary(self.ruleset.maintenance, now)
            cached = self._boundary = (self.ruleset, now, found)
        found = cached[2]
        return found if found is None or found > now else None

    async def advance(self, until: float) -> None:
        """Move the clock to until, the timers running at each moment one falls due on the
        way (and TICK_EVERY after the last look, as the idle router does, at most
        MAX_TICKS times a gap besides)."""
        idle = 0
        for _ in range(MAX_DUE):
            due = self.next_due()
            if self._look_again is not None:  # the router's next look after a turn
                due, self._look_again = min(due, self._look_again), None
            nxt = min(due, self.now + TICK_EVERY) if idle < MAX_TICKS else due
            if nxt > until:
                break
            idle += nxt < due
            # What falls due when an event arrives runs first (as receiver backtest does).
            self.now = nxt
            await self.tick()
            await self.deliver()
            if nxt == until:
                break
        self.now = max(self.now, until)

    async def apply(self, op: Op) -> None:
        self.trace.append(op.line())
        kind, data = op.kind, op.data
        assert self.store is not None
        if kind == "event":
            body = data["body"]
            event = receiver_events.validate(dict(body))
            raw = json.dumps(body, sort_keys=True).encode()
            outcome = await self.store.events.accept(event, raw)
            if outcome == "new":
                self.seen.bodies[body["id"]] = body
            self.trace.append(f"  accepted: {outcome}")
        elif kind == "silence":
            until = self.now + float(data["for"])
            matchers = data["match"]
            added = await self.store.silences.add(
                matchers, "sim", self.now, until, after=data.get("after")
            )
            sid = added.id
            self.silences.append(sid)
        elif kind == "unsilence":
            if self.silences:
                sid = self.silences[data["nth"] % len(self.silences)]
                await self.store.transact(lambda tx: tx.silences.expire(sid, self.now))
        elif kind == "reload":
            self.ruleset = self.rulesets[data["file"] % len(self.rulesets)]
            self._remember(self.ruleset)
        elif kind in ("ack", "resolve", "snooze"):
            before = await self.store.alerts.get(data["alert"])
            said = await self.fronts.act(kind, data)
            self.trace.append(f"  {kind} via {data.get('via', 'engine')}: {said}")
            after = await self.store.alerts.get(data["alert"])
            if before is not None and before.state == "open" and after is not None:
                if after.state == "resolved" and after.episode == before.episode:
                    self.seen.resolved_by[(after.id, after.episode)] = self.ruleset.digest
                    self.seen.resolved_at.setdefault((after.id, after.episode), self.now)
                    self.seen.resolved_seq.setdefault((after.id, after.episode), self.seen.tick())
        elif kind == "enable":
            self.trace.append(f"  {await self.subscribers.enable(int(data['hook']))}")
            self.subscribers.news()
        elif kind == "redeliver":
            self.trace.append(f"  retried {await sends.redeliver(self)} dead")
        elif kind == "crash":
            where = data["where"]
            if where == "between":
                await self.crash("between steps")
            elif where == "in-tx":
                self._crash_next_tx = True
            else:
                self._crash_in_send = True

    async def run(self) -> None:
        await self.open()
        try:
            for index, op in enumerate(self.scenario.ops):
                before = len(self.seen.order)
                await self.advance(self.scenario.start + op.at)
                self.schedule.append((self.now, "op", index))
                await self.apply(op)
                await self.settle()
                self._outcome_lines()
                self.step += 1
                if self.checker is not None:
                    await self.checker(self, False, self.seen.order[before:])
            await self.advance(self.now + WAKE_EVERY)  # the router's last look
            for _ in range(MAX_TICKS):  # and what it woke then, due at once
                if not self.query("SELECT 1 FROM escalations WHERE next_at <= ?", (self.now,)):
                    break
                await self.advance(self.now + TIMERS_GAP)
            if self.checker is not None:
                await self.checker(self, True, [])
        finally:
            await self.close()

    def _outcome_lines(self) -> None:
        rows = self.query(
            "SELECT id, event_id, rule, notifier, target, kind, state, alert, episode FROM outbox"
            " WHERE updated_at >= ? ORDER BY id",
            (self.now,),
        )
        for row in rows:
            self.trace.append("  row " + " ".join(str(v) for v in row))

    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()


@contextlib.contextmanager
def observed(run_of: Callable[[], Run | None]) -> Iterator[None]:
    """Record each transition routing applies (receiver.dispatch.alerts.apply, as the
    pipeline calls it), kept when its transaction commits."""
    real = pipeline.apply

    def apply(tx: Any, payload: Any, event_id: str, now: float) -> Transition:
        transition = real(tx, payload, event_id, now)
        current = run_of()
        if current is not None:
            alert = transition.alert
            current._pending[event_id] = (
                transition.what,
                None if alert is None else alert.id,
                None if alert is None else alert.episode,
                current.ruleset.digest,
            )
        return transition

    pipeline.apply = apply  # type: ignore[assignment]
    try:
        yield
    finally:
        pipeline.apply = real  # type: ignore[assignment]


def pg_query(run: Run, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """A read of the PostgreSQL tier's database (the invariants' SQL is written for both:
    `?` placeholders, no function only one of them has)."""
    if run._pg is None:
        import psycopg  # the PostgreSQL tier only

        run._pg = psycopg.connect(run.url or "", autocommit=True)
    return list(run._pg.execute(sql.replace("?", "%s"), params).fetchall())


def run_scenario(scenario: Scenario, checker: Checker | None = None, url: str | None = None) -> Run:
    """Run one scenario on a fresh SQLite file in a temporary directory (or, url, on that
    empty PostgreSQL database)."""
    with tempfile.TemporaryDirectory(prefix="sim-") as tmp:
        sim = Run(scenario, Path(tmp) / "sim.db", checker, url)
        with observed(lambda: sim), steady_ids():
            asyncio.run(sim.run())
    return sim
