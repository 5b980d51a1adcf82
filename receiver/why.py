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
from dataclasses import dataclass
from typing import Any

from receiver.dispatch.alerts import alert_id
from receiver.errors import ConfigError
from receiver.events import iso_epoch, load_stored
from receiver.rules import Rule, Ruleset, format_duration, load_text
from receiver.rules.rule import ESCALATE_ONLY
from receiver.rules.verdict import RuleOutcome
from receiver.store import Store
from receiver.store.records import Chain, OutboxQuery, OutboxRow

# A notification's state -> the decision it stands for (DESIGN.md's names).
DECISIONS = {
    "pending": "sent", "sending": "sent", "delivered": "sent", "dead": "sent",
    "held": "held", "cancelled": "held", "grouped": "digest", "throttled": "throttled",
    "silenced": "silenced", "muted": "quiet", "inhibited": "inhibited", "storm": "storm",
    "stale": "stale", "flapping": "flapping", "maintenance": "maintenance",
}  # fmt: skip
# Routing states of an escalating rule's first pages when its chain did not start
# (receiver.dispatch.pipeline.UNPAGED); the states a released held row moves through; the
# reasons routing gives a held row (Pipeline._state).
UNPAGED = ("stale", "silenced", "muted", "inhibited", "storm", "flapping", "maintenance")
RELEASED = ("pending", "sending", "delivered", "dead")
HELD_REASONS = ("hold ", "deferred to ")
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
    for out in sorted(rows, key=lambda r: r.id):  # oldest first
        by_rule.setdefault(out.rule, []).append(out)
    verdicts = ruleset.explain(payload, at=row.received_at).rules
    # The escalations this event started (in its routing transaction): a rule that only
    # escalates started one, or found its alert's already running (deduplicated).
    aid = alert_id(payload)
    chains = await store.alerts.chains(aid) if aid is not None else []
    seen = _Seen(row.id, aid, row.routed_at, chains)
    return {
        "event": row.id,
        "type": row.type,
        "routedAt": None if row.routed_at is None else iso_epoch(row.routed_at),
        "rules": [_rule(v, by_rule.get(v.rule, []), ruleset, seen) for v in verdicts],
        "rulesFile": {"digest": ruleset.digest, "source": ruleset.source},
        "rulesAsOf": as_of,
        "duplicates": row.duplicates,
        "traceId": row.trace_id,
    }


@dataclass(frozen=True)
class _Seen:
    """What explain knows of the event beside a rule's rows: its alert, when it was
    routed, and the chains its routing started (by rule)."""

    event: str
    alert: str | None
    routed_at: float | None
    chains: Sequence[Chain]

    def chain(self, rule: str, *, started: bool) -> Chain | None:
        """The rule's chain that the event started, or started again while it waited (or,
        not started: one that ran before it). Its log names the events that started it; a
        chain from before it did, by its start being the event's routing."""
        for c in self.chains:
            if c.rule != rule or (self.routed_at is not None and c.started_at > self.routed_at):
                continue
            by = {e.get("eventId") for e in c.log if e.get("event") == "started"} - {None}
            if (self.event in by if by else c.started_at == self.routed_at) is started:
                return c
        return None

    def start_note(self, chain: Chain) -> str:
        """The note of the chain's start by this event (its first entry's, in a chain from
        before its log named the events that started it)."""
        mine = [e for e in chain.log if e.get("eventId") == self.event] or chain.log or [{}]
        return str(mine[0].get("note") or "")


def _rule(
    verdict: RuleOutcome, rows: Sequence[OutboxRow], ruleset: Ruleset, seen: _Seen
) -> dict[str, Any]:
    resolved = [r for r in rows if r.kind == "resolved"]
    if verdict.status != "matched":
        if verdict.status == "not evaluated":
            reason = (
                f'not evaluated: rule "{verdict.skipped_by}" matched first and does not continue'
            )
        else:
            reason = "; ".join(c.reason for c in verdict.failed)
        entry: dict[str, Any] = {"rule": verdict.rule, "matched": False, "reason": reason}
        if resolved:  # the closing event of an alert the rule notified about
            said = f"{_resolved(seen.alert, resolved)} (the rule did not match it: {reason})"
            at = iso_epoch(resolved[0].created_at)
            entry.update(
                decision="sent",
                reason=said,
                states=[{"decision": "sent", "at": at, "reason": said}],
                notifications=[_notification(r) for r in rows],
            )
        return entry
    states = _states(rows, ruleset, verdict, seen)
    decision, reason = states[0]["decision"], states[0]["reason"]
    if resolved:
        reason = f"{reason}; {_resolved(seen.alert, resolved)}"
    return {
        "rule": verdict.rule,
        "matched": True,
        "decision": decision,
        "reason": reason,
        "states": states,
        "notifications": [_notification(r) for r in rows],
    }


def _resolved(alert: str | None, rows: Sequence[OutboxRow]) -> str:
    n = len(rows)
    return f"resolved alert {alert}: {n} resolved message{'s' if n != 1 else ''}"


def _states(
    rows: Sequence[OutboxRow], ruleset: Ruleset, verdict: RuleOutcome, seen: _Seen
) -> list[dict[str, Any]]:
    """What routing decided for the rule's notification of the event (its rows then), and
    each state it went through since, with its time: the decision first."""
    routed = seen.routed_at if seen.routed_at is not None else float("inf")
    own = [r for r in rows if r.created_at <= routed and _decided_by_routing(r)]
    if not own:
        return [_without_rows(ruleset, verdict, seen)]
    first = own[0]
    decision = _routed_as(first)
    reason = first.reason
    if first.state == "cancelled":  # its reason now says why it was cancelled
        reason = _held_reason(ruleset.by_name.get(verdict.rule))
    states = [_state(decision, first.created_at, _plain(decision, reason))]
    if decision == "held" and first.state == "cancelled":
        states.append(_state("cancelled", first.updated_at, first.reason))
    elif decision == "held" and first.state != "held":  # released since
        states.append(_state(DECISIONS[first.state], first.updated_at, None))
    for r in rows:  # sent later: woken when a silence, quiet hours or an inhibition ended
        if r.kind == "event" and r.created_at > routed:
            states.append(_state(DECISIONS.get(r.state, r.state), r.created_at, r.reason))
    return states


def _held_reason(rule: Rule | None) -> str:
    """What routing said of a notification it held, as Pipeline._state says it."""
    if rule is not None and rule.hold is not None:
        return f"hold {format_duration(rule.hold)}"
    if rule is not None and rule.active is not None and rule.active.defer:
        return f"deferred to the active window ({rule.active.text})"
    return "held"


def _decided_by_routing(row: OutboxRow) -> bool:
    """A row routing wrote for the rule's notification: its own, or (for an escalating
    rule whose chain it did not start) the pages the chain's first step would send."""
    return row.kind == "event" or (row.kind == "escalation" and row.state in UNPAGED)


def _routed_as(row: OutboxRow) -> str:
    """The decision routing took for a row, whatever became of it since: a held row
    keeps its reason when it is released, and a cancelled one was held."""
    if row.state == "cancelled" or (
        row.state in RELEASED and (row.reason or "").startswith(HELD_REASONS)
    ):
        return "held"
    return DECISIONS.get(row.state, row.state)


# The why of a state whose rows carry no reason of their own, rather than its decision
# said again ("sent — sent").
_PLAIN_REASONS = {"sent": "matched, and nothing held it back: queued for its targets"}


def _state(decision: str, at: float, reason: str | None) -> dict[str, Any]:
    why = reason or _PLAIN_REASONS.get(decision, decision)
    return {"decision": decision, "at": iso_epoch(at), "reason": why}


def _plain(decision: str, reason: str | None) -> str:
    """reason without a head that says the decision again ("storm: over 10 in 1m" is a
    storm row's reason; explain shows the decision beside it)."""
    text = reason or _PLAIN_REASONS.get(decision, decision)
    for head in (f"{decision}: ", f"{decision} "):
        if text.startswith(head) and len(text) > len(head):
            return text[len(head) :]
    return text


def _without_rows(ruleset: Ruleset, verdict: RuleOutcome, seen: _Seen) -> dict[str, Any]:
    """The decision of a matching rule that wrote no row for the event."""
    at = seen.routed_at or 0.0
    rule = ruleset.by_name.get(verdict.rule)
    if rule is not None and rule.escalate is not None and not rule.notify:
        policy = rule.escalate.name
        chain = seen.chain(rule.name, started=True)
        if chain is not None:
            note = seen.start_note(chain)
            if note.startswith("held"):
                return _state("held", at, f"escalation {policy} started, {note}")
            return _state(
                "sent", at, f"escalation {policy} started: its steps page (see the alert)"
            )
        if seen.chain(rule.name, started=False) is not None:
            return _state(
                "deduplicated",
                at,
                f"escalation {policy} was already running for its alert: nothing new started",
            )
    if verdict.notifiers == (ESCALATE_ONLY,) or not verdict.notifiers:
        return _state("sent", at, "no notifier of its own")
    return _state("stale", at, "no notification was recorded for it")


def _notification(row: OutboxRow) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "notifier": row.notifier,
        "target": row.target,
        "kind": row.kind,
        "state": row.state,
        "reason": row.reason,
        "createdAt": iso_epoch(row.created_at),
        "updatedAt": iso_epoch(row.updated_at),
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
    # The file as routing used it, not its kept copy (urls redacted): the digest is the
    # one `receiver check` prints for it.
    ruleset.digest = digest
    if len(_KEPT) >= 8:
        _KEPT.pop(next(iter(_KEPT)))
    _KEPT[digest] = ruleset
    return ruleset


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
        if "decision" not in rule:
            head.append(f"{number}. {rule['rule']}: not matched: {rule['reason']}")
            continue
        head.append(f"{number}. {rule['rule']}: {rule['decision']} — {rule['reason']}")
        for state in rule.get("states", [])[1:]:
            head.append(f"     then {state['decision']} at {state['at']} — {state['reason']}")
        for n in rule["notifications"]:
            head.append(
                f"     #{n['id']} {n['kind']} -> {n['notifier']}[{n['target']}]: {n['state']}"
            )
    return head
