"""Escalation chains, and notifications that wait for a silence to end.

A rule with `escalate: POLICY` starts a chain when its alert opens (receiver.rules.escalations
says what a policy is): the policy is frozen into the store with it, and each step is a timer
(next_at) that the timers of one replica at a time fire (Router.tick, under the "timers"
lock; on PostgreSQL the due rows are locked besides). A step pages only while the alert is
open and unacknowledged:

- acknowledged: the chain stops; with `reack`, when the ack is that old and the alert is
  still open, the ack is removed (recorded as an "unack" action) and the current step pages
  again, and the chain goes on from there;
- resolved: the chain ends; everyone it paged gets the resolved message (Pipeline);
- silenced, or outside the rule's active window (quiet hours): the step is skipped (its rows
  are kept as silenced or muted, and the chain's log says so) and the chain waits; when the
  silence ends with the alert still open, it starts again from its first step, whose message
  says "was silenced since ...";
- snoozed: the chain waits for the snooze's end, then goes on from where it was.

A lifecycle rule's notification silenced or muted when its alert opened is likewise noted
(tx.notices.suppress) and sent once when that ends, if the alert is still open (wake()).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from receiver.dispatch.alerts import opener, payload
from receiver.dispatch.inhibition import suppression
from receiver.dispatch.silences import Active
from receiver.durations import format_duration
from receiver.links import Links
from receiver.logs import LogLimiter
from receiver.rules import Decision, Rule, Ruleset
from receiver.rules.escalations import Policy
from receiver.rules.rule import ESCALATE_ONLY, Rendered
from receiver.rules.schedules import PREFIX
from receiver.rules.templates import DEFAULT_BODY, DEFAULT_TITLE
from receiver.store import systemic
from receiver.store.base import Tx
from receiver.store.records import Alert, Chain, Notice, Notification, Waiting, waiting_key

log = logging.getLogger("receiver.lifecycle")
_limited = LogLimiter(log)  # a notice that cannot be woken is tried again every second

KIND = "escalation"  # the outbox kind of a step's pages
# States of a notification that waits for what suppressed it to end (wake()).
SUPPRESSED = ("silenced", "muted", "inhibited", "maintenance")
RETRY_FAILED = 60  # seconds before a chain that failed is tried again
# Where wake() goes on from: (suppressed_since, alert) of the notices' and the chains' last.
Cursors = tuple[Waiting | None, Waiting | None]


def start(
    tx: Tx,
    rule: Rule,
    alert: Alert,
    now: float,
    *,
    state: str,
    why: str | None = None,
    release_at: float | None = None,
    event: str | None = None,
) -> None:
    """Start the rule's chain for the alert's episode (once): its first step after its
    `after`, counted from now, or from release_at when the rule holds its notification
    (hold, a deferred active window). A notification silenced or muted starts the chain
    suppressed: it waits for the silence to end. event: the event that starts it (its
    log says so, for explain)."""
    policy = rule.escalate
    assert policy is not None
    suppressed = state in SUPPRESSED
    base = release_at if state == "held" and release_at is not None else now
    first = None if suppressed else base + policy.steps[0].after
    entry = {
        "at": now,
        "event": "started",
        "note": _started(state, base, suppressed),
        **({"eventId": event} if event is not None else {}),
    }
    if first is None or event is None or not _restart(tx, alert, rule.name, first, entry):
        tx.escalations.start(
            Chain(
                alert.id,
                alert.episode,
                rule.name,
                policy.to_json(),
                0,
                0,
                first,
                now,
                now if suppressed else None,
                (why or state) if suppressed else None,
                [entry],
            )  # fmt: skip
        )
    if not suppressed:
        tx.notices.add(alert.id, alert.episode, rule.name, now, rule.repeat)


def _restart(tx: Tx, alert: Alert, rule: str, first: float, entry: dict[str, Any]) -> bool:
    """Start again, from step one, the rule's chain of the episode that waits for a silence
    or quiet hours to end, when a later event that is not suppressed starts it: its log
    names that event, whose pages they are from now on (_starter). Whether one waited."""
    for chain in tx.escalations.of(alert.id, alert.episode):
        if chain.rule == rule and chain.next_at is None and chain.suppressed_since is not None:
            chain.step, chain.next_at = 0, first
            chain.log.append(entry)
            tx.escalations.save(chain)
            return True
    return False


def _started(state: str, base: float, suppressed: bool) -> str:
    """The note of a chain's start: whether it waits, and for what (explain reads it)."""
    if suppressed:
        return f"{state}: waits"
    return f"held: its first step counts from {_clock(base)}" if state == "held" else ""


def first_pages(ruleset: Ruleset, rule: Rule, first: Decision, now: float) -> list[Notification]:
    """The pages the rule's chain would send at its first step, with the texts of its
    notification first (the event's): kept, never sent, when the event starts no chain
    (silenced, quiet, inhibited, stale, held back by a storm), so that every alert has a
    row that says what became of it."""
    policy = rule.escalate
    assert policy is not None
    known = [t for t in policy.steps[0].notify if defined(ruleset, t)]
    rendered = Rendered(first.title, first.body, None, None, first.fallback, first.error)
    where = f"escalation {policy.name}: step 1 of {len(policy.steps)}"
    return [
        _note(ruleset, d, f"{d.body}\n{where}")
        for d in ruleset.on_call(rule.decisions_for(known, rendered, ruleset.notifiers), now)
    ]


def run(
    tx: Tx,
    ruleset: Ruleset,
    now: float,
    *,
    silences: Active,
    counts: Counter[str],
    links: Links | None = None,
) -> None:
    """Every chain due by now looks at its alert and pages, waits or stops. A chain that
    fails (a bug, a row that cannot be read) is a failed attempt: logged, counted
    (receiver_notifications_total{outcome="escalation_failed"}) and tried again in
    RETRY_FAILED seconds; the others go on."""
    chains = tx.escalations.due(now)
    if not chains:
        return
    # Their alerts read at once, locked in id order on PostgreSQL (the order a routing batch
    # locks in): one by one in due order could deadlock with a batch holding two of them.
    tx.alerts.read_ahead(c.alert for c in chains)
    try:
        for chain in chains:
            try:
                with tx.savepoint():
                    _look(tx, ruleset, chain, now, silences, counts, links)
                    tx.escalations.save(chain)
            except Exception as exc:  # noqa: BLE001 - one chain's fault, not the timers'
                if systemic(exc):
                    raise  # the database's: the timers loop pauses and retries
                _failed(tx, chain, now, exc, counts)
    finally:
        tx.alerts.forget()  # nothing here changes an alert: nothing to write back


def _failed(tx: Tx, chain: Chain, now: float, exc: Exception, counts: Counter[str]) -> None:
    log.exception(
        "escalation of %s (rule %s) failed; trying again in %ds",
        chain.alert,
        chain.rule,
        RETRY_FAILED,
    )
    counts["escalation_failed"] += 1
    chain.next_at = now + RETRY_FAILED
    chain.log.append({"at": now, "event": "failed", "note": f"{type(exc).__name__}: {exc}"[:200]})
    with contextlib.suppress(Exception):  # a row that cannot even be saved stays due
        with tx.savepoint():
            tx.escalations.save(chain)


def _look(
    tx: Tx,
    ruleset: Ruleset,
    chain: Chain,
    now: float,
    silences: Active,
    counts: Counter[str],
    links: Links | None,
) -> None:
    policy = Policy.from_json(chain.policy)
    alert = tx.alerts.get(chain.alert)
    if alert is None or alert.state != "open" or alert.episode != chain.episode:
        chain.next_at = chain.suppressed_since = chain.suppressed_why = None
        chain.log.append({"at": now, "event": "ended", "note": "the alert is resolved"})
        return
    again = False
    ack = tx.escalations.acked(alert.id, alert.episode)
    if ack is not None:
        by, acked_at = ack
        if policy.reack is None:
            chain.next_at = chain.suppressed_since = chain.suppressed_why = None
            chain.log.append({"at": now, "event": "acked", "note": f"acknowledged by {by}"})
            return
        if now < acked_at + policy.reack:
            if chain.next_at != acked_at + policy.reack:
                when = _clock(acked_at + policy.reack)
                note = f"acknowledged by {by}; pages again at {when} if still open"
                chain.log.append({"at": now, "event": "acked", "note": note})
            chain.next_at = acked_at + policy.reack
            return
        reack = format_duration(policy.reack)
        tx.escalations.unack(alert.id, alert.episode, now, f"reack {reack}")
        note = f"acknowledged by {by} {reack} ago and still open: paged again"
        chain.log.append({"at": now, "event": "reack", "note": note})
        if chain.step == 0 and chain.round > 0:
            # Between rounds the current step is the last round's last: page that again,
            # and the next round starts its gap after it (not at once, unannounced).
            chain.step, chain.round = len(policy.steps), chain.round - 1
        again = chain.step > 0
    elif chain.step >= len(policy.steps):
        # A chain that ran out falls due again only when a snooze ended (store.alerts.snooze):
        # its last step pages again, and the log says why.
        note = "the snooze ended and the alert is still open: the last step pages again"
        chain.log.append({"at": now, "event": "snooze ended", "note": note})
    starter = _starter(tx, chain, alert)
    rule = ruleset.by_name.get(chain.rule)
    index = chain.step - 1 if again or chain.step >= len(policy.steps) else chain.step
    held = suppression(tx, ruleset, rule, starter[1], silences, now, alert.id)
    if held is not None:
        state, why, reason = held
        _page(tx, ruleset, chain, policy, index, now, starter, links, state=state, reason=reason)
        chain.log.append({"at": now, "event": "skipped", "step": index + 1, "note": reason})
        chain.next_at = None
        chain.suppressed_since = chain.suppressed_since or now
        chain.suppressed_why = why
        counts[state] += 1
        return
    _page(tx, ruleset, chain, policy, index, now, starter, links, again=again)
    counts[KIND] += 1
    chain.suppressed_since = chain.suppressed_why = None
    if index == chain.step:
        chain.step += 1
    if chain.step < len(policy.steps):
        chain.next_at = now + policy.steps[chain.step].after
    elif chain.round < policy.repeat:
        chain.round, chain.step = chain.round + 1, 0
        chain.next_at = now + policy.round_gap + policy.steps[0].after
    else:
        if chain.next_at is not None and index == len(policy.steps) - 1 and not again:
            chain.log.append({"at": now, "event": "done", "note": "the chain ran out"})
        chain.next_at = None


def _page(
    tx: Tx,
    ruleset: Ruleset,
    chain: Chain,
    policy: Policy,
    index: int,
    now: float,
    starter: tuple[str, Mapping[str, Any]],
    links: Links | None,
    *,
    again: bool = False,
    state: str = "pending",
    reason: str | None = None,
) -> None:
    """The step's messages: the rule's title and body for the event that started the
    chain (starter: its id and payload), filed under it, to each of the step's targets (a
    schedule's member on call now), noted as this step."""
    event_id, opened = starter
    step = policy.steps[index]
    rule = ruleset.by_name.get(chain.rule) or Rule(chain.rule, (), (), DEFAULT_TITLE, DEFAULT_BODY)
    seen = (
        opened
        if links is None
        else {**opened, "links": links.for_alert(chain.alert, chain.episode)}
    )
    rendered = rule.render(seen)
    known = [t for t in step.notify if defined(ruleset, t)]
    decisions = ruleset.on_call(rule.decisions_for(known, rendered, ruleset.notifiers), now)
    where = f"escalation {policy.name}: step {index + 1} of {len(policy.steps)}"
    if policy.repeat:
        where += f", round {chain.round + 1} of {policy.repeat + 1}"
    if again:
        where += "; paged again: the acknowledgement ran out"
    if chain.suppressed_since is not None and state == "pending":
        where += (
            f"; was {chain.suppressed_why or 'silenced'} since {_clock(chain.suppressed_since)}"
        )
    for d in decisions:
        n = _note(ruleset, d, f"{d.body}\n{where}")
        tx.outbox.add(
            event_id,
            n,
            state=state,
            reason=reason,
            now=now,
            kind=KIND,
            alert=chain.alert,
            episode=chain.episode,
        )
    if state == "pending":
        entry: dict[str, Any] = {
            "at": now,
            "event": "paged",
            "step": index + 1,
            "round": chain.round + 1,
            "to": list(dict.fromkeys(d.notifier for d in decisions)),
        }
        missing = [t for t in step.notify if t not in known]
        if missing:
            entry["note"] = f"no longer defined, not paged: {', '.join(missing)}"
        chain.log.append(entry)


def defined(ruleset: Ruleset, target: str) -> bool:
    if target.startswith(PREFIX):
        return target.removeprefix(PREFIX) in ruleset.schedules
    return target in ruleset.notifiers


def wake(
    tx: Tx,
    ruleset: Ruleset,
    now: float,
    *,
    silences: Active,
    counts: Counter[str],
    links: Links | None = None,
    after: Cursors = (None, None),
    limit: int = 500,
) -> Cursors:
    """Notifications and chains that wait for a silence or quiet hours to end: those whose
    alert is still open and no longer silenced or muted are notified once ("was silenced
    since ..."), and their chains start from their first step; those whose alert resolved
    meanwhile send nothing and stop waiting. At most limit of each a look, from after on:
    the cursors to go on from next time (None: from the start)."""
    notices = tx.notices.suppressed(after[0], limit)
    for notice in notices:
        try:
            with tx.savepoint():
                _wake_notice(tx, ruleset, notice, now, silences, counts, links)
        except Exception as exc:  # noqa: BLE001 - one notice's fault: the rest go on
            if systemic(exc):
                raise
            counts["escalation_failed"] += 1
            _limited.warning(
                "notices that failed to wake",
                notice.alert,
                "waking %s (rule %s) after its silence failed: %s; trying again",
                notice.alert,
                notice.rule,
                exc,
            )
    chains = tx.escalations.suppressed(after[1], limit)
    for chain in chains:
        try:
            with tx.savepoint():
                _wake_chain(tx, ruleset, chain, now, silences)
        except Exception as exc:  # noqa: BLE001 - a failed attempt, as in run()
            if systemic(exc):
                raise
            _failed(tx, chain, now, exc, counts)
    return (
        waiting_key(notices[-1]) if len(notices) == limit else None,
        waiting_key(chains[-1]) if len(chains) == limit else None,
    )


def _wake_notice(
    tx: Tx,
    ruleset: Ruleset,
    notice: Notice,
    now: float,
    silences: Active,
    counts: Counter[str],
    links: Links | None,
) -> None:
    alert = tx.alerts.get(notice.alert)
    rule = ruleset.by_name.get(notice.rule)
    if alert is None or alert.state != "open" or alert.episode != notice.episode or not rule:
        tx.notices.woke(notice, now, None)
        return
    event_id, fields = _suppressed_event(tx, notice, alert)
    if suppression(tx, ruleset, rule, fields, silences, now, alert.id) is not None:
        return
    seen = (
        fields if links is None else {**fields, "links": links.for_alert(alert.id, alert.episode)}
    )
    why, at = notice.suppressed_why or "silenced", notice.suppressed_since or now
    since = f"was {why} since {_clock(at)}"
    for d in ruleset.on_call(rule.decisions(rule.render(seen), ruleset.notifiers), now):
        if d.notifier == ESCALATE_ONLY:
            continue
        n = _note(ruleset, d, f"{d.body}\n{since}")
        tx.outbox.add(
            event_id, n, state="pending", now=now, alert=alert.id, episode=alert.episode,
            reason=since,
        )  # fmt: skip
    tx.notices.woke(notice, now, rule.repeat)
    counts["woke"] += 1


def _suppressed_event(tx: Tx, notice: Notice, alert: Alert) -> tuple[str, dict[str, Any]]:
    """The event whose notification the notice holds, and its payload: the woken row is
    filed under it, so that explaining that event shows it sent, and rendered and judged
    by its fields (an update can match a silence its opener does not). A notice noted
    before the store kept that event is the opener's; an event no longer stored is read
    as its opener."""
    return _event_or_opener(tx, notice.suppressed_event, alert)


def _starter(tx: Tx, chain: Chain, alert: Alert) -> tuple[str, dict[str, Any]]:
    """The event that started the chain (its log's last "started" entry names it: a later
    event starts a waiting chain again, _restart) and its payload: the chain's pages are
    filed under it, so that explaining that event lists them, and rendered and judged by
    its fields (an update that started the chain can match a silence its alert's opener
    does not). A chain started before its log named its event is the opener's; an event
    no longer stored is read as its opener."""
    started = (e for e in reversed(chain.log) if e.get("event") == "started")
    last = next(started, None)
    event = None if last is None else last.get("eventId")
    return _event_or_opener(tx, event if isinstance(event, str) else None, alert)


def _event_or_opener(tx: Tx, event: str | None, alert: Alert) -> tuple[str, dict[str, Any]]:
    if event is None:
        return alert.opened_event or "-", opener(tx, alert)
    found = payload(tx, event)
    return event, opener(tx, alert) if found is None else found


def _wake_chain(tx: Tx, ruleset: Ruleset, chain: Chain, now: float, silences: Active) -> None:
    alert = tx.alerts.get(chain.alert)
    if alert is None or alert.state != "open" or alert.episode != chain.episode:
        chain.suppressed_since = chain.suppressed_why = None
        chain.log.append({"at": now, "event": "ended", "note": "resolved while suppressed"})
        tx.escalations.save(chain)
        return
    rule = ruleset.by_name.get(chain.rule)
    fields = _starter(tx, chain, alert)[1]
    if suppression(tx, ruleset, rule, fields, silences, now, alert.id) is not None:
        return
    policy = Policy.from_json(chain.policy)
    chain.step = 0
    chain.next_at = now + policy.steps[0].after
    note = f"no longer {chain.suppressed_why or 'silenced'}: the chain starts again"
    chain.log.append({"at": now, "event": "resumed", "note": note})
    tx.escalations.save(chain)
    tx.notices.add(alert.id, alert.episode, chain.rule, now, rule.repeat if rule else None)


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _note(ruleset: Ruleset, d: Decision, body: str) -> Notification:
    """d's notification with body, sent by the channel of its url."""
    return Notification(
        d.rule, d.notifier, d.target, d.title, body, channel=ruleset.channel(d.notifier, d.target)
    )
