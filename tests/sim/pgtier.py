"""The PostgreSQL tier (`make sim PG=1`): each seed also runs on PostgreSQL, a fresh
database of a throwaway server this process starts and stops (tests/pg.py), with every
invariant checked after every step there too, and the three stores compared: memory and
SQLite (agree.stores_agree, on every seed of this tier), SQLite and PostgreSQL (the same
rows and open alerts at the end, compared as stores agree compares).
"""

from __future__ import annotations

from typing import Any

from tests.pg import ThrowawayPostgres
from tests.pg import available as pg_available
from tests.sim import agree
from tests.sim.generate import Scenario
from tests.sim.invariants import check
from tests.sim.run import Run, run_scenario
from tests.sim.violation import Violation

SERVER: list[ThrowawayPostgres] = []  # the tier's server, once started (workers fork it)


def start() -> ThrowawayPostgres:
    """A server of this process's own (never RECEIVER_TEST_PG's: it is stopped after)."""
    why = pg_available(own=True)
    if why is not None:
        raise SystemExit(f"make sim PG=1: no PostgreSQL here: {why}")
    server = ThrowawayPostgres(own=True).start()
    SERVER.append(server)
    return server


def stop() -> None:
    while SERVER:
        SERVER.pop().stop()


def postgres_agrees(s: Scenario, sqlite: tuple[list[Any], list[Any]]) -> None:
    """Memory, SQLite and PostgreSQL give the same outcome for a seed: rows and open alerts.

    (The seed run on PostgreSQL with every invariant after every step, then its rows and
    open alerts at the end compared with the SQLite run's; memory and SQLite by
    agree.stores_agree.)"""
    server = SERVER[0]
    url = server.create_database()
    states: list[tuple[list[Any], list[Any]]] = []

    async def checker(run: Run, final: bool, routed: list[str]) -> None:
        await check(run, final, routed)
        if final:
            states.append(agree.final_state(run))

    try:
        run_scenario(s, checker, url)
    except Violation as found:
        raise Violation(
            found.invariant, f"on PostgreSQL: {found.detail}", f"{found.kind} (PostgreSQL)"
        ) from None
    finally:
        server.drop_database(url)
    for name, a, b in (("outbox rows", sqlite[0], states[0][0]),
                       ("open alerts", sqlite[1], states[0][1])):  # fmt: skip
        a, b = [tuple(x) for x in a], [tuple(x) for x in b]
        if a != b:
            first = next((x, y) for x, y in zip([*a, None], [*b, None], strict=False) if x != y)
            raise Violation(
                "stores agree",
                f"{name} differ (SQLite {len(a)}, PostgreSQL {len(b)}); first difference:"
                f" SQLite {first[0]} / PostgreSQL {first[1]}",
                "SQLite and PostgreSQL differ",
            )
