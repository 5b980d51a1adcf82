"""The store contract, role by role (receiver.store.base): each test gets an empty store of
each kind, SQLite and a real PostgreSQL (store_url, tests/conftest.py); the Tx roles' tests
run on the backtest's store in memory too (tx_url)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.store.contract.common import MEMORY


@pytest.fixture(params=["sqlite", "postgres", "memory"])
def tx_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of each kind for the routing transaction's roles: the scratch store in
    memory is held to the same contract as SQLite and PostgreSQL."""
    if request.param == "memory":
        return MEMORY
    if request.param == "sqlite":
        return str(tmp_path / "receiver.db")
    return str(request.getfixturevalue("pg_migrated_url"))
