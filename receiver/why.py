"""Why a stored event was routed as it was: `GET /v1/events/:id/explain`, `receiver explain
--event ID` and the admin page's event page.

Nothing is re-computed with today's rules. Routing records, in the same statement that
marks a batch routed, the digest of the rules file it used, and keeps that file once
(store.events.rules). Each rule's verdict (matched or not, and why not) is that file's on
the event's payload: matching is a pure function of the two, so it is what routing saw. What
became of each matching rule's notifications is the outbox rows routing wrote for the event,
with their states and reasons (sent, held, grouped into a digest, throttled, silenced, muted
outside quiet hours, inhibited, held back by a storm, stale). Events routed before routing
kept its rules files are explained with the rules loaded now, and say so (`rulesAsOf`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from receiver.dispatch.alerts import alert_id
from receiver.errors import ConfigError
from receiver.events import iso_epoch, load_stored
from receiver.rules import Ruleset, load_text
from receiver.rules.rule import ESCALATE_ONLY
from receiver.rules.verdict import RuleOutcome
from receiver.store import Store
from receiver.store.records import OutboxQuery, OutboxRow

# A notification's state -> the decision it stands for (DESIGN.md's names).
DECISIONS = {
    "pending": "sent", "sending": "sent", "delivered": "sent", "dead": "sent",
    "held": "held", "cancelled": "held", "grouped": "digest", "throttled": "throttled",
    "silenced": "silenced", "muted": "quiet", "inhibited": "inhibited", "storm": "storm",
    "stale": "stale",
}  # fmt: skip
_KEPT: dict[str, Ruleset] = {}  # rules files loaded from the store, by digest (a few)


async def explain_event(store: Store, event_id: str, current: Ruleset) -> dict[str, Any] | None:
    """The explanation of a stored event (None: no such event)."""
    found = await store.events.get(event_id)
    if found is None:
        return None
    row, body = found
    payload = load_stored(body)
    ruleset, as_of = current, "now"
    if row.rules:
        kept = await _ruleset(store, row.rules)
        if kept is not None:
            ruleset, as_of = kept, "routing"
    rows = await store.outbox.page(OutboxQuery(event_id=event_id, limit=1000))
    by_rule: dict[str, list[OutboxRow]] = {}
    for out in reversed(rows):  # oldest first
        by_rule.setdefault(out.rule, []).append(out)
    verdicts = ruleset.explain(payload, at=row.received_at).rules
    # The escalations this event started (in its routing transaction): a rule that only
    # escalates started one, or found its alert's already running (deduplicated).
    aid = alert_id(payload)
    chains = await store.alerts.chains(aid) if aid is not None else []
    started = {c.rule for c in chains if c.started_at == row.routed_at}
    return {
        "event": row.id,
        "type": row.type,
        "routedAt": None if row.routed_at is None else iso_epoch(row.routed_at),
        "rules": [_rule(v, by_rule.get(v.rule, []), ruleset, started) for v in verdicts],
        "rulesFile": {"digest": ruleset.digest, "source": ruleset.source},
        "rulesAsOf": as_of,
        "duplicates": row.duplicates,
        "traceId": row.trace_id,
    }


def _rule(
    verdict: RuleOutcome, rows: Sequence[OutboxRow], ruleset: Ruleset, started: set[str]
) -> dict[str, Any]:
    if verdict.status == "not evaluated":
        reason = f'not evaluated: rule "{verdict.skipped_by}" matched first and does not continue'
        return {"rule": verdict.rule, "matched": False, "reason": reason}
    if verdict.status == "not matched":
        reason = "; ".join(c.reason for c in verdict.failed)
        return {"rule": verdict.rule, "matched": False, "reason": reason}
    own = [r for r in rows if r.kind == "event"]
    decision, reason = _decision(own, ruleset, verdict, started)
    return {
        "rule": verdict.rule,
        "matched": True,
        "decision": decision,
        "reason": reason,
        "notifications": [_notification(r) for r in rows],
    }


def _decision(
    own: Sequence[OutboxRow], ruleset: Ruleset, verdict: RuleOutcome, started: set[str]
) -> tuple[str, str]:
    """The decision the rule's own rows record, and its reason."""
    if not own:
        rule = ruleset.by_name.get(verdict.rule)
        if rule is not None and rule.escalate is not None and not rule.notify:
            policy = rule.escalate.name
            if rule.name in started:
                return "sent", f"escalation {policy} started: its steps page (see the alert)"
            return (
                "deduplicated",
                f"escalation {policy} was already running for its alert: nothing new started",
            )
        if verdict.notifiers == (ESCALATE_ONLY,) or not verdict.notifiers:
            return "sent", "no notifier of its own"
        return "stale", "no notification was recorded for it"
    states = [r.state for r in own]
    first = own[0]
    decision = DECISIONS.get(first.state, first.state)
    if any(DECISIONS.get(s) == "sent" for s in states):
        decision = "sent"
    reason = first.reason or {"sent": "sent", "held": "held"}.get(decision, decision)
    return decision, reason


def _notification(row: OutboxRow) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "notifier": row.notifier,
        "target": row.target,
        "kind": row.kind,
        "state": row.state,
        "reason": row.reason,
    }


async def _ruleset(store: Store, digest: str) -> Ruleset | None:
    if digest in _KEPT:
        return _KEPT[digest]
    kept = await store.events.rules(digest)
    if kept is None:
        return None
    source, text = kept
    try:
        ruleset = load_text(text, {}, source=source, lenient_env=True)
    except ConfigError:  # a file that loaded then loads now: only a newer check refuses it
        return None
    if len(_KEPT) >= 8:
        _KEPT.pop(next(iter(_KEPT)))
    _KEPT[digest] = ruleset
    return ruleset


REDACTED = "${RECEIVER_REDACTED_URL}"  # what a kept rules file has for each notifier url


def shareable(text: str) -> str:
    """A rules file as routing keeps it for explain: every notifier url replaced by an unset
    ${VAR} (a url written into the file, token and all, must not rest in the database; the
    verdicts need none). Loaded with lenient_env, the file routes as the original did."""
    raw = yaml.safe_load(text)
    notifiers = raw.get("notifiers") if isinstance(raw, dict) else None
    if not isinstance(notifiers, dict):
        return text
    for name, value in notifiers.items():
        notifiers[name] = [REDACTED] * len(value) if isinstance(value, list) else REDACTED
    return str(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))


def lines(found: Mapping[str, Any]) -> list[str]:
    """The explanation for a terminal (receiver explain --event)."""
    routed = found["routedAt"] or "not routed yet"
    head = [
        f"event {found['event']} ({found['type']}), routed {routed}",
        f"rules {found['rulesFile']['source']} ({found['rulesFile']['digest']}, as of "
        f"{found['rulesAsOf']})",
    ]
    if found["duplicates"]:
        head.append(f"deduplicated: {found['duplicates']} more deliveries of it, routed once")
    if found.get("traceId"):
        head.append(f"trace {found['traceId']}")
    for number, rule in enumerate(found["rules"], start=1):
        if not rule["matched"]:
            head.append(f"{number}. {rule['rule']}: not matched: {rule['reason']}")
            continue
        head.append(f"{number}. {rule['rule']}: {rule['decision']}: {rule['reason']}")
        for n in rule["notifications"]:
            head.append(
                f"     #{n['id']} {n['kind']} -> {n['notifier']}[{n['target']}]: {n['state']}"
            )
    return head
