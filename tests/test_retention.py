"""Retention: what is pruned, what is kept, and a pruned id is new again; real SQLite files."""

import asyncio
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from receiver.cli import cli
from receiver.metrics import Metrics
from receiver.retention import Pruner
from receiver.settings import Settings
from receiver.store import Notification, SQLiteStore
from receiver.store.sqlite.tx import SQLiteTx
from tests.store.contract.common import event

DAY = 86400.0
T0 = 1_800_000_000.0  # received_at of the old events


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def seed(store: SQLiteStore, clock: Clock, ids: range, *, routed: bool = True) -> None:
    for i in ids:
        assert await store.events.accept(*event(i)) == "new"
    if routed:

        def mark(tx: SQLiteTx) -> None:
            tx.events.mark_routed([f"evt_{i}" for i in ids], clock.now)

        await store.transact(mark)


def notify(tx: SQLiteTx, event_id: str, state: str, now: float) -> None:
    tx.outbox.add(event_id, Notification("r", "ops", 0, "t", "b"), state=state, now=now)


def rows(db: Path, sql: str) -> list[Any]:
    with sqlite3.connect(db) as conn:
        return [r[0] if len(r) == 1 else r for r in conn.execute(sql)]


def run_store(db: Path, clock: Clock, body: Any) -> Any:
    async def main() -> Any:
        store = SQLiteStore(db, clock=clock)
        await store.open()
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(main())


def test_prunes_old_events_and_finished_notifications_keeps_the_rest(tmp_path: Path) -> None:
    db, clock = tmp_path / "r.db", Clock(T0)
    metrics = Metrics()

    async def go(store: SQLiteStore) -> Counter[str]:
        await seed(store, clock, range(0, 7))  # old, routed
        await seed(store, clock, range(7, 8), routed=False)  # old, never routed
        states = ["delivered", "dead", "throttled", "pending", "held", "sending"]
        await store.transact(
            lambda tx: [notify(tx, f"evt_{i}", s, clock.now) for i, s in enumerate(states)]
        )
        await store.events.quarantine(b"{}", reason="invalid_event: x", client=None, event_id=None)
        clock.now = T0 + 20 * DAY
        await seed(store, clock, range(100, 103))  # young
        await store.transact(lambda tx: notify(tx, "evt_100", "delivered", clock.now))
        await store.events.quarantine(b"[]", reason="invalid_json: x", client=None, event_id=None)
        clock.now = T0 + 31 * DAY
        pruner = Pruner(store, retention=30 * DAY, metrics=metrics, clock=clock, batch=2, pause=0)
        return await pruner.prune()

    totals = run_store(db, clock, go)
    # evt_3..5 keep their unsent notifications, but the events themselves are past retention.
    assert totals == Counter(events=7, outbox=3, quarantine=1)
    assert rows(db, "SELECT id FROM events ORDER BY rowid") == [
        "evt_7",
        "evt_100",
        "evt_101",
        "evt_102",
    ]
    assert rows(db, "SELECT event_id, state FROM outbox ORDER BY id") == [
        ("evt_3", "pending"),
        ("evt_4", "held"),
        ("evt_5", "sending"),
        ("evt_100", "delivered"),
    ]
    assert rows(db, "SELECT body FROM quarantine") == [b"[]"]
    assert metrics.pruned["events"]._value.get() == 7
    assert metrics.pruned["outbox"]._value.get() == 3


def test_pruned_id_is_accepted_again_as_new(tmp_path: Path) -> None:
    db, clock = tmp_path / "r.db", Clock(T0)

    async def go(store: SQLiteStore) -> list[str]:
        await seed(store, clock, range(1, 2))
        before = await store.events.accept(*event(1))
        clock.now = T0 + 31 * DAY
        await Pruner(store, retention=30 * DAY, metrics=Metrics(), clock=clock).prune()
        return [before, await store.events.accept(*event(1)), await store.events.accept(*event(1))]

    assert run_store(db, clock, go) == ["duplicate", "new", "duplicate"]


def test_nothing_old_enough_prunes_nothing(tmp_path: Path) -> None:
    db, clock = tmp_path / "r.db", Clock(T0)

    async def go(store: SQLiteStore) -> Counter[str]:
        await seed(store, clock, range(5))
        clock.now = T0 + 29 * DAY
        return await Pruner(store, retention=30 * DAY, metrics=Metrics(), clock=clock).prune()

    assert run_store(db, clock, go) == Counter()
    assert len(rows(db, "SELECT id FROM events")) == 5


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("10h", "at least 10h36m", id="shorter-than-retry-span"),
        pytest.param("7d", "longer than the max event age", id="not-longer-than-max-event-age"),
    ],
)
def test_retention_shorter_than_the_sender_needs_is_refused(value: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(retention=value)


def test_retention_setting_parses_durations() -> None:
    assert Settings().retention == 30 * DAY
    assert Settings(retention="11h", max_event_age=0).retention == 11 * 3600


def test_serve_refuses_short_retention_with_a_settings_error() -> None:
    result = CliRunner().invoke(cli, ["serve", "--retention", "1h"])
    assert result.exit_code == 1
    assert "RECEIVER_RETENTION (--retention): must be at least 10h36m" in result.output


def test_prunes_finished_lifecycle_state_and_keeps_what_is_live(tmp_path: Path) -> None:
    from receiver.store.records import Chain
    from receiver.store.sqlite.tx import Alert

    db, clock = tmp_path / "r.db", Clock(T0)

    def old_state(tx: SQLiteTx) -> None:
        tx.alerts.save(Alert("session:done", "resolved", 1, "2027-01-15T08:00:00Z"), clock.now)
        tx.alerts.save(Alert("session:open", "open", 1, "2027-01-15T08:00:00Z"), clock.now)
        tx.notices.add("session:done", 1, "r", clock.now, None)
        tx.notices.add("session:open", 1, "r", clock.now, 3600)  # still repeating
        tx.digests.new("r", "*", clock.now, clock.now + 30)
        tx.silences.add({"userId": "u"}, "over", clock.now, clock.now + 60)
        tx.silences.add({"userId": "u"}, "long", clock.now, clock.now + 60 * DAY)
        policy = {"name": "p", "steps": [{"after": 0, "notify": ["x"]}], "repeat": 0}
        for rule, next_at, since in (
            ("ran-out", None, None),
            ("running", clock.now, None),
            ("waiting", None, clock.now),
        ):
            tx.escalations.start(
                Chain("session:open", 1, rule, policy, 1, 0, next_at, clock.now, since, None)
            )  # fmt: skip

    async def go(store: SQLiteStore) -> Counter[str]:
        await store.transact(old_state)
        clock.now = T0 + 31 * DAY
        return await Pruner(store, retention=30 * DAY, metrics=Metrics(), clock=clock).prune()

    assert run_store(db, clock, go) == Counter(lifecycle=5)
    # A chain that ran out goes; one still running or waiting for a silence stays.
    assert rows(db, "SELECT rule FROM escalations ORDER BY rule") == ["running", "waiting"]
    assert rows(db, "SELECT id FROM alerts") == ["session:open"]
    assert rows(db, "SELECT alert FROM notices") == ["session:open"]
    assert rows(db, "SELECT count(*) FROM groups") == [0]
    assert rows(db, "SELECT reason FROM silences") == ["long"]
