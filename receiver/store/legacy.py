"""Transitional: the Store's and Tx's method names from before the roles, each answered by
the role method it became (store.add_key(...) is store.keys.add(...)), until the last
caller has moved to the role."""

from __future__ import annotations

from typing import Any

# old name -> (role attribute, method)
STORE_NAMES: dict[str, tuple[str, str]] = {
    "session": ("sessions", "get"),
    "score_history": ("sessions", "score_history"),
    "list_sessions": ("sessions", "page"),
    "score_groups": ("sessions", "score_groups"),
    "import_sessions": ("sessions", "import_upstream"),
    "add_key": ("keys", "add"),
    "revoke_key": ("keys", "revoke"),
    "authorize": ("keys", "authorize"),
    "take_upstream": ("upstream", "take"),
    "hold_upstream": ("upstream", "hold"),
    "sync_cursor": ("upstream", "sync_cursor"),
    "set_sync_cursor": ("upstream", "set_sync_cursor"),
    "events_between": ("history", "between"),
    "count_between": ("history", "count_between"),
    "noise": ("history", "noise"),
}
TX_NAMES: dict[str, tuple[str, str]] = {}


class Flat:
    """Answers an old method name with its role's method (names: STORE_NAMES or TX_NAMES)."""

    _names: dict[str, tuple[str, str]] = STORE_NAMES

    def __getattr__(self, name: str) -> Any:
        found = type(self)._names.get(name)
        if found is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(getattr(self, found[0]), found[1])
