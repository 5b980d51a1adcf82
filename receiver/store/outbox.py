"""The outbox on either SQL store. Transitional: the routing transaction's outbox statements
(tx.outbox: add, add_many, cancel_held, sent) are still receiver.store.sql.SQLTx's, run
here over the transaction's statements and its alerts' read-ahead."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from receiver.store.alerts import ReadAhead
from receiver.store.records import Alert
from receiver.store.sql import SQLTx
from receiver.store.statements import Statements


class TxOutbox(SQLTx):
    """tx.outbox (base.TxOutbox) on either SQL store."""

    def __init__(self, st: Statements, ahead: ReadAhead) -> None:
        self.st = st
        self.ahead = ahead

    def _q(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.st.q(sql, params)

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.st.many(sql, rows)

    def _in(self, column: str, values: Iterable[Any]) -> tuple[str, Any]:
        return self.st.dialect.in_(column, values)

    @property
    def _held(self) -> set[str]:  # type: ignore[override]
        return self.ahead.held

    @property
    def _alerts(self) -> dict[str, Alert | None] | None:  # type: ignore[override]
        return self.ahead.alerts

    def _may_have_held(self, alert: str) -> bool:
        return self.ahead.may_have_held(alert)
