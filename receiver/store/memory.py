"""A scratch store in memory: the routing transaction (base.Tx) over plain dicts, for
`receiver backtest`, which replays a week of events through the lifecycle on a virtual
clock and must change nothing in the real store.

Why not a scratch SQLite file: the pipeline costs about ten statements an event there, and
a backtest has to run millions of events while an operator waits. This keeps the same
contract (tests/store/test_store_contract.py runs its routing-transaction tests on it too), plus
what a backtest needs besides: a journal of every outbox row written or changed, the
notify worker's part (deliver_due: a due row is sent at its time), and a lean mode that
forgets rows that can no longer change, so memory stays bounded by what is open.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from receiver.events import _Event as Event
from receiver.sessions import Fact
from receiver.store.records import (
    SENT_STATES,
    Alert,
    Group,
    Notice,
    Notification,
    OutboxRow,
    Silence,
    StoredEvent,
    Webhook,
)

# States a row can leave: the notify worker sends pending and (when due) held rows.
_OPEN_STATES = ("pending", "held", "sending")


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

    def record(self) -> OutboxRow:
        return OutboxRow(
            self.id, self.event_id, self.rule, self.notifier, self.target, self.title,
            self.body, self.state, 0, self.next_at, self.created_at, self.updated_at,
            self.reason, None, self.kind, self.replay,
        )  # fmt: skip


class MemoryTx:
    """The Tx protocol (receiver.store.base) in memory; one writer, no other process.

    lean: rows whose state can no longer change (sent, cancelled, suppressed) leave memory
    once journaled; what the lifecycle asks later of them (sent()) is kept in an index.
    """

    def __init__(self, *, lean: bool = False) -> None:
        self.lean = lean
        self._events: dict[str, StoredEvent] = {}
        self._unrouted: dict[str, None] = {}  # ids in arrival order
        self._rows: dict[int, Row] = {}
        self._row_ids = itertools.count(1)
        self._due: list[tuple[float, int]] = []  # (next_at, row id) of open rows; may be stale
        self._held: dict[tuple[str, int], set[int]] = {}  # held event rows by alert episode
        self._digests: dict[int, set[int]] = {}  # held digest rows by group
        self._sent: dict[tuple[str, int], set[str]] = {}  # alert episode -> rules that sent
        self._journal: list[tuple[Row, str]] = []  # (row, its new state) since changes()
        self._alerts: dict[str, Alert] = {}
        self._notices: dict[tuple[str, int], dict[str, Notice]] = {}
        self._repeats: list[tuple[float, tuple[str, int, str]]] = []  # may be stale
        self._throttle: dict[tuple[str, str], float] = {}
        self._groups: dict[int, tuple[Group, str, float]] = {}  # id -> (group, state, opened)
        self._open_group: dict[tuple[str, str], int] = {}  # (rule, key) -> newest group id
        self._group_ids = itertools.count(1)
        self._silences: dict[int, Silence] = {}
        self._silence_ids = itertools.count(1)
        self._state: dict[str, str] = {}

    # -- what a backtest needs besides the Tx ------------------------------------------------

    def follow(self, leader: MemoryTx) -> None:
        """Share leader's events and alerts: leader keeps them (put, mark_routed, apply()),
        and this store only reads them. A backtest replays one period through several
        rules files, and what an event does to its alert does not depend on the rules."""
        self._events, self._unrouted, self._alerts = (
            leader._events,
            leader._unrouted,
            leader._alerts,
        )

    def episode_over(self, alert: Alert) -> None:
        """The alert has opened a new episode: lean, forget what the lifecycle kept of the
        one before (nothing asks about it again). save_alert() does this for the leader."""
        if self.lean:
            ended = (alert.id, alert.episode - 1)
            self._sent.pop(ended, None)
            self._notices.pop(ended, None)

    def put(self, event: StoredEvent) -> bool:
        """Keep an event, unrouted; False if its id is kept already."""
        if event.id in self._events:
            return False
        self._events[event.id] = event
        self._unrouted[event.id] = None
        return True

    def forget_event(self, event_id: str) -> None:
        """Drop a routed event's body (a backtest keeps only those alerts still need)."""
        if event_id not in self._unrouted:
            self._events.pop(event_id, None)

    @property
    def changed(self) -> bool:
        """Whether changes() has anything to say."""
        return bool(self._journal)

    def changes(self) -> list[tuple[Row, str]]:
        """The rows written or changed since the last call, in order, each with the state it
        was given then (a row added and sent since is there twice: pending, delivered)."""
        journal, self._journal = self._journal, []
        return journal

    def next_due(self) -> float | None:
        """When the next row is due to be sent (pending or held)."""
        while self._due:
            at, row_id = self._due[0]
            row = self._rows.get(row_id)
            if row is not None and row.state in ("pending", "held") and row.next_at == at:
                return at
            heapq.heappop(self._due)
        return None

    def deliver_due(self, now: float) -> int:
        """The notify worker's part: every pending or held row due by now is delivered."""
        delivered = 0
        while (at := self.next_due()) is not None and at <= now:
            _, row_id = heapq.heappop(self._due)
            self._set_state(self._rows[row_id], "delivered", now)
            delivered += 1
        return delivered

    def next_repeat(self) -> float | None:
        """When the next repeat is due (acknowledgements aside: a scratch store has none)."""
        while self._repeats:
            at, key = self._repeats[0]
            notice = self._notice(key)
            if notice is not None and notice.next_repeat_at == at:
                return at
            heapq.heappop(self._repeats)
        return None

    def rows(self) -> list[OutboxRow]:
        """The rows kept, newest first (lean: only those that can still change)."""
        return [row.record() for row in sorted(self._rows.values(), key=lambda r: -r.id)]

    def _set_state(self, row: Row, state: str, now: float, reason: str | None = None) -> None:
        old = row.state
        row.state, row.updated_at = state, now
        if reason is not None:
            row.reason = reason
        if old == "held" and row.alert is not None and row.episode is not None:
            _discard(self._held, (row.alert, row.episode), row.id)
        if old == "held" and row.group_id is not None:
            _discard(self._digests, row.group_id, row.id)
        self._index_sent(row)
        self._journal.append((row, state))
        if self.lean and state not in _OPEN_STATES:
            del self._rows[row.id]

    def _index_sent(self, row: Row) -> None:
        if (
            row.kind == "event"
            and row.alert is not None
            and row.episode is not None
            and row.state in SENT_STATES
        ):
            self._sent.setdefault((row.alert, row.episode), set()).add(row.rule)

    # -- the Tx protocol ----------------------------------------------------------------------

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        saved = self._snapshot()
        try:
            yield
        except BaseException:
            self._restore(saved)
            raise

    def _snapshot(self) -> dict[str, Any]:
        state = {k: v for k, v in vars(self).items() if not isinstance(v, itertools.count)}
        return copy.deepcopy(state)

    def _restore(self, saved: dict[str, Any]) -> None:
        vars(self).update(saved)

    def try_lock(self, name: str) -> bool:
        return True

    def unrouted(self, limit: int, skip: Iterable[str] = ()) -> list[StoredEvent]:
        skipped = set(skip)
        found = [self._events[i] for i in self._unrouted if i not in skipped]
        return sorted(found, key=lambda e: e.received_at)[:limit]

    def mark_routed(self, event_ids: list[str], now: float) -> int:
        marked = 0
        for event_id in event_ids:
            if event_id in self._unrouted:
                del self._unrouted[event_id]
                marked += 1
        return marked

    def subscriptions(self) -> list[Webhook]:
        return []  # webhook subscribers are not the rules': a backtest leaves them out

    def sides(
        self, webhook_ids: Iterable[int], session_ids: Iterable[str]
    ) -> dict[tuple[int, str], tuple[bool, str]]:
        return {}

    def save_sides(self, changed: Mapping[tuple[int, str], tuple[bool, str]]) -> None:
        pass

    def project(self, facts: Sequence[Fact]) -> None:
        pass  # the read API's projection: nothing a backtest reports

    def event_body(self, event_id: str) -> str | None:
        event = self._events.get(event_id)
        return None if event is None else event.body

    def replay_request(self, replay_id: int) -> None:
        return None  # an operator's replay is not part of the history a backtest replays

    def replay_done(self, replay_id: int, now: float) -> None:
        pass

    def last_received(self) -> float | None:
        return max((e.received_at for e in self._events.values()), default=None)

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
        row = Row(
            next(self._row_ids), event_id, n.rule, n.notifier, n.target, n.title, n.body,
            state, reason, now if next_at is None else next_at, now, now, kind, alert,
            episode, group_id, replay,
        )  # fmt: skip
        self._journal.append((row, state))
        self._index_sent(row)
        if state not in _OPEN_STATES and self.lean:
            return row.id
        self._rows[row.id] = row
        if state in ("pending", "held"):
            heapq.heappush(self._due, (row.next_at, row.id))
        if state == "held" and kind == "event" and alert is not None and episode is not None:
            self._held.setdefault((alert, episode), set()).add(row.id)
        if state == "held" and kind == "digest" and group_id is not None:
            self._digests.setdefault(group_id, set()).add(row.id)
        return row.id

    def add_many(
        self, items: Sequence[tuple[str, Notification]], *, state: str, now: float, kind: str
    ) -> None:
        for event_id, n in items:
            self.add(event_id, n, state=state, now=now, kind=kind)

    def throttled(self, rule: str, key: str, now: float, every: float) -> bool:
        until = self._throttle.get((rule, key))
        if until is not None and until > now:
            return True
        self._throttle[(rule, key)] = now + every
        return False

    def cancel_held(self, alert: str, episode: int, now: float, reason: str) -> int:
        held = self._held.pop((alert, episode), set())
        for row_id in sorted(held):
            self._set_state(self._rows[row_id], "cancelled", now, reason)
        return len(held)

    def sent(self, alert: str, episode: int, rule: str) -> bool:
        return rule in self._sent.get((alert, episode), ())

    def alert(self, alert_id: str) -> Alert | None:
        return self._alerts.get(alert_id)

    def save_alert(self, alert: Alert, now: float) -> None:
        self._alerts[alert.id] = alert
        self.episode_over(alert)

    def read_alerts(self, alert_ids: Iterable[str]) -> None:
        pass  # every alert is in memory already

    def write_alerts(self) -> None:
        pass

    def forget_alerts(self) -> None:
        pass

    def open_alerts(self, limit: int = 1000) -> list[Alert]:
        found = [replace(a) for a in self._alerts.values() if a.state == "open"]
        return sorted(found, key=lambda a: a.opened_ts or "")[:limit]

    def add_notice(
        self, alert: str, episode: int, rule: str, now: float, repeat: float | None
    ) -> None:
        rules = self._notices.setdefault((alert, episode), {})
        if rule in rules:
            return
        at = None if repeat is None else now + repeat
        rules[rule] = Notice(alert, episode, rule, now, at, 0)
        if at is not None:
            heapq.heappush(self._repeats, (at, (alert, episode, rule)))

    def notices(self, alert: str, episode: int) -> list[Notice]:
        return list(self._notices.get((alert, episode), {}).values())

    def end_repeats(self, alert: str, episode: int) -> None:
        rules = self._notices.get((alert, episode), {})
        for rule, notice in rules.items():
            rules[rule] = replace(notice, next_repeat_at=None)

    def _notice(self, key: tuple[str, int, str]) -> Notice | None:
        return self._notices.get((key[0], key[1]), {}).get(key[2])

    def due_repeats(self, now: float, limit: int = 100) -> list[Notice]:
        due: list[tuple[float, tuple[str, int, str]]] = []
        while len(due) < limit and (at := self.next_repeat()) is not None and at <= now:
            due.append(heapq.heappop(self._repeats))
        for entry in due:  # a read: they stay due until repeated()
            heapq.heappush(self._repeats, entry)
        return [n for _, key in due if (n := self._notice(key)) is not None]

    def repeated(self, notice: Notice, next_at: float | None) -> None:
        current = self._notice((notice.alert, notice.episode, notice.rule))
        if current is None:
            return
        self._notices[(notice.alert, notice.episode)][notice.rule] = replace(
            current, next_repeat_at=next_at, repeats=current.repeats + 1
        )
        if next_at is not None:
            heapq.heappush(self._repeats, (next_at, (notice.alert, notice.episode, notice.rule)))

    def open_group(self, rule: str, key: str, now: float) -> Group | None:
        group_id = self._open_group.get((rule, key))
        if group_id is None:
            return None
        group, state, _ = self._groups[group_id]
        if state != "open" or group.closes_at <= now:
            return None
        return group  # not copied: the pipeline makes a new members list to update it

    def new_group(self, rule: str, key: str, now: float, closes_at: float) -> Group:
        group = Group(next(self._group_ids), rule, key, closes_at, 0, [])
        previous = self._open_group.get((rule, key))
        if self.lean and previous is not None:  # closed (else no new one): asked no more
            del self._groups[previous]
        self._groups[group.id] = (group, "open", now)
        self._open_group[(rule, key)] = group.id
        return group

    def update_group(
        self, group: Group, *, title: str, body: str, now: float, release: bool
    ) -> None:
        stored, _, opened = self._groups[group.id]
        kept = Group(
            stored.id, stored.rule, stored.key, stored.closes_at, group.count, group.members
        )
        self._groups[group.id] = (kept, "sent" if release else "open", opened)
        for row_id in sorted(self._digests.get(group.id, ())):
            row = self._rows[row_id]
            row.title, row.body, row.updated_at = title, body, now
            if release:
                row.next_at = now
                heapq.heappush(self._due, (now, row_id))

    def silences(self, now: float) -> list[Silence]:
        return [
            s
            for s in self._silences.values()
            if s.expired_at is None and s.starts_at <= now < s.ends_at
        ]

    def add_silence(self, matchers: dict[str, Any], reason: str, now: float, until: float) -> int:
        silence_id = next(self._silence_ids)
        self._silences[silence_id] = Silence(
            silence_id, dict(matchers), reason, now, until, None, now
        )
        return silence_id

    def expire_silence(self, silence_id: int, now: float) -> bool:
        silence = self._silences.get(silence_id)
        if silence is None or silence.expired_at is not None or silence.ends_at <= now:
            return False
        self._silences[silence_id] = replace(silence, expired_at=now, ends_at=now)
        return True

    def all_silences(self, limit: int = 100) -> list[Silence]:
        return sorted(self._silences.values(), key=lambda s: -s.id)[:limit]

    def get_state(self, name: str) -> Any:
        value = self._state.get(name)
        return None if value is None else json.loads(value)

    def set_state(self, name: str, value: Any) -> None:
        self._state[name] = json.dumps(value)  # kept as the SQL stores keep it: JSON text


def _discard(index: dict[Any, set[int]], key: Any, row_id: int) -> None:
    """Take a row out of an index, and the key with its last row."""
    rows = index.get(key)
    if rows is not None:
        rows.discard(row_id)
        if not rows:
            del index[key]


class MemoryStore:
    """The few Store methods the routing-transaction contract tests use, over one MemoryTx:
    so those tests hold the in-memory Tx to the same contract as SQLite and PostgreSQL."""

    def __init__(self, *, clock: Any = None) -> None:
        self.tx = MemoryTx()
        self.clock = clock

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def accept(self, event: Event, raw: bytes) -> str:
        now = self.clock() if self.clock is not None else 0.0
        body = raw.decode("utf-8")
        if self.tx.put(StoredEvent(event.id, event.type, body, now)):
            return "new"
        return "duplicate" if self.tx.event_body(event.id) == body else "conflict"

    async def transact(self, fn: Any) -> Any:
        """fn(tx): all of its writes kept, or none if it raises."""
        with self.tx.savepoint():
            return fn(self.tx)

    async def deliveries(
        self, *, state: str | None = None, event_id: str | None = None, limit: int = 50
    ) -> list[OutboxRow]:
        rows = self.tx.rows()
        rows = [r for r in rows if state in (None, r.state) and event_id in (None, r.event_id)]
        return rows[:limit]
