"""`receiver db migrate` and `receiver db copy`: a SQLite store's history moved to PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from click.testing import CliRunner

from receiver import events
from receiver.cli import cli
from receiver.store import Notification, Store, open_store
from receiver.store.base import Tx
from receiver.store.postgres import MIGRATIONS as PG_MIGRATIONS
from receiver.store.records import Alert
from receiver.store.sqlite.schema import MIGRATIONS as SQLITE_MIGRATIONS

T = TypeVar("T")


def run(url: str, fn: Callable[[Store], Awaitable[T]]) -> T:
    async def main() -> T:
        store = open_store(url, clock=lambda: 1000.0)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(main())


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_migrate_brings_either_store_to_its_newest_schema(tmp_path: Path, pg_url: str) -> None:
    code, out = invoke("db", "migrate", "--db", str(tmp_path / "new.db"))
    assert code == 0 and f"schema at version {len(SQLITE_MIGRATIONS)}, up to date" in out
    code, out = invoke("db", "migrate", "--db", pg_url)
    assert code == 0 and f"schema at version {len(PG_MIGRATIONS)}, up to date" in out
    assert "postgresql://postgres@127.0.0.1:" in out


async def history(store: Store) -> None:
    """A little of everything a store holds."""
    for i in range(3):
        e = events.validate(events.sample("score.drop", id=f"evt_{i}", sessionId=f"s{i}"))
        await store.events.accept(e, e.model_dump_json().encode())
    await store.events.quarantine(
        b"\xff{", reason="invalid_json", client="127.0.0.1", event_id=None
    )

    def route(tx: Tx) -> None:
        tx.events.mark_routed(["evt_0", "evt_1"], 1000.0)
        note = Notification(rule="r", notifier="console", target=0, title="t", body="b")
        tx.outbox.add("evt_0", note, state="pending", now=1000.0, alert="session:s0", episode=1)
        tx.outbox.add("evt_1", note, state="throttled", now=1000.0, reason="throttled")
        tx.alerts.save(Alert("session:s0", "open", 1, "2026-01-01T00:00:00Z", "x", "evt_0"), 1.0)
        tx.notices.add("session:s0", 1, "r", 1000.0, 3600.0)
        tx.throttle.throttled("r", "user_42", 1000.0, 60.0)
        tx.silences.add({"userId": "u1"}, "maintenance", 1000.0, 9000.0)
        tx.state.set("heartbeat", {"firing": False})

    await store.transact(route)
    await store.events.replay("evt_0", now=1001.0)


async def snapshot(store: Store) -> dict[str, Any]:
    rows = await store.outbox.deliveries()

    def read(tx: Tx) -> dict[str, Any]:
        return {
            "unrouted": sorted(e.id for e in tx.events.unrouted(10)),
            "bodies": [tx.events.body(f"evt_{i}") for i in range(3)],
            "alerts": tx.alerts.list_open(),
            "notices": tx.notices.of("session:s0", 1),
            "silences": tx.silences.recent(),
            "state": tx.state.get("heartbeat"),
            "throttled": tx.throttle.throttled("r", "user_42", 1010.0, 60.0),
        }

    found = await store.transact(read)
    found["outbox"] = [(r.id, r.event_id, r.state, r.reason, r.replay) for r in rows]
    found["replay"] = await store.events.replay_status(1)
    return found


def test_copy_moves_the_whole_history_and_refuses_a_store_in_use(
    tmp_path: Path, pg_url: str
) -> None:
    source = str(tmp_path / "receiver.db")
    run(source, history)
    before = run(source, snapshot)

    code, out = invoke("db", "copy", "--db", source, "--to", pg_url)

    assert code == 0, out
    assert "copied 3 events, 1 quarantine, 2 outbox" in out
    assert "next: RECEIVER_DB=postgresql://postgres@127.0.0.1:" in out
    assert run(pg_url, snapshot) == before
    # The copy's ids are taken: a new row continues after them.
    new_id = run(
        pg_url,
        lambda s: s.transact(
            lambda tx: tx.outbox.add(
                "evt_2",
                Notification(rule="n", notifier="console", target=0, title="t", body="b"),
                state="pending",
                now=2000.0,
            )
        ),
    )
    assert new_id > max(row[0] for row in before["outbox"])

    code, out = invoke("db", "copy", "--db", source, "--to", pg_url)
    assert code == 1 and "already holds events: copy only into an empty store" in out


def test_copy_refuses_what_is_not_sqlite_to_postgresql(tmp_path: Path) -> None:
    code, out = invoke("db", "copy", "--db", str(tmp_path / "r.db"), "--to", "/tmp/other.db")
    assert code == 2 and "must be a postgresql:// URL" in out
    code, out = invoke("db", "copy", "--db", str(tmp_path / "none.db"), "--to", "postgresql://x/y")
    assert code == 1 and "no SQLite database at" in out
