"""PostgreSQL through PgBouncer in transaction mode: RECEIVER_DB_PREPARE_THRESHOLD=off.

A pooler in transaction mode hands each transaction whichever server connection is free,
so a statement psycopg prepared on one (after 5 runs, by default) is missing on the next,
or clashes with another client's of the same name. PgBouncer keeps prepared statements
only from 1.21 on, with max_prepared_statements set; Debian 12's is 1.18. With the
threshold off, psycopg never prepares, and the store works there as it does directly.
The routing end-to-end tests run through the bouncer too (conftest.routing_db).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from receiver import events
from receiver.app import create_app
from receiver.errors import StorageUnavailableError
from receiver.settings import DB_PREPARE_THRESHOLD, Settings
from receiver.store import open_store
from receiver.store.postgres import PostgresStore
from receiver.store.postgres.store import PREPARE_THRESHOLD
from tests.harness import Receiver
from tests.servers import HTTPSink
from tests.store.contract import (
    common,
    test_alerts,
    test_events,
    test_outbox,
    test_replicas,
    test_routing,
    test_stats,
    test_tx,
)

pytestmark = pytest.mark.e2e


def test_the_default_threshold_is_psycopgs_own() -> None:
    default = inspect.signature(psycopg.Connection.connect).parameters["prepare_threshold"]
    setting = Settings.model_fields["db_prepare_threshold"].default
    assert setting == DB_PREPARE_THRESHOLD == PREPARE_THRESHOLD
    assert PREPARE_THRESHOLD == default.default


async def _alternate(url: str, threshold: int | None, runs: int) -> list[int | None]:
    """Two stores (two replicas, one connection each) take turns writing, runs times each;
    the prepare_threshold of the connection each pool holds."""
    # Migrated first, so both start alike: neither has prepared anything yet.
    migrated = PostgresStore(url, prepare_threshold=None)
    await migrated.open()
    await migrated.close()
    stores = [PostgresStore(url, pool_size=1, prepare_threshold=threshold) for _ in range(2)]
    for store in stores:
        await store.open()
    try:
        for _ in range(runs):
            for store in stores:
                await store.check_writable()
        return [_pool_threshold(store) for store in stores]
    finally:
        for store in stores:
            await store.close()


def _pool_threshold(store: PostgresStore) -> int | None:
    with store._pool.connection() as conn:  # noqa: SLF001 - what psycopg was told
        threshold: int | None = conn.prepare_threshold
        return threshold


def test_prepared_statements_break_behind_transaction_pooling(bouncer_url: str) -> None:
    # Each replica's turn gets the server connection the other's just left (PgBouncer
    # reuses the most recent), and each names its first prepared statement "_pg3_0": the
    # second to reach its fifth run finds the first one's there. (Under load, turns land
    # on other server connections too, and a prepared statement is missing instead.)
    clash = 'prepared statement "_pg3_0" already exists'
    with pytest.raises((psycopg.Error, StorageUnavailableError), match=clash):
        asyncio.run(_alternate(bouncer_url, DB_PREPARE_THRESHOLD, runs=DB_PREPARE_THRESHOLD + 5))


def test_off_never_prepares_and_the_store_keeps_working(bouncer_url: str) -> None:
    assert asyncio.run(_alternate(bouncer_url, None, runs=50)) == [None, None]


@pytest.mark.parametrize(("setting", "expected"), [("off", None), ("3", 3)])
def test_the_setting_reaches_the_servers_connections(
    bouncer_url: str, setting: str, expected: int | None
) -> None:
    app = create_app(Settings(db=bouncer_url, db_prepare_threshold=setting, secrets="s"))
    store = app.state.store  # type: ignore[attr-defined]

    async def go() -> int | None:
        await store.open()
        try:
            assert isinstance(store, PostgresStore)
            return _pool_threshold(store)
        finally:
            await store.close()

    assert asyncio.run(go()) == expected


# -- the store contract again, through the bouncer -------------------------------------------

# The roles' contract tests that take one store's URL (tests/store/contract/).
ROLES = [
    test_alerts,
    test_events,
    test_outbox,
    test_replicas,
    test_routing,
    test_stats,
    test_tx,
]
CONTRACT = [
    test
    for module in ROLES
    for name, test in vars(module).items()
    if name.startswith("test_")
    and callable(test)
    and set(inspect.signature(test).parameters) <= {"store_url", "tx_url", "pg_url"}
    and len(inspect.signature(test).parameters) == 1
]


@pytest.mark.parametrize("contract", CONTRACT, ids=lambda test: test.__name__.removeprefix("test_"))
def test_the_store_contract_holds_through_pgbouncer(
    contract: Callable[[str], None], bouncer_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The contract's tests open their stores with open_store: here, never preparing.
    never = functools.partial(open_store, prepare_threshold=None)
    for module in (common, *ROLES):
        if hasattr(module, "open_store"):
            monkeypatch.setattr(module, "open_store", never)
    contract(bouncer_url)


# -- two replicas through the bouncer, end to end --------------------------------------------


def test_two_replicas_through_pgbouncer_route_and_notify_each_event_once(
    tmp_path: Path, bouncer_url: str, http_sink: HTTPSink
) -> None:
    rules = f'notifiers:\n  hook: "{http_sink.json_url()}"\n'
    rules += "rules:\n  - name: all\n    notify: [hook]\n"
    env = {"RECEIVER_DB_PREPARE_THRESHOLD": "off"}
    replicas: list[Receiver] = []
    with _shown_on_failure(replicas):
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            replica = Receiver(tmp_path / name, rules=rules, env=env, db=bouncer_url)
            replicas.append(replica.start())
        ids = [f"evt_{i}" for i in range(40)]
        bodies = [events.sample("score.drop", id=e, sessionId=f"sess_{e}") for e in ids]
        for i, body in enumerate(bodies):
            assert replicas[i % 2].send(body).status_code == 202
        # A sender's retry reaches the other replica: a duplicate wherever it lands.
        for i, body in enumerate(bodies[:10]):
            assert replicas[(i + 1) % 2].send(body).status_code == 200
        http_sink.wait_for(len(ids), timeout=30)
        _until(lambda: _delivered(replicas[0]) == len(ids), what="every row delivered")
        rows = replicas[0].query("SELECT event_id, state, attempts FROM outbox ORDER BY event_id")
        assert sorted(rows) == sorted((event_id, "delivered", 1) for event_id in ids)
        [unrouted] = replicas[0].query("SELECT count(*) FROM events WHERE routed_at IS NULL")
        assert unrouted == (0,)
        # Once each: a row is marked delivered only after its send, so a second send of
        # any of them would be in the sink by now.
        assert len(http_sink.requests) == len(ids)
        routed = [r.metric("receiver_events_routed_total") for r in replicas]
        assert sum(routed) == len(ids)
        for replica in replicas:
            assert "prepared statement" not in replica.logs()


@contextlib.contextmanager
def _shown_on_failure(replicas: list[Receiver]) -> Iterator[None]:
    """Stops the replicas at the end; a failure, a refused connection too, says how each
    one is (running, or its exit status) with its log's tail."""
    try:
        yield
    except (AssertionError, httpx.HTTPError) as exc:
        tails = "\n\n".join(replica.tail() for replica in replicas)
        raise AssertionError(f"{type(exc).__name__}: {exc}\n\n{tails}") from exc
    finally:
        for replica in replicas:
            if replica.proc is not None:
                replica.stop()


def _delivered(server: Receiver) -> int:
    [(count,)] = server.query("SELECT count(*) FROM outbox WHERE state = 'delivered'")
    return int(count)


def _until(check: Callable[[], Any], timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
