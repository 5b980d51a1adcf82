"""The roles of both SQL backends are wired once (receiver/store/sql.py): each backend's
Store and Tx take them from there, and pass in only the roles they run their own way."""

from __future__ import annotations

import ast
import inspect
import sqlite3
from pathlib import Path

from receiver.store import base
from receiver.store.postgres.store import PostgresStore
from receiver.store.postgres.tx import PostgresTx
from receiver.store.sql import SQLStore, SQLTx
from receiver.store.sqlite.store import SQLiteStore
from receiver.store.sqlite.tx import SQLiteTx

STORE = Path(__file__).resolve().parents[2] / "receiver" / "store"


def _roles(protocol: type) -> set[str]:
    """The roles a protocol names: its properties."""
    return {name for name, value in vars(protocol).items() if isinstance(value, property)}


def _assigned(path: Path) -> set[str]:
    """The `self.NAME = ...` attributes a module's methods assign."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    names.add(target.attr)
    return names


def test_both_backends_take_their_roles_from_the_shared_wiring() -> None:
    assert issubclass(SQLiteTx, SQLTx) and issubclass(PostgresTx, SQLTx)
    assert issubclass(SQLiteStore, SQLStore) and issubclass(PostgresStore, SQLStore)


def test_no_backend_assigns_a_role_itself() -> None:
    tx_roles, store_roles = _roles(base.Tx), _roles(base.Store)
    assert {"alerts", "events", "outbox", "silences"} <= tx_roles & store_roles
    for backend in ("sqlite", "postgres"):
        assert not _assigned(STORE / backend / "tx.py") & tx_roles, backend
        assert not _assigned(STORE / backend / "store.py") & store_roles, backend


def test_the_shared_wiring_gives_every_role_of_the_protocols() -> None:
    assert _roles(base.Tx) <= _assigned(Path(inspect.getfile(SQLTx)))
    assert _roles(base.Store) <= _assigned(Path(inspect.getfile(SQLStore)))
    tx = SQLiteTx(sqlite3.connect(":memory:"))
    assert all(getattr(tx, role) is not None for role in _roles(base.Tx))
    store = SQLiteStore(":memory:")
    assert all(getattr(store, role) is not None for role in _roles(base.Store))
