"""Transitional: the contract's helpers moved to tests/store/contract/common.py (the tests,
role by role, to tests/store/contract/); kept for the tests that still import them here."""

from tests.store.contract.common import event, note, queue, run

__all__ = ["event", "note", "queue", "run"]
