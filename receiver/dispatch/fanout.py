"""Subscriber fan-out: which webhook deliveries a routed event makes. Pure.

A subscriber without a threshold gets each event of a type it asked for as received
(the stored body, byte for byte, under the event's own id). A subscriber with a
threshold gets score.drop and score.recover derived from the scores of each session's
score.drop and score.recover events against its threshold instead: one score.drop when a
score falls below it, one score.recover when a later one is back at or above it (a
session starts above). Scores older than the latest seen for the session and subscriber
do not move it (a late delivery cannot flap it). A derived event's id is derived from
the subscriber and the source event, so the same input gives the same id. A subscriber
with a filter (a rule's match mapping) sees only the events it matches.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from receiver.matchers import Condition, compile_match
from receiver.sessions import Fact
from receiver.store.records import Webhook

DERIVED = ("score.drop", "score.recover")
Sides = dict[tuple[int, str], tuple[bool, str]]  # (subscription, session) -> (below, mark)


@dataclass(frozen=True)
class Delivery:
    event_id: str  # the source event
    webhook: Webhook
    delivery_id: str  # the id the subscriber sees, stable across retries
    body: str


def as_match(filter: Mapping[str, Any]) -> dict[str, Any]:
    """A subscription's filter as a rule's match mapping: {"in": [...]} is the rules' list
    (any of), spelled as the webhook gateways do; every other form is the rules' own.

    >>> as_match({"userId": "u1", "cohort": {"in": ["beta", "gamma"]}})
    {'userId': 'u1', 'cohort': ['beta', 'gamma']}
    """
    return {
        field: value["in"] if isinstance(value, Mapping) and set(value) == {"in"} else value
        for field, value in filter.items()
    }


@functools.lru_cache(maxsize=1024)
def _conditions(text: str) -> tuple[Condition, ...]:
    """A filter's conditions, compiled once (it was checked when it was registered)."""
    return compile_match(as_match(json.loads(text)))[0]


def matches(filter: Mapping[str, Any], payload: Mapping[str, Any]) -> bool:
    """Whether payload matches a subscription's filter, as a rule's match: every field."""
    conditions = _conditions(json.dumps(filter, sort_keys=True))
    return all(condition.holds(payload) for condition in conditions)


def replayed(hook: Webhook, event_id: str, body: str) -> tuple[str, str | None] | None:
    """The delivery a stored event makes to hook now (a replay's pick): its types and its
    current filter; under a threshold a score event's delivery is derived (its webhook-id
    from the subscriber and the event), re-sent only if one was made then (body None)."""
    payload = json.loads(body)
    kind = payload.get("type")
    if hook.filter and not matches(hook.filter, payload):
        return None
    if hook.threshold is not None and kind in DERIVED:
        return derived_id(hook, event_id), None
    return (event_id, body) if kind in hook.events else None


def derived_id(webhook: Webhook, source_event_id: str) -> str:
    digest = hashlib.sha256(f"{webhook.public_id}:{source_event_id}".encode()).hexdigest()
    return f"evt_{digest[:24]}"


def fan_out(
    webhooks: Sequence[Webhook],
    events: Sequence[tuple[str, str, Mapping[str, Any]]],
    sides: Mapping[tuple[int, str], tuple[bool, str]],
) -> tuple[list[Delivery], Sides]:
    """The deliveries of events (id, stored body, payload), in order, and the sides that
    changed. sides: what is stored for the (subscription, session) pairs involved."""
    deliveries: list[Delivery] = []
    changed: Sides = {}
    for event_id, body, payload in events:
        kind = payload.get("type")
        # The series is the drops' and recovers' scores (they carry a user).
        fact = Fact.from_payload(dict(payload)) if kind in DERIVED else None
        scored = fact is not None and fact.score is not None
        for hook in webhooks:
            if hook.filter and not matches(hook.filter, payload):
                continue  # none of its deliveries, and no side moved
            if hook.threshold is None or kind not in DERIVED:
                if kind in hook.events:
                    deliveries.append(Delivery(event_id, hook, event_id, body))
            if hook.threshold is None or not scored:
                continue
            assert fact is not None and fact.score is not None
            key = (hook.id, fact.session_id)
            below_before, mark = changed.get(key) or sides.get(key) or (False, "")
            if fact.mark <= mark:
                continue  # late: an older score than the one the side is from
            below = fact.score < hook.threshold
            changed[key] = (below, fact.mark)
            crossed = "score.drop" if below else "score.recover"
            if below != below_before and crossed in hook.events:
                deliveries.append(
                    Delivery(event_id, hook, *_derived(hook, crossed, event_id, payload))
                )
    return deliveries, changed


def _derived(
    hook: Webhook, kind: str, event_id: str, payload: Mapping[str, Any]
) -> tuple[str, str]:
    assert hook.threshold is not None
    threshold = hook.threshold
    new_id = derived_id(hook, event_id)
    derived = {
        "id": new_id,
        "type": kind,
        "sessionId": payload.get("sessionId"),
        "userId": payload.get("userId"),
        "score": payload.get("score"),
        "threshold": int(threshold) if float(threshold).is_integer() else threshold,
        "timestamp": payload.get("timestamp"),
    }
    return new_id, json.dumps(derived, separators=(",", ":"))
