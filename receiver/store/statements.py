"""How the SQL roles run their statements on either store: written once with `?`
placeholders, run by a Runner (a store: each call its own transaction) or a Statements (one
routing transaction), with what differs between SQLite and PostgreSQL in a Dialect."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

Query = Callable[[str, Sequence[Any]], Any]  # (sql with ? placeholders, params) -> cursor


def json_in(column: str, values: Iterable[Any]) -> tuple[str, Any]:
    """SQLite's "column is one of values", and its one parameter."""
    return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(list(values))


def any_in(column: str, values: Iterable[Any]) -> tuple[str, Any]:
    """PostgreSQL's "column is one of values", and its one parameter (an array)."""
    return f"{column} = ANY(?)", list(values)


@dataclass(frozen=True)
class Dialect:
    """What the two databases say differently, or lock where the other need not."""

    in_: Callable[[str, Iterable[Any]], tuple[str, Any]]
    # Appended to a read of a key's request count or a bucket: replicas take turns.
    lock_key: str = ""
    # The whole part of a positive number: SQLite's CAST truncates, PostgreSQL's rounds.
    floor: str = "CAST({} AS INTEGER)"
    # Appended to the repeats due and to a claim's rows: replicas take disjoint ones.
    skip_locked: str = ""
    # Replicas folding the same session take turns (views.project).
    lock_sessions: bool = False


SQLITE = Dialect(in_=json_in)
POSTGRES = Dialect(
    in_=any_in,
    lock_key=" FOR UPDATE",
    floor="floor({})::bigint",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    lock_sessions=True,
)


class Runner(Protocol):
    """A store as its roles see it: each call runs fn(query) in a transaction of its own."""

    dialect: Dialect
    clock: Callable[[], float]

    async def statements(self, fn: Callable[[Query], T], *, write: bool = True) -> T:
        """fn(query) in one transaction of the store (the writer's, on SQLite)."""

    async def read(self, fn: Callable[[Query], T]) -> T:
        """fn(query) in a read transaction off the event loop, beside the writer."""


class Statements(Protocol):
    """One open routing transaction as the Tx's roles see it."""

    dialect: Dialect

    def q(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (`?` placeholders); its cursor."""

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement (`?` placeholders) for each of rows."""


class RetryTransaction(Exception):  # noqa: N818 - a request to run again, not a failure
    """Raised inside a transaction that must be rolled back and run again from the start
    (the store that raised it runs it again; routing code lets it pass, as systemic)."""
