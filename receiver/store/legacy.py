"""Transitional: the Store's and Tx's method names from before the roles, each answered by
the role method it became (store.add_key(...) is store.keys.add(...)), until the last
caller has moved to the role."""

from __future__ import annotations

from typing import Any

# old name -> (role attribute, method)
STORE_NAMES: dict[str, tuple[str, str]] = {
    "accept": ("events", "accept"),
    "quarantine": ("events", "quarantine"),
    "events_page": ("events", "page"),
    "event": ("events", "get"),
    "quarantined": ("events", "quarantined"),
    "replay": ("events", "replay"),
    "prune": ("events", "prune"),
    "ack_alert": ("alerts", "ack"),
    "acks": ("alerts", "acks"),
    "size": ("stats", "size"),
    "backlog": ("stats", "backlog"),
    "replay_status": ("events", "replay_status"),
    "claim_due": ("outbox", "claim_due"),
    "release": ("outbox", "release"),
    "next_due": ("outbox", "next_due"),
    "mark_delivered": ("outbox", "mark_delivered"),
    "mark_failed": ("outbox", "mark_failed"),
    "attempts": ("outbox", "attempts"),
    "deliveries": ("outbox", "deliveries"),
    "retry_dead": ("outbox", "retry_dead"),
    "outbox_page": ("outbox", "page"),
    "count_dead": ("outbox", "count_dead"),
    "retry_dead_batch": ("outbox", "retry_dead_batch"),
    "outbox_counts": ("outbox", "counts"),
    "add_webhook": ("webhooks", "add"),
    "webhook": ("webhooks", "get"),
    "set_webhook": ("webhooks", "update"),
    "webhook_deliveries": ("webhooks", "deliveries"),
    "webhook_delivery": ("webhooks", "delivery"),
    "retry_delivery": ("webhooks", "retry_delivery"),
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
TX_NAMES: dict[str, tuple[str, str]] = {
    "unrouted": ("events", "unrouted"),
    "mark_routed": ("events", "mark_routed"),
    "event_body": ("events", "body"),
    "last_received": ("events", "last_received"),
    "replay_request": ("events", "replay_request"),
    "replay_done": ("events", "replay_done"),
    "subscriptions": ("webhooks", "active"),
    "sides": ("webhooks", "sides"),
    "save_sides": ("webhooks", "save_sides"),
    "project": ("sessions", "project"),
    "add": ("outbox", "add"),
    "add_many": ("outbox", "add_many"),
    "cancel_held": ("outbox", "cancel_held"),
    "sent": ("outbox", "sent"),
    "throttled": ("throttle", "throttled"),
    "alert": ("alerts", "get"),
    "save_alert": ("alerts", "save"),
    "read_alerts": ("alerts", "read_ahead"),
    "write_alerts": ("alerts", "flush"),
    "forget_alerts": ("alerts", "forget"),
    "open_alerts": ("alerts", "list_open"),
    "add_notice": ("notices", "add"),
    "end_repeats": ("notices", "end_repeats"),
    "due_repeats": ("notices", "due"),
    "repeated": ("notices", "repeated"),
    "open_group": ("digests", "find_open"),
    "new_group": ("digests", "new"),
    "update_group": ("digests", "update"),
    "add_silence": ("silences", "add"),
    "expire_silence": ("silences", "expire"),
    "all_silences": ("silences", "recent"),
    "get_state": ("state", "get"),
    "set_state": ("state", "set"),
}


class Flat:
    """Answers an old method name with its role's method (names: STORE_NAMES or TX_NAMES)."""

    _names: dict[str, tuple[str, str]] = STORE_NAMES

    def __getattr__(self, name: str) -> Any:
        found = type(self)._names.get(name)
        if found is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(getattr(self, found[0]), found[1])
