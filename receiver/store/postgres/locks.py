"""The advisory locks of one routing transaction on PostgreSQL, taken in one order for the
whole transaction: the alerts it changes, the digests it fills, the sessions whose
subscriber sides it reads.

Two transactions deadlock when each waits for a lock the other holds. Sorting each call's
keys is not enough, since a transaction calls several times (the timers lock an alert for
each due repeat, then the due escalations' alerts, then those waking after a silence).
So a transaction here only ever waits for a key greater than every key it holds. A key
that sorts before one it holds it takes only if it is free at once; if it is not,
LockOrderError rolls the transaction back, and the store runs it again with every key it
had asked for taken first, in order (PostgresStore.transact). No wait can then close a
circle: each waiter waits for a greater key than it holds, and a circle would need a key
greater than itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from receiver.store.statements import RetryTransaction, Statements

Key = tuple[str, ...]  # (kind, *parts): ("alert", id), ("digest", rule, key), ("sides", session)

# Each kind's lock: pg_advisory_xact_lock's arguments from the key's parts (? placeholders).
# Keys sort by kind first; within one, as Python sorts str: by code point, which is the
# order of the "C" collation (and of the ordinality a statement is given).
_ARGUMENTS = {
    "alert": "hashtextextended(?, 0)",
    "digest": "hashtext(?), hashtext(?)",
    "sides": "hashtext('webhook-sides'), hashtext(?)",
}


class LockOrderError(RetryTransaction):
    """A key this transaction needs sorts before one it holds, and another transaction
    holds it: waiting could deadlock. Run the transaction again, taking `keys` first."""

    def __init__(self, keys: Iterable[Key]) -> None:
        self.keys = frozenset(keys)
        super().__init__(f"{len(self.keys)} locks needed out of order; run again")


class Locks:
    """The keys one transaction holds, and the one way it takes more (take())."""

    def __init__(self, st: Statements, *, patient: bool = False) -> None:
        self.st = st
        self.held: set[Key] = set()
        # The last of a transaction's runs waits for any key, in whatever order it needs
        # them (PostgreSQL's deadlock detector is then what breaks a circle).
        self.patient = patient

    def take(self, keys: Iterable[Key]) -> None:
        """Hold these keys until the transaction ends (or its savepoint rolls back)."""
        todo = sorted(set(keys) - self.held)
        if not todo:
            return
        top = max(self.held, default=None)
        if top is not None and todo[0] < top and not self.patient:
            early = [key for key in todo if key < top]
            for key in early:
                if not self._try(key):
                    raise LockOrderError(self.held | set(todo))
                self.held.add(key)
            todo = todo[len(early) :]
        self._wait(todo)
        self.held.update(todo)

    def _try(self, key: Key) -> bool:
        sql = f"SELECT pg_try_advisory_xact_lock({_ARGUMENTS[key[0]]})"
        return bool(self.st.q(sql, key[1:]).fetchone()[0])

    def _wait(self, keys: list[Key]) -> None:
        for kind, group in itertools.groupby(keys, key=lambda key: key[0]):
            parts = [key[1:] for key in group]
            if kind == "alert":  # a batch's alerts: one statement, in the order given
                self.st.q(
                    "SELECT pg_advisory_xact_lock(hashtextextended(id, 0))"
                    " FROM unnest(?::text[]) WITH ORDINALITY AS t(id, n) ORDER BY n",
                    ([part[0] for part in parts],),
                ).fetchall()
                continue
            for part in parts:
                self.st.q(f"SELECT pg_advisory_xact_lock({_ARGUMENTS[kind]})", part)
