"""Shared fixtures: real local servers that catch notifications, and no process left behind."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests import dbview, harness, pg
from tests.pg import ThrowawayPgBouncer, ThrowawayPostgres
from tests.servers import HTTPSink, SMTPSink

# Property tests draw the same examples on every run, so `make test` is green or red for the
# code, not for the draw (a CI run once drew a case the author's runs had not). To explore
# new draws: HYPOTHESIS_PROFILE=explore make test.
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


@pytest.fixture
def http_sink() -> Iterator[HTTPSink]:
    """A running HTTPSink on a free port, stopped after the test."""
    sink = HTTPSink().start()
    try:
        yield sink
    finally:
        sink.stop()


@pytest.fixture
def smtp_sink() -> Iterator[SMTPSink]:
    """A running SMTPSink (plain SMTP, optional AUTH) on a free port, stopped after the test."""
    sink = SMTPSink().start()
    try:
        yield sink
    finally:
        sink.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup` (the Makefile's), a file whose tests share a module-scoped
    fixture (one server, one browser for the file) runs in one worker, so the fixture starts
    once; every other test goes to whichever worker is free, so a file of long tests
    (tests/test_faults.py) spreads over the workers instead of ending the run alone.

    xdist hands out the groups first (the largest first), then the other tests in this
    order: the tests marked slow before the rest, so that none of them starts late and runs
    alone at the end of the run (tests/store/test_locks.py's 27 s test did)."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d.scope == "module" for chain in defs for d in chain):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The harness refuses to start a server for a test not marked e2e (harness.current_test);
    set before the test's fixtures, module-scoped ones included."""
    harness.current_test = item


@pytest.fixture(autouse=True)
def _stop_what_the_test_started() -> Iterator[None]:
    """A receiver a test started and left running (it failed, or timed out, before its
    own stop) is stopped here: SIGTERM, then SIGKILL. Module fixtures' servers, started
    before this runs, are left to their fixtures."""
    before = harness.running()
    yield
    for proc in harness.running() - before:
        harness.stop_process(proc)


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_suite() -> Iterator[None]:
    """Fails the run if any process the tests started is still alive at the end."""
    yield
    harness.stop_fork_server()
    dbview.forget_all()
    leaked = _descendants(os.getpid())
    for pid in leaked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if leaked:
        pytest.fail(
            "processes started by the tests were still running at the end (killed now): "
            + "; ".join(f"{pid} {cmd}" for pid, cmd in leaked.items())
        )


def _descendants(root: int) -> dict[int, str]:
    """Live (not zombie) descendants of root, pid -> command line, read from /proc."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if state != "Z":
            parents[int(entry.name)] = int(ppid)
            commands[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    found: dict[int, str] = {}
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found.keys()
        found.update({pid: commands[pid].strip() for pid in frontier})
    return found


# -- stores: every store test runs on SQLite and on a real PostgreSQL ----------------------


@pytest.fixture(scope="session")
def postgres() -> Iterator[ThrowawayPostgres]:
    """One throwaway PostgreSQL for the session (or RECEIVER_TEST_PG's server)."""
    why = pg.available()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL tests cannot run: {why}")
        pytest.skip(f"PostgreSQL tests SKIPPED: {why}")
    server = ThrowawayPostgres().start()
    try:
        yield server
    finally:
        # Its data is deleted next: no shutdown checkpoint to wait for (a fast stop of a
        # server the session wrote to took up to pg_ctl's 60 s on a busy machine).
        server.stop("immediate")


@pytest.fixture
def pg_url(postgres: ThrowawayPostgres) -> Iterator[str]:
    """A new, empty PostgreSQL database, dropped after the test."""
    url = postgres.create_database()
    yield url
    postgres.drop_database(url)


@pytest.fixture
def pg_migrated_url(postgres: ThrowawayPostgres) -> Iterator[str]:
    """A PostgreSQL database at the newest schema and holding nothing: what a server has
    made of pg_url once it started, without each start spending its CPU on migrating
    (receiver_db, store_url). After the test it is emptied for the next one, or dropped if
    the test changed its shape or left a session on it (tests/pg.py)."""
    url = postgres.create_database(migrated=True)
    yield url
    postgres.drop_database(url)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """RECEIVER_DB for an empty store of each kind: a new SQLite file, and a PostgreSQL
    database at the newest schema holding nothing (migrating empty databases is tested
    with pg_url)."""
    if request.param == "sqlite":
        return str(tmp_path / "receiver.db")
    return str(request.getfixturevalue("pg_migrated_url"))


@pytest.fixture(params=["sqlite", "postgres"])
def receiver_db(request: pytest.FixtureRequest) -> str | None:
    """RECEIVER_DB for an end-to-end test run on each store: None is the harness's own
    SQLite file; else a new PostgreSQL database (at the newest schema, as the harness's
    SQLite file is: tests/harness.py)."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("pg_migrated_url"))


# -- PgBouncer in transaction mode in front of the session's PostgreSQL ----------------------


@pytest.fixture(scope="session")
def pgbouncer(postgres: ThrowawayPostgres) -> Iterator[ThrowawayPgBouncer]:
    """One throwaway PgBouncer (transaction pooling) in front of the session's PostgreSQL."""
    why = pg.bouncer_available()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"PgBouncer tests cannot run: {why}")
        pytest.skip(f"PgBouncer tests SKIPPED: {why}")
    bouncer = ThrowawayPgBouncer(postgres).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def own_bouncer(
    pgbouncer: ThrowawayPgBouncer, postgres: ThrowawayPostgres
) -> Iterator[ThrowawayPgBouncer]:
    """A PgBouncer of the test's own, for a test that pauses, stops or restarts it (the
    session's serves the other tests); its admin console takes PAUSE, RESUME, KILL."""
    own = ThrowawayPgBouncer(postgres).start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def bouncer_url(pgbouncer: ThrowawayPgBouncer, postgres: ThrowawayPostgres) -> Iterator[str]:
    """A new, empty PostgreSQL database, reached through PgBouncer in transaction mode;
    dropped after the test."""
    url = postgres.create_database()
    yield pgbouncer.url(url)
    postgres.drop_database(url)


@pytest.fixture(params=["sqlite", "postgres", "pgbouncer"])
def routing_db(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """receiver_db, and a third store: PostgreSQL through PgBouncer in transaction mode,
    with RECEIVER_DB_PREPARE_THRESHOLD=off (the harness passes the environment on). Only
    the routing end-to-end tests take it: on every receiver_db test it would add minutes
    to `make test`."""
    if request.param == "sqlite":
        return None
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    monkeypatch.setenv("RECEIVER_DB_PREPARE_THRESHOLD", "off")
    return str(request.getfixturevalue("bouncer_url"))
