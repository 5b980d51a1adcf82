"""Where each notification of a routed event goes: sent, held, cancelled, muted, deferred,
silenced, grouped into a digest, throttled or stale, and the resolved messages an alert's
resolve sends; an operator's replay sends again whatever the lifecycle would say.

The alert state machine is receiver.dispatch.alerts; digests, silences and the timers
(repeats, the heartbeat) have modules of their own beside this one. Everything here runs
inside one store transaction (receiver.store.base.Tx).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from receiver import tracing
from receiver.dispatch import digests, escalations, flap, inhibition, storm, timers
from receiver.dispatch.alerts import Transition, alert_id, apply, event_time, open_seconds, opener
from receiver.dispatch.silences import active_silences, silencing
from receiver.links import NO_LINKS, Links
from receiver.rules import Decision, Rule, Ruleset, format_duration
from receiver.rules.maintenance import held_reason, holding
from receiver.rules.options import CLOSES, OPENS
from receiver.rules.rule import ESCALATE_ONLY, Rendered
from receiver.store.base import Tx
from receiver.store.records import Alert, Notification, Replay, Silence

REPLAY_PREFIX = "[replay] "  # before the title of every notification an operator's replay sends

_RULE = operator.attrgetter("rule")  # a decision's rule, to group decisions by

UNTITLED = Rendered("", "", None, None, fallback=False)  # a notification whose texts nobody reads
# The states of an escalating rule's notification that page nobody at once: its chain's
# first pages are then kept with that state (Pipeline._unpaged).
UNPAGED = ("stale", "silenced", "muted", "inhibited", "storm", flap.STATE, "maintenance")


class Pipeline:
    """Routes one batch: each event's decisions placed through the lifecycle into the outbox."""

    # False for `receiver backtest`, which counts notifications and never reads their texts:
    # a digest's text is then not written again for each member (most of a digest's cost),
    # and resolved messages are not rendered.
    texts = True

    def __init__(self, tx: Tx, ruleset: Ruleset, now: float, *, links: Links | None = None) -> None:
        self.tx = tx
        self.links = links  # the one-click action links (RECEIVER_PUBLIC_URL), if on
        self.ruleset = ruleset
        self.now = now
        self.counts: Counter[str] = Counter()
        # Rules whose template failed: how many notifications, and the last error.
        self.failed: dict[str, tuple[int, str]] = {}
        self.silences = active_silences(tx.silences.active(now))
        self._replay: Replay | None = None  # the operator's replay being routed, if any
        # The event's routing span (receiver.tracing), and the trace context of each rule's
        # decision about it: the rows it queues carry theirs. Empty while tracing is off.
        self._span: Any = None
        self._decided: dict[str, str | None] = {}
        # The rules under which the event's alert is flapping (receiver.dispatch.flap).
        self._flapping: dict[str, flap.Flapping] = {}
        self.source_ended = False  # an inhibition's source closed: wake what it held now

    def event(
        self,
        event_id: str,
        payload: Mapping[str, Any],
        decisions: Sequence[Decision],
        *,
        replay: int | None = None,
        transition: Transition | None = None,
        span: Any = None,
    ) -> None:
        """Route one event; replay names the operator's request when it is routed again
        (`receiver replay`): then it is sent whatever the lifecycle says, unless the
        request asks to respect it, and every row it produces is marked as a replay.
        transition: what the event did to its alert, when apply() has been run already
        (`receiver backtest` applies each event once for all the rules files it replays).
        span: the event's routing span (receiver.tracing), None while tracing is off."""
        self._span = span
        self._replay = self.tx.events.replay_request(replay) if replay is not None else None
        # A schedule target names the member on call now, as the row will.
        decisions = self.ruleset.on_call(decisions, self.now)
        try:
            if self._replay is not None and not self._replay.respect_lifecycle:
                self._send_again(event_id, payload, decisions)
            else:
                if transition is None:  # else the backtest applied it, and tracks sources
                    transition = apply(self.tx, payload, event_id, self.now)
                    if inhibition.track(self.tx, self.ruleset, payload, transition, event_id):
                        self.source_ended = True
                # Counted by each rules file (the backtest's too): each has its own rules.
                self._flapping = flap.count(
                    self.tx, self.ruleset, event_id, transition, (d.rule for d in decisions),
                    self.now,
                )  # fmt: skip
                self._announce(payload, transition)
                if transition.what == "resolve":
                    self._resolve(event_id, payload, transition.alert)
                for name, group in itertools.groupby(decisions, key=_RULE):
                    rule = self.ruleset.by_name[name]
                    self._place(event_id, payload, rule, list(group), transition)
            if self._replay is not None:
                self.tx.events.replay_done(self._replay.id, self.now)
        finally:
            self._replay = None
            self._span = None
            self._decided.clear()
            self._flapping = {}

    def _announce(self, payload: Mapping[str, Any], transition: Transition) -> None:
        """The one message of each rule under which this change made the alert flap."""
        for name, flapping in self._flapping.items():
            if flapping.started and transition.alert is not None:
                flap.announce(
                    self.tx, self.ruleset, self.ruleset.by_name[name], transition.alert,
                    payload, self.now, silences=self.silences, links=self.links,
                    opened=flapping.opened,
                )  # fmt: skip
                self.counts["flap"] += 1

    def _add(self, event_id: str, n: Notification, **row: Any) -> None:
        """tx.add, marking the row (and its title) as a replay while one is routed."""
        if self._replay is not None:
            n = dataclasses.replace(n, title=f"{REPLAY_PREFIX}{n.title}")
            row["replay"] = self._replay.id
            if row.get("reason") is None:
                row["reason"] = f"replay #{self._replay.id}"
        if self._span is not None:  # its sends continue the decision's trace
            n.trace = self._decided.get(n.rule) or tracing.carrier(self._span)
        self.tx.outbox.add(event_id, n, **row)

    def _traced(self, rule: Rule, decisions: list[Decision], state: str, why: str | None) -> None:
        """A span for a rule's decision about the event being routed (traced only)."""
        span = tracing.child(
            self._span,
            f"rule {rule.name}",
            {
                tracing.RULE: rule.name,
                tracing.DECISION: state,
                tracing.REASON: why,
                tracing.NOTIFIER: ",".join(d.notifier for d in decisions),
            },
        )
        self._decided[rule.name] = tracing.carrier(span)
        tracing.end(span)

    def _send_again(
        self, event_id: str, payload: Mapping[str, Any], decisions: Sequence[Decision]
    ) -> None:
        """An operator's replay: every notification the rules give the event is sent,
        whatever the lifecycle would say (stale, silenced, muted, grouped, throttled, held),
        and the alert is left as it is. A lifecycle rule's rows join the alert's open
        episode when the event belongs to it, so that its resolve answers them too; an
        event that resolved the alert as it stands sends its resolved messages again."""
        aid = alert_id(payload)
        alert = self.tx.alerts.get(aid) if aid is not None else None
        ts = event_time(payload) if aid is not None else ""
        current = (
            alert is not None
            and alert.state == "open"
            and payload.get("type") in OPENS
            and ts >= (alert.opened_ts or ts)
        )
        for name, group in itertools.groupby(decisions, key=_RULE):
            rule = self.ruleset.by_name[name]
            joins = alert if current and rule.follows_alert else None
            for d in group:
                if d.notifier == ESCALATE_ONLY:
                    continue
                self._add(
                    event_id,
                    _notification(d, self.ruleset),
                    state="pending",
                    now=self.now,
                    alert=joins.id if joins else None,
                    episode=joins.episode if joins else None,
                )
            self.counts["pending"] += 1
            if joins is not None and (rule.resolve or rule.repeat):
                self.tx.notices.add(joins.id, joins.episode, rule.name, self.now, rule.repeat)
        if (
            alert is not None
            and alert.state == "resolved"
            and payload.get("type") in CLOSES
            and alert.resolved_ts == ts
        ):
            self._resolved_messages(event_id, payload, alert)

    def _place(
        self,
        event_id: str,
        payload: Mapping[str, Any],
        rule: Rule,
        decisions: list[Decision],
        transition: Transition,
    ) -> None:
        # A plain rule's notifications belong to their event, not to the alert: a resolve
        # never cancels them, and they are never the basis of a resolved message or a repeat.
        alert = transition.alert if rule.follows_alert else None
        where: dict[str, Any] = {
            "alert": alert.id if alert else None,
            "episode": alert.episode if alert else None,
        }
        state, reason, next_at, group = self._state(event_id, payload, rule, decisions, transition)
        if self._span is not None:
            self._traced(rule, decisions, state, reason)
        for d in decisions:
            if d.notifier == ESCALATE_ONLY:
                continue  # a rule that only escalates: its chain pages (below)
            self._add(
                event_id,
                _notification(d, self.ruleset),
                state=state,
                now=self.now,
                next_at=next_at,
                reason=reason,
                group_id=group,
                **where,
            )
        self.counts[state if state != "held" or rule.hold is None else "held"] += 1
        self.counts["fallback"] += decisions[0].fallback
        if decisions[0].error is not None:
            count = self.failed.get(rule.name, (0, ""))[0]
            self.failed[rule.name] = (count + len(decisions), decisions[0].error)
        if alert is None:
            return
        if rule.escalate is not None and not rule.notify and state in UNPAGED:
            self._unpaged(event_id, rule, decisions[0], alert, state, reason, group)
        if transition.what not in ("open", "update"):
            return
        why = reason.split(" (", 1)[0] if state == "inhibited" and reason else state
        if state == "maintenance" and reason:  # "was in maintenance: weekly-deploy since ..."
            why = "in " + reason.split(" (", 1)[0]
        if rule.escalate is not None and state not in ("stale", "grouped", "storm", flap.STATE):
            escalations.start(
                self.tx, rule, alert, self.now, state=state, why=why, release_at=next_at,
                event=event_id,
            )  # fmt: skip
        elif state in ("pending", "held") and (rule.resolve or rule.repeat):
            self.tx.notices.add(alert.id, alert.episode, rule.name, self.now, rule.repeat)
        if state in escalations.SUPPRESSED:  # notified when that ends, if still open
            self.tx.notices.suppress(
                alert.id, alert.episode, rule.name, self.now, why, event=event_id
            )

    def _unpaged(
        self,
        event_id: str,
        rule: Rule,
        first: Decision,
        alert: Alert,
        state: str,
        reason: str | None,
        group: int | None,
    ) -> None:
        """A rule that only escalates has no notification of its own to keep: the pages its
        chain would send first are kept instead, with the state that stopped them (never
        sent), when its alert's episode has no chain of the rule yet (a late event's
        always), so every alert has a row saying what became of it. A chain held back by
        a storm never starts; a suppressed one waits (escalations.start)."""
        assert rule.escalate is not None
        if state != "stale" and self._paging(rule, alert):
            return  # its chain runs (or waits) already: this event changes nothing there
        then = "not started" if state in ("storm", "stale") else "waits"
        note = f"{reason or state}; escalation {rule.escalate.name} {then}"
        for n in escalations.first_pages(self.ruleset, rule, first, self.now):
            self._add(
                event_id, n, state=state, now=self.now, reason=note, kind=escalations.KIND,
                group_id=group if state == "storm" else None, alert=alert.id,
                episode=alert.episode,
            )  # fmt: skip

    def _paging(self, rule: Rule, alert: Alert | None) -> bool:
        """Whether a rule that only escalates has a chain for the alert's episode already:
        an event of it then pages no one new, so a storm does not count it either."""
        if rule.escalate is None or rule.notify or alert is None:
            return False
        return any(c.rule == rule.name for c in self.tx.escalations.of(alert.id, alert.episode))

    def _state(
        self,
        event_id: str,
        payload: Mapping[str, Any],
        rule: Rule,
        decisions: list[Decision],
        transition: Transition,
    ) -> tuple[str, str | None, float | None, int | None]:
        """(state, reason, next_at, group id) for a rule's notifications of one event."""
        first = decisions[0]
        if transition.what == "stale" and transition.alert is not None and rule.follows_alert:
            return "stale", f"stale: alert already at {transition.alert.last_ts}", None, None
        flapping = self._flapping.get(rule.name)
        if flapping is not None:
            return flap.STATE, flapping.reason, None, None
        silence = self._silenced(payload)
        if silence is not None:
            return "silenced", f"silence #{silence.id}: {silence.reason}", None, None
        upkeep = holding(self.ruleset.maintenance, payload, self.now)
        if upkeep is not None:
            return "maintenance", held_reason(upkeep, self.now), None, None
        if self.ruleset.inhibit:
            held = inhibition.inhibiting(self.tx, self.ruleset, payload, alert_id(payload))
            if held is not None:
                return "inhibited", inhibition.reason(*held), None, None
        window = rule.active
        if window is not None and not window.contains(self.now):
            if window.defer:
                opens = window.next_open(self.now)
                self.counts["deferred"] += 1
                return "held", f"deferred to the active window ({window.text})", opens, None
            return "muted", f"muted outside the active window ({window.text})", None, None
        if rule.group is not None:
            group = self._group(event_id, payload, rule, decisions)
            return "grouped", f"in digest #{group}", None, group
        if first.throttle_seconds and self.tx.throttle.throttled(
            rule.name, first.throttle_key or "", self.now, first.throttle_seconds
        ):
            return "throttled", f"throttled: key {first.throttle_key!r}", None, None
        if rule.storm is not None and not self._paging(rule, transition.alert):
            rows = [
                _notification(d, self.ruleset) for d in decisions if d.notifier != ESCALATE_ONLY
            ]
            if rule.escalate is not None:  # its storm message goes to whom it pages first too
                first_pages = escalations.first_pages(self.ruleset, rule, first, self.now)
                rows = _distinct([*rows, *first_pages])
            stormed = storm.held(
                self.tx, event_id, payload, rule, rows, now=self.now, texts=self.texts,
                links=self.links,
            )  # fmt: skip
            if stormed is not None:
                return "storm", stormed[0], None, stormed[1]
        if rule.hold and transition.what == "open":
            return "held", f"hold {format_duration(rule.hold)}", self.now + rule.hold, None
        return "pending", None, None, None

    def _silenced(self, payload: Mapping[str, Any]) -> Silence | None:
        return silencing(self.silences, payload)

    # -- resolve ------------------------------------------------------------------------------

    def resolve(self, alert: Alert, payload: Mapping[str, Any]) -> None:
        """An operator resolved the alert (already saved resolved; receiver.dispatch.actions):
        what its closing event would do, payload standing in for that event."""
        if self.ruleset.inhibit:  # it inhibits nothing any more (the timers wake its targets)
            self.tx.inhibitors.remove(alert.id)
        self._resolve(alert.opened_event or "-", payload, alert)

    def _resolve(self, event_id: str, payload: Mapping[str, Any], alert: Alert | None) -> None:
        assert alert is not None
        self.counts["cancelled"] += self.tx.outbox.cancel_held(
            alert.id, alert.episode, self.now, "cancelled: resolved before it was sent"
        )
        if self._resolved_messages(event_id, payload, alert):
            self.tx.notices.end_repeats(alert.id, alert.episode)
            self.tx.escalations.end(alert.id, alert.episode, self.now, "the alert resolved")

    def _resolved_messages(self, event_id: str, payload: Mapping[str, Any], alert: Alert) -> bool:
        """A resolved message from each rule with resolve: true whose notification about the
        alert's episode was sent; whether any rule noticed the episode at all."""
        notices = self.tx.notices.of(alert.id, alert.episode)
        if not notices:
            return False
        extra: dict[str, Any] = {}
        if self.texts:
            extra = {
                "opener": opener(self.tx, alert),
                "opened_at": alert.opened_ts,
                "duration": open_seconds(alert),
            }
            if self.links is not None:  # a resolved alert has nothing left to act on
                extra["links"] = {**NO_LINKS, "alert": self.links.alert_page(alert.id)}
        for notice in notices:
            rule = self.ruleset.by_name.get(notice.rule)
            if rule is None:
                continue
            state, reason = "pending", None
            if notice.rule in self._flapping:  # flapping: its resolved messages are held
                state, reason = flap.STATE, self._flapping[notice.rule].reason
            if rule.escalate is not None:  # everyone its chain (and the rule) paged
                paged = self.tx.escalations.paged(alert.id, alert.episode, rule.name)
                if not paged:
                    continue
                rendered = rule.render_resolved(payload, extra) if self.texts else UNTITLED
                decisions = [
                    _to(rule.name, rendered, notifier, target)
                    for notifier, target in paged
                    if notifier in self.ruleset.notifiers
                ]
            elif not rule.resolve or not self.tx.outbox.sent(alert.id, alert.episode, rule.name):
                continue  # never a resolved message for an alert that was never sent
            else:
                rendered = rule.render_resolved(payload, extra) if self.texts else UNTITLED
                decisions = self.ruleset.on_call(
                    rule.decisions(rendered, self.ruleset.notifiers), self.now
                )
            for d in decisions:
                self._add(
                    event_id,
                    _notification(d, self.ruleset),
                    state=state,
                    now=self.now,
                    reason=reason,
                    kind="resolved",
                    alert=alert.id,
                    episode=alert.episode,
                )
            self.counts["resolved" if state == "pending" else state] += 1
        return True

    # -- digests and timers -------------------------------------------------------------------

    def _group(
        self, event_id: str, payload: Mapping[str, Any], rule: Rule, decisions: list[Decision]
    ) -> int:
        rows = [_notification(d, self.ruleset) for d in decisions]
        return digests.join(self.tx, event_id, payload, rule, rows, now=self.now, texts=self.texts)

    def repeats(self) -> None:
        """Send the repeats that are due (receiver.dispatch.timers)."""
        timers.repeats(
            self.tx,
            self.ruleset,
            self.now,
            silences=self.silences,
            counts=self.counts,
            links=self.links,
        )

    def escalations(self) -> None:
        """Page the escalation steps that are due (receiver.dispatch.escalations)."""
        escalations.run(
            self.tx, self.ruleset, self.now, silences=self.silences, counts=self.counts,
            links=self.links,
        )  # fmt: skip

    def wake(self) -> None:
        """Notify what a silence that ended held, and start its chains again."""
        escalations.wake(
            self.tx, self.ruleset, self.now, silences=self.silences, counts=self.counts,
            links=self.links, limit=1_000_000,
        )  # fmt: skip

    def flaps(self) -> None:
        """Settle the flapping periods whose quiet has passed (receiver.dispatch.flap)."""
        flap.settle(
            self.tx, self.ruleset, self.now, silences=self.silences, counts=self.counts,
            links=self.links,
        )  # fmt: skip

    def heartbeat(self, last_event: float, *, arrived: bool) -> None:
        """Fire when nothing arrived for silent_for; resolve when events flow again."""
        timers.heartbeat(
            self.tx, self.ruleset, self.now, last_event, arrived=arrived, counts=self.counts
        )


def _to(rule: str, rendered: Rendered, notifier: str, target: int) -> Decision:
    """A decision sending rendered to one url of one notifier."""
    return Decision(
        rule, notifier, target, rendered.title, rendered.body, None, None, rendered.fallback,
        rendered.error,
    )  # fmt: skip


def _distinct(rows: Sequence[Notification]) -> list[Notification]:
    """rows, one a (notifier, url)."""
    seen: dict[tuple[str, int], Notification] = {}
    for n in rows:
        seen.setdefault((n.notifier, n.target), n)
    return list(seen.values())


def _notification(d: Decision, ruleset: Ruleset) -> Notification:
    """d's notification, sent by the channel of its url (receiver.notify.registry)."""
    return Notification(
        d.rule, d.notifier, d.target, d.title, d.body, d.throttle_key, d.throttle_seconds,
        channel=ruleset.channel(d.notifier, d.target),
    )  # fmt: skip
