"""The in-memory store's tables (receiver.store.memory: the Tx roles over them), and what a
backtest needs of them besides the Tx (tx.scratch, base.Scratch): a journal of every outbox
row written or changed, the notify worker's part, the events and alerts of one replay
shared by several rules files, and a lean mode that forgets what can no longer change."""

from __future__ import annotations

import heapq
import itertools
import json
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from receiver.store.flaps import Flap
from receiver.store.records import (
    SENT_STATES,
    Ack,
    Action,
    Alert,
    Chain,
    Group,
    Inhibitor,
    Notice,
    OutboxRow,
    Silence,
    StoredEvent,
)

# States a row can leave: the notify worker sends pending and (when due) held rows.
OPEN_STATES = ("pending", "held", "sending")


@dataclass(slots=True)
class Row:
    """One outbox row, as the SQL stores keep it (the columns the routing reads)."""

    id: int
    event_id: str
    rule: str
    notifier: str
    target: int
    title: str
    body: str
    state: str
    reason: str | None
    next_at: float
    created_at: float
    updated_at: float
    kind: str
    alert: str | None
    episode: int | None
    group_id: int | None
    replay: int | None
    delivery_id: str | None = None
    subscription_id: int | None = None
    trace: str | None = None
    channel: str = "notify"

    def record(self) -> OutboxRow:
        return OutboxRow(
            self.id, self.event_id, self.rule, self.notifier, self.target, self.title,
            self.body, self.state, 0, self.next_at, self.created_at, self.updated_at,
            self.reason, None, self.kind, self.replay, self.delivery_id, self.subscription_id,
            None, self.trace, self.channel,
        )  # fmt: skip


class Tables:
    """What the in-memory store keeps, shared by its roles (a savepoint copies it whole)."""

    def __init__(self, *, lean: bool = False) -> None:
        self.lean = lean
        self.events: dict[str, StoredEvent] = {}
        self.unrouted: dict[str, None] = {}  # ids in arrival order
        self.rows: dict[int, Row] = {}
        self.row_ids = itertools.count(1)
        self.due: list[tuple[float, int]] = []  # (next_at, row id) of open rows; may be stale
        self.held: dict[tuple[str, int], set[int]] = {}  # held event rows by alert episode
        self.digests: dict[int, set[int]] = {}  # held digest rows by group
        self.sent: dict[tuple[str, int], set[str]] = {}  # alert episode -> rules that sent
        self.journal: list[tuple[Row, str]] = []  # (row, its new state) since changes()
        self.alerts: dict[str, Alert] = {}
        self.notices: dict[tuple[str, int], dict[str, Notice]] = {}
        self.repeats: list[tuple[float, tuple[str, int, str]]] = []  # may be stale
        self.chains: dict[tuple[str, int, str], Chain] = {}  # (alert, episode, rule)
        self.inhibitors: dict[tuple[str, str, str], Inhibitor] = {}  # (rule, key, alert)
        self.chain_due: list[tuple[float, tuple[str, int, str]]] = []  # may be stale
        # (alert, episode, rule) -> (notifier, target) of its messages sent (escalations)
        self.paged: dict[tuple[str, int, str], set[tuple[str, int]]] = {}
        self.keyed: dict[tuple[str, int], set[str]] = {}  # episode -> rules in paged, chains
        self.throttle: dict[tuple[str, str], float] = {}
        self.storms: dict[str, tuple[float, int, int]] = {}  # rule -> (start, count, prev)
        self.flaps: dict[str, dict[str, Flap]] = {}  # alert -> rule -> its record
        self.settles: list[tuple[float, str, str]] = []  # (settle_at, alert, rule); may be stale
        self.maintenance: set[tuple[str, float, str]] = set()  # notices claimed (tx.maintenance)
        self.groups: dict[int, tuple[Group, str, float]] = {}  # id -> (group, state, opened)
        self.open_group: dict[tuple[str, str], int] = {}  # (rule, key) -> newest group id
        self.group_ids = itertools.count(1)
        self.silences: dict[int, Silence] = {}
        self.silence_ids = itertools.count(1)
        self.state: dict[str, str] = {}

    def set_state(self, row: Row, state: str, now: float, reason: str | None = None) -> None:
        """Move an outbox row to state, journaled (lean: forgotten once it cannot change)."""
        old = row.state
        row.state, row.updated_at = state, now
        if reason is not None:
            row.reason = reason
        if old == "held" and row.alert is not None and row.episode is not None:
            _discard(self.held, (row.alert, row.episode), row.id)
        if old == "held" and row.group_id is not None:
            _discard(self.digests, row.group_id, row.id)
        self.index_sent(row)
        self.journal.append((row, state))
        if self.lean and state not in OPEN_STATES:
            del self.rows[row.id]

    def index_sent(self, row: Row) -> None:
        if row.alert is None or row.episode is None or row.state not in SENT_STATES:
            return
        if row.kind == "event":
            self.sent.setdefault((row.alert, row.episode), set()).add(row.rule)
        if row.kind in ("event", "repeat", "escalation"):
            key = (row.alert, row.episode, row.rule)
            self.paged.setdefault(key, set()).add((row.notifier, row.target))
            self.keyed.setdefault(key[:2], set()).add(row.rule)

    def episode_over(self, alert: Alert) -> None:
        """The alert has opened a new episode: lean, forget what the lifecycle kept of the
        one before (nothing asks about it again)."""
        if self.lean:
            ended = (alert.id, alert.episode - 1)
            self.sent.pop(ended, None)
            self.notices.pop(ended, None)
            # By the episode's rules, not by a scan of every key (a week has millions).
            for rule in self.keyed.pop(ended, ()):
                self.paged.pop((*ended, rule), None)
                self.chains.pop((*ended, rule), None)

    def notice(self, key: tuple[str, int, str]) -> Notice | None:
        rules = self.notices.get(key[:2])
        return None if rules is None else rules.get(key[2])

    def next_repeat(self) -> float | None:
        """When the next repeat is due (acknowledgements aside: a scratch store has none)."""
        while self.repeats:
            at, key = self.repeats[0]
            notice = self.notice(key)
            if notice is not None and notice.next_repeat_at == at:
                return at
            heapq.heappop(self.repeats)
        return None

    def next_chain(self) -> float | None:
        """When the next escalation step is due."""
        while self.chain_due:
            at, key = self.chain_due[0]
            current = self.chains.get(key)
            if current is not None and current.next_at == at:
                return at
            heapq.heappop(self.chain_due)
        return None

    def next_due(self) -> float | None:
        """When the next row is due to be sent (pending or held)."""
        while self.due:
            at, row_id = self.due[0]
            row = self.rows.get(row_id)
            if row is not None and row.state in ("pending", "held") and row.next_at == at:
                return at
            heapq.heappop(self.due)
        return None

    def get_state(self, name: str) -> Any:
        value = self.state.get(name)
        return None if value is None else json.loads(value)

    def set_named(self, name: str, value: Any) -> None:
        self.state[name] = json.dumps(value)


def _discard(index: dict[Any, set[int]], key: Any, row_id: int) -> None:
    """Take a row out of an index, and the key with its last row."""
    rows = index.get(key)
    if rows is not None:
        rows.discard(row_id)
        if not rows:
            del index[key]


class MemoryScratch:
    """tx.scratch (base.Scratch): what a backtest needs of its store besides the Tx."""

    def __init__(self, t: Tables) -> None:
        self.tables = t

    def follow(self, leader: MemoryScratch) -> None:
        """Share leader's events and alerts: leader keeps them (put, mark_routed, apply()),
        and this store only reads them. A backtest replays one period through several
        rules files, and what an event does to its alert does not depend on the rules."""
        t, kept = self.tables, leader.tables
        t.events, t.unrouted, t.alerts = kept.events, kept.unrouted, kept.alerts

    def episode_over(self, alert: Alert) -> None:
        """The alert has opened a new episode: lean, forget what the lifecycle kept of the
        one before (nothing asks about it again). The backtest says so, for each rules file's
        store, as the event that opened it is placed."""
        self.tables.episode_over(alert)

    def answers(self, alert: Alert) -> bool:
        """Whether the episode's resolve has anything to answer (tx.outbox.cancel_held,
        tx.notices.of): held rows of it, or notices about it."""
        key = (alert.id, alert.episode)
        return key in self.tables.held or key in self.tables.notices

    def put(self, event: StoredEvent) -> bool:
        """Keep an event, unrouted; False if its id is kept already."""
        t = self.tables
        if event.id in t.events:
            return False
        t.events[event.id] = event
        t.unrouted[event.id] = None
        return True

    def forget_event(self, event_id: str) -> None:
        """Drop a routed event's body (a backtest keeps only those alerts still need)."""
        if event_id not in self.tables.unrouted:
            self.tables.events.pop(event_id, None)

    def waits_on(self, alert: Alert, event_id: str) -> bool:
        """Whether a notice of the alert's episode waits with event's notification, or the
        event has just started one of its waiting chains again (its pages are read from it)."""
        t, episode = self.tables, (alert.id, alert.episode)
        if any(n.suppressed_event == event_id for n in t.notices.get(episode, {}).values()):
            return True
        for rule in t.keyed.get(episode, ()):
            chain = t.chains.get((*episode, rule))
            if chain is not None and chain.log and chain.log[-1].get("eventId") == event_id:
                return True
        return False

    def changes(self) -> list[tuple[Row, str]]:
        """The rows written or changed since the last call, in order, each with the state it
        was given then (a row added and sent since is there twice: pending, delivered)."""
        journal, self.tables.journal = self.tables.journal, []
        return journal

    def next_chain(self) -> float | None:
        """When the next escalation step is due."""
        return self.tables.next_chain()

    def earliest(self) -> float:
        """No row, repeat or escalation step falls due before this (inf: none waits); the
        next_*() times are this or later (the heaps' stale entries are counted here)."""
        t = self.tables
        return min(
            t.due[0][0] if t.due else math.inf,
            t.repeats[0][0] if t.repeats else math.inf,
            t.chain_due[0][0] if t.chain_due else math.inf,
        )

    def chain(self, alert: str, episode: int, rule: str) -> Chain | None:
        """The escalation of the alert's episode by rule (its log says what it paged)."""
        return self.tables.chains.get((alert, episode, rule))

    def next_due(self) -> float | None:
        """When the next row is due to be sent (pending or held)."""
        return self.tables.next_due()

    def deliver_due(self, now: float) -> int:
        """The notify worker's part: every pending or held row due by now is delivered."""
        t = self.tables
        delivered = 0
        while (at := t.next_due()) is not None and at <= now:
            _, row_id = heapq.heappop(t.due)
            t.set_state(t.rows[row_id], "delivered", now)
            delivered += 1
        return delivered

    def next_repeat(self) -> float | None:
        """When the next repeat is due (acknowledgements aside: a scratch store has none)."""
        return self.tables.next_repeat()

    def rows(self) -> list[OutboxRow]:
        """The rows kept, newest first (lean: only those that can still change)."""
        return [row.record() for row in sorted(self.tables.rows.values(), key=lambda r: -r.id)]


class NoActions:
    """What tx.alerts and tx.outbox do for the action engine, which the memory store has
    not: the backtest acts on no alert."""

    def ack(self, alert_id: str, *, by: str, now: float) -> Ack | None:
        raise NotImplementedError("the memory store has no action engine")

    def snooze(self, alert_id: str, *, until: float) -> int | None:
        raise NotImplementedError("the memory store has no action engine")

    def record(self, action: Action) -> None:
        raise NotImplementedError("the memory store has no action engine")

    def updatable(
        self, alert: str, episode: int, channels: Collection[str]
    ) -> list[tuple[str, str, int, str]]:
        raise NotImplementedError("the memory store has no action engine")
