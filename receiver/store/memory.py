"""A scratch store in memory: the routing transaction's roles (base.Tx) over plain dicts, for
`receiver backtest`, which replays a week of events through the lifecycle on a virtual
clock and must change nothing in the real store.

Why not a scratch SQLite file: the pipeline costs about ten statements an event there, and
a backtest has to run millions of events while an operator waits. This keeps the same
contract (tests/store/contract/ runs the Tx roles' tests on it too), plus what a backtest
needs besides (tx.scratch, receiver.store.scratch: a journal of every outbox row written or
changed, the notify worker's part), and a lean mode that forgets rows that can no longer
change, so memory stays bounded by what is open.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from receiver.events import BaseEvent
from receiver.sessions import Fact
from receiver.store.maintenance import MemoryMaintenance
from receiver.store.memory_escalations import MemoryEscalations
from receiver.store.memory_flaps import MemoryFlaps
from receiver.store.memory_inhibitors import MemoryInhibitors
from receiver.store.memory_tables import OPEN_STATES, MemoryScratch, NoActions, Row, Tables
from receiver.store.records import (
    SENT_STATES,
    Alert,
    Group,
    Notice,
    Notification,
    OutboxRow,
    Replay,
    Silence,
    StoredEvent,
    Waiting,
    Webhook,
    row_channel,
    waiting_key,
)

__all__ = ["MemoryTx", "Row", "Tables"]


class MemoryEvents:
    """tx.events in memory."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def unrouted(self, limit: int, skip: Iterable[str] = ()) -> list[StoredEvent]:
        skipped = set(skip)
        found = [self.t.events[i] for i in self.t.unrouted if i not in skipped]
        return sorted(found, key=lambda e: e.received_at)[:limit]

    def keep_rules(self, digest: str, source: str, text: str, now: float) -> None:
        return None  # a backtest explains nothing later

    def mark_routed(self, event_ids: list[str], now: float, rules: str | None = None) -> int:
        marked = 0
        for event_id in event_ids:
            if event_id in self.t.unrouted:
                del self.t.unrouted[event_id]
                marked += 1
        return marked

    def body(self, event_id: str) -> str | None:
        event = self.t.events.get(event_id)
        return None if event is None else event.body

    def last_received(self) -> float | None:
        return max((e.received_at for e in self.t.events.values()), default=None)

    def replay_request(self, replay_id: int) -> Replay | None:
        return None  # an operator's replay is not part of the history a backtest replays

    def replay_done(self, replay_id: int, now: float) -> None:
        pass


class MemoryWebhooks:
    """tx.webhooks in memory: none (subscribers are not the rules': a backtest leaves them out)."""

    def active(self) -> list[Webhook]:
        return []

    def sides(
        self, webhook_ids: Iterable[int], session_ids: Iterable[str]
    ) -> dict[tuple[int, str], tuple[bool, str]]:
        return {}

    def save_sides(self, changed: Mapping[tuple[int, str], tuple[bool, str]]) -> None:
        pass


class MemorySessions:
    """tx.sessions in memory: the read API's projection is nothing a backtest reports."""

    def project(self, facts: Sequence[Fact]) -> None:
        pass


class MemoryOutbox(NoActions):
    """tx.outbox in memory: rows journaled as they are written or change."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def add(
        self,
        event_id: str,
        n: Notification,
        *,
        state: str,
        now: float,
        next_at: float | None = None,
        reason: str | None = None,
        kind: str = "event",
        alert: str | None = None,
        episode: int | None = None,
        group_id: int | None = None,
        replay: int | None = None,
    ) -> int:
        t = self.t
        row = Row(
            next(t.row_ids), event_id, n.rule, n.notifier, n.target, n.title, n.body,
            state, reason, now if next_at is None else next_at, now, now, kind, alert,
            episode, group_id, replay, n.delivery_id, n.subscription_id, n.trace, row_channel(n),
        )  # fmt: skip
        t.journal.append((row, state))
        if alert is not None and state in SENT_STATES:
            t.index_sent(row)
        if state not in OPEN_STATES and t.lean:
            return row.id
        t.rows[row.id] = row
        if state in ("pending", "held"):
            heapq.heappush(t.due, (row.next_at, row.id))
        if state == "held" and kind == "event" and alert is not None and episode is not None:
            t.held.setdefault((alert, episode), set()).add(row.id)
        if state == "held" and kind in ("digest", "storm") and group_id is not None:
            t.digests.setdefault(group_id, set()).add(row.id)
        return row.id

    def add_many(
        self, items: Sequence[tuple[str, Notification]], *, state: str, now: float, kind: str
    ) -> None:
        for event_id, n in items:
            self.add(event_id, n, state=state, now=now, kind=kind)

    def cancel_held(self, alert: str, episode: int, now: float, reason: str) -> int:
        held = self.t.held.pop((alert, episode), None)
        if not held:
            return 0
        for row_id in sorted(held):
            self.t.set_state(self.t.rows[row_id], "cancelled", now, reason)
        return len(held)

    def sent(self, alert: str, episode: int, rule: str) -> bool:
        return rule in self.t.sent.get((alert, episode), ())


class MemoryAlerts(NoActions):
    """tx.alerts in memory: every alert is in memory already, so nothing is read ahead."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def get(self, alert_id: str) -> Alert | None:
        return self.t.alerts.get(alert_id)

    def peek(self, alert_id: str) -> Alert | None:
        return self.t.alerts.get(alert_id)

    def save(self, alert: Alert, now: float) -> None:
        # Lean, the backtest says when an episode is over (tx.scratch.episode_over).
        self.t.alerts[alert.id] = alert

    def read_ahead(self, alert_ids: Iterable[str]) -> None:
        pass

    def flush(self) -> None:
        pass

    def forget(self) -> None:
        pass

    def list_open(self, limit: int = 1000) -> list[Alert]:
        found = [replace(a) for a in self.t.alerts.values() if a.state == "open"]
        return sorted(found, key=lambda a: a.opened_ts or "")[:limit]


class MemoryNotices:
    """tx.notices in memory (acknowledgements aside: a scratch store has none)."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def add(self, alert: str, episode: int, rule: str, now: float, repeat: float | None) -> None:
        rules = self.t.notices.setdefault((alert, episode), {})
        if rule in rules and rules[rule].suppressed_since is None:
            return
        at = None if repeat is None else now + repeat
        rules[rule] = Notice(alert, episode, rule, now, at, 0)
        if at is not None:
            heapq.heappush(self.t.repeats, (at, (alert, episode, rule)))

    def of(self, alert: str, episode: int) -> list[Notice]:
        rules = self.t.notices.get((alert, episode))
        return [] if rules is None else list(rules.values())

    def end_repeats(self, alert: str, episode: int) -> None:
        rules = self.t.notices.get((alert, episode))
        if rules is None:
            return
        for rule, notice in rules.items():
            if notice.next_repeat_at is not None:  # else it is the same already
                rules[rule] = replace(notice, next_repeat_at=None)

    def due(self, now: float, limit: int = 100) -> list[Notice]:
        due: list[tuple[float, tuple[str, int, str]]] = []
        while len(due) < limit and (at := self.t.next_repeat()) is not None and at <= now:
            due.append(heapq.heappop(self.t.repeats))
        for entry in due:  # a read: they stay due until repeated()
            heapq.heappush(self.t.repeats, entry)
        return [n for _, key in due if (n := self.t.notice(key)) is not None]

    def suppress(
        self, alert: str, episode: int, rule: str, now: float, why: str, event: str | None = None
    ) -> None:
        rules = self.t.notices.setdefault((alert, episode), {})
        if rule not in rules:
            rules[rule] = Notice(alert, episode, rule, now, None, 0, now, why, event)

    def suppressed(self, after: Waiting | None, limit: int = 200) -> list[Notice]:
        waiting = sorted(
            (n for rules in self.t.notices.values() for n in rules.values() if n.suppressed_since),
            key=waiting_key,
        )
        if after is not None:
            waiting = [n for n in waiting if waiting_key(n) > after]
        return waiting[:limit]

    def woke(self, notice: Notice, now: float, repeat: float | None) -> None:
        rules = self.t.notices.get((notice.alert, notice.episode), {})
        at = None if repeat is None else now + repeat
        rules[notice.rule] = replace(
            notice,
            notified_at=now,
            next_repeat_at=at,
            suppressed_since=None,
            suppressed_why=None,
            suppressed_event=None,
        )
        if at is not None:
            heapq.heappush(self.t.repeats, (at, (notice.alert, notice.episode, notice.rule)))

    def repeated(self, notice: Notice, next_at: float | None) -> None:
        key = (notice.alert, notice.episode, notice.rule)
        current = self.t.notice(key)
        if current is None:
            return
        self.t.notices[(notice.alert, notice.episode)][notice.rule] = replace(
            current, next_repeat_at=next_at, repeats=current.repeats + 1
        )
        if next_at is not None:
            heapq.heappush(self.t.repeats, (next_at, key))


class MemoryDigests:
    """tx.digests in memory."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def find_open(self, rule: str, key: str, now: float) -> Group | None:
        group_id = self.t.open_group.get((rule, key))
        if group_id is None:
            return None
        group, state, _ = self.t.groups[group_id]
        if state != "open" or group.closes_at <= now:
            return None
        return group  # not copied: the pipeline makes a new members list to update it

    def new(self, rule: str, key: str, now: float, closes_at: float) -> Group:
        t = self.t
        group = Group(next(t.group_ids), rule, key, closes_at, 0, [])
        previous = t.open_group.get((rule, key))
        if t.lean and previous is not None:  # closed (else no new one): asked no more
            del t.groups[previous]
        t.groups[group.id] = (group, "open", now)
        t.open_group[(rule, key)] = group.id
        return group

    def update(self, group: Group, *, title: str, body: str, now: float, release: bool) -> None:
        t = self.t
        stored, _, opened = t.groups[group.id]
        kept = group  # lean (a backtest's): made for this by digests.join, kept as it is
        if not t.lean:
            kept = Group(
                stored.id, stored.rule, stored.key, stored.closes_at, group.count, group.members
            )
        t.groups[group.id] = (kept, "sent" if release else "open", opened)
        for row_id in sorted(t.digests.get(group.id, ())):
            row = t.rows[row_id]
            row.title, row.body, row.updated_at = title, body, now
            if release:
                row.next_at = now
                heapq.heappush(t.due, (now, row_id))


class MemoryThrottle:
    """tx.throttle in memory."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def throttled(self, rule: str, key: str, now: float, every: float) -> bool:
        until = self.t.throttle.get((rule, key))
        if until is not None and until > now:
            return True
        self.t.throttle[(rule, key)] = now + every
        return False


class MemoryStorms:
    """tx.storms in memory."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def count(self, rule: str, now: float, per: float) -> tuple[float, int, int]:
        start, count, prev = self.t.storms.get(rule, (now, 0, 0))
        if start + per <= now:
            start, count, prev = now, 0, count if now < start + 2 * per else 0
        self.t.storms[rule] = (start, count + 1, prev)
        return start, count + 1, prev


class MemorySilences:
    """tx.silences in memory."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def active(self, now: float) -> list[Silence]:
        return [
            s
            for s in self.t.silences.values()
            if s.expired_at is None and s.starts_at <= now < s.ends_at
        ]

    def add(
        self, matchers: dict[str, Any], reason: str, now: float, until: float, *,
        after: float | None = None, alerts: tuple[str, ...] = (),
    ) -> int:  # fmt: skip
        silence_id = next(self.t.silence_ids)
        self.t.silences[silence_id] = Silence(
            silence_id, dict(matchers), reason, now, until, None, now, after, tuple(alerts)
        )
        return silence_id

    def expire(self, silence_id: int, now: float) -> bool:
        silence = self.t.silences.get(silence_id)
        if silence is None or silence.expired_at is not None or silence.ends_at <= now:
            return False
        self.t.silences[silence_id] = replace(silence, expired_at=now, ends_at=now)
        return True

    def get(self, silence_id: int) -> Silence | None:
        return self.t.silences.get(silence_id)

    def recent(self, limit: int = 100) -> list[Silence]:
        return sorted(self.t.silences.values(), key=lambda s: -s.id)[:limit]


class MemoryState:
    """tx.state in memory, kept as the SQL stores keep it: JSON text."""

    def __init__(self, t: Tables) -> None:
        self.t = t

    def get(self, name: str) -> Any:
        return self.t.get_state(name)

    def set(self, name: str, value: Any) -> None:
        self.t.set_named(name, value)


class MemoryTx:
    """The Tx protocol (receiver.store.base) in memory; one writer, no other process.

    lean: rows whose state can no longer change (sent, cancelled, suppressed) leave memory
    once journaled; what the lifecycle asks later of them (outbox.sent()) is kept in an index.
    """

    def __init__(self, *, lean: bool = False) -> None:
        self.tables = t = Tables(lean=lean)
        self.events = MemoryEvents(t)
        self.webhooks = MemoryWebhooks()
        self.sessions = MemorySessions()
        self.outbox = MemoryOutbox(t)
        self.alerts = MemoryAlerts(t)
        self.notices = MemoryNotices(t)
        self.escalations = MemoryEscalations(t)
        self.inhibitors = MemoryInhibitors(t)
        self.digests = MemoryDigests(t)
        self.throttle = MemoryThrottle(t)
        self.storms = MemoryStorms(t)
        self.flaps = MemoryFlaps(t)
        self.maintenance = MemoryMaintenance(t)
        self.silences = MemorySilences(t)
        self.state = MemoryState(t)
        self.scratch = MemoryScratch(t)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """Undo what the block wrote if it raises: a copy of every table, taken first. Lean
        (a backtest's replay), no copy is taken and nothing is undone: the timers enter a
        savepoint for every escalation step, and a copy of a week's store at each made a
        backtest with an escalation rule take hours. A block that fails there (a bug) is
        counted as the server counts it, and what it wrote before failing stays."""
        if self.tables.lean:
            yield
            return
        saved = {k: v for k, v in vars(self.tables).items() if not isinstance(v, itertools.count)}
        saved = copy.deepcopy(saved)
        try:
            yield
        except BaseException:
            vars(self.tables).update(saved)
            raise

    def try_lock(self, name: str) -> bool:
        return True


class MemoryEventsStore:
    """The part of store.events the Tx roles' contract tests need: accept, into the Tx's
    tables (the backtest puts events with tx.scratch.put)."""

    def __init__(self, tx: MemoryTx, clock: Any) -> None:
        self.tx = tx
        self.clock = clock

    async def accept(self, event: BaseEvent, raw: bytes, trace: str | None = None) -> str:
        now = self.clock() if self.clock is not None else 0.0
        body = raw.decode("utf-8")
        if self.tx.scratch.put(StoredEvent(event.id, event.type, body, now, trace=trace)):
            return "new"
        return "duplicate" if self.tx.events.body(event.id) == body else "conflict"


class MemoryOutboxStore:
    """The part of store.outbox the Tx roles' contract tests read: the rows kept."""

    def __init__(self, tx: MemoryTx) -> None:
        self.tx = tx

    async def deliveries(
        self, *, state: str | None = None, event_id: str | None = None, limit: int = 50
    ) -> list[OutboxRow]:
        rows = self.tx.scratch.rows()
        rows = [r for r in rows if state in (None, r.state) and event_id in (None, r.event_id)]
        return rows[:limit]


class MemoryStore:
    """The few Store parts the Tx roles' contract tests use, over one MemoryTx: so those
    tests hold the in-memory Tx to the same contract as SQLite and PostgreSQL."""

    def __init__(self, *, clock: Any = None) -> None:
        self.tx = MemoryTx()
        self.events = MemoryEventsStore(self.tx, clock)
        self.outbox = MemoryOutboxStore(self.tx)

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def transact(self, fn: Any) -> Any:
        """fn(tx): all of its writes kept, or none if it raises."""
        with self.tx.savepoint():
            return fn(self.tx)
