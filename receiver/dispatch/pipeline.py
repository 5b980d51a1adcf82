"""The alert lifecycle: what one routed event does to its alert, and where each notification
goes: sent, held, cancelled, muted, deferred, silenced, grouped into a digest, or throttled.

A session's attention is an alert: score.drop opens it, score.recover or
session.stopped resolves it; intervention.fired opens an intervention alert that
intervention.resolved closes. Events apply to their alert in the order of their own
timestamp: one older than the newest already applied is stale. It leaves the alert as it
is, so a late drop cannot reopen an alert that has recovered, and lifecycle rules (hold,
resolve or repeat: Rule.follows_alert) send nothing for it. Every other rule forwards it
like any event: a plain rule notifies once for each matching event, in any order.

Everything here runs inside one store transaction (receiver.store.base.Tx).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import operator
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from receiver.events import date_or_why, to_utc, utc_z
from receiver.rules import Decision, Rule, Ruleset, format_duration
from receiver.rules.match import Condition, compile_match
from receiver.rules.options import CLOSES, OPENS
from receiver.rules.rule import Rendered
from receiver.store.base import Tx
from receiver.store.records import Alert, Group, Notification, Replay, Silence

log = logging.getLogger("receiver.lifecycle")

HEARTBEAT = "(heartbeat)"
REPLAY_PREFIX = "[replay] "  # before the title of every notification an operator's replay sends
DIGEST_MEMBERS = 100  # members kept per digest; the count goes on


_RULE = operator.attrgetter("rule")  # a decision's rule, to group decisions by


def alert_id(payload: Mapping[str, Any]) -> str | None:
    """The alert an event belongs to: session:<id> or intervention:<session>:<intervention>."""
    event_type = payload.get("type", "")
    kind = OPENS.get(event_type) or CLOSES.get(event_type)
    if kind == "session":
        return f"session:{payload.get('sessionId', '')}"
    if kind == "intervention":
        return f"intervention:{payload.get('sessionId', '')}:{payload.get('interventionId', '')}"
    return None


def event_time(payload: Mapping[str, Any]) -> str:
    """The event's timestamp normalised so that text order is time order."""
    text = str(payload["timestamp"])
    if (utc := utc_z(text)) is not None:
        return utc
    return to_utc(datetime.fromisoformat(text)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(slots=True)
class Transition:
    what: str  # open | update | resolve | close | stale | none
    alert: Alert | None = None


def apply(tx: Tx, payload: Mapping[str, Any], event_id: str, now: float) -> Transition:
    """Apply one event to its alert's stored state and say what happened."""
    aid = alert_id(payload)
    if aid is None:
        return Transition("none")
    ts = event_time(payload)
    alert = tx.alert(aid)
    if alert is not None and ts < alert.last_ts:
        return Transition("stale", alert)
    opening = payload["type"] in OPENS
    if alert is None:
        alert = Alert(aid, "resolved", 0, ts)
    alert.last_ts = ts
    if opening and alert.state != "open":
        alert.state, alert.episode = "open", alert.episode + 1
        alert.opened_ts, alert.opened_event, alert.resolved_ts = ts, event_id, None
        what = "open"
    elif opening:
        what = "update"
    elif alert.state == "open":
        alert.state, alert.resolved_ts = "resolved", ts
        what = "resolve"
    else:
        what = "close"
    tx.save_alert(alert, now)
    return Transition(what, alert)


UNTITLED = Rendered("", "", None, None, fallback=False)  # a notification whose texts nobody reads


class Pipeline:
    """Routes one batch: each event's decisions placed through the lifecycle into the outbox."""

    # False for `receiver backtest`, which counts notifications and never reads their texts:
    # a digest's text is then not written again for each member (most of a digest's cost),
    # and resolved messages are not rendered.
    texts = True

    def __init__(self, tx: Tx, ruleset: Ruleset, now: float) -> None:
        self.tx = tx
        self.ruleset = ruleset
        self.now = now
        self.counts: Counter[str] = Counter()
        # Rules whose template failed: how many notifications, and the last error.
        self.failed: dict[str, tuple[int, str]] = {}
        self.silences = active_silences(tx.silences(now))
        self._replay: Replay | None = None  # the operator's replay being routed, if any

    def event(
        self,
        event_id: str,
        payload: Mapping[str, Any],
        decisions: Sequence[Decision],
        *,
        replay: int | None = None,
        transition: Transition | None = None,
    ) -> None:
        """Route one event; replay names the operator's request when it is routed again
        (`receiver replay`): then it is sent whatever the lifecycle says, unless the
        request asks to respect it, and every row it produces is marked as a replay.
        transition: what the event did to its alert, when apply() has been run already
        (`receiver backtest` applies each event once for all the rules files it replays)."""
        self._replay = self.tx.replay_request(replay) if replay is not None else None
        try:
            if self._replay is not None and not self._replay.respect_lifecycle:
                self._send_again(event_id, payload, decisions)
            else:
                if transition is None:
                    transition = apply(self.tx, payload, event_id, self.now)
                if transition.what == "resolve":
                    self._resolve(event_id, payload, transition.alert)
                for name, group in itertools.groupby(decisions, key=_RULE):
                    rule = self.ruleset.by_name[name]
                    self._place(event_id, payload, rule, list(group), transition)
            if self._replay is not None:
                self.tx.replay_done(self._replay.id, self.now)
        finally:
            self._replay = None

    def _add(self, event_id: str, n: Notification, **row: Any) -> None:
        """tx.add, marking the row (and its title) as a replay while one is routed."""
        if self._replay is not None:
            n = dataclasses.replace(n, title=f"{REPLAY_PREFIX}{n.title}")
            row["replay"] = self._replay.id
            if row.get("reason") is None:
                row["reason"] = f"replay #{self._replay.id}"
        self.tx.add(event_id, n, **row)

    def _send_again(
        self, event_id: str, payload: Mapping[str, Any], decisions: Sequence[Decision]
    ) -> None:
        """An operator's replay: every notification the rules give the event is sent,
        whatever the lifecycle would say (stale, silenced, muted, grouped, throttled, held),
        and the alert is left as it is. A lifecycle rule's rows join the alert's open
        episode when the event belongs to it, so that its resolve answers them too; an
        event that resolved the alert as it stands sends its resolved messages again."""
        aid = alert_id(payload)
        alert = self.tx.alert(aid) if aid is not None else None
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
                self._add(
                    event_id,
                    _notification(d),
                    state="pending",
                    now=self.now,
                    alert=joins.id if joins else None,
                    episode=joins.episode if joins else None,
                )
            self.counts["pending"] += 1
            if joins is not None and (rule.resolve or rule.repeat):
                self.tx.add_notice(joins.id, joins.episode, rule.name, self.now, rule.repeat)
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
        for d in decisions:
            self._add(
                event_id,
                _notification(d),
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
        if (
            alert is not None
            and state in ("pending", "held")
            and transition.what in ("open", "update")
            and (rule.resolve or rule.repeat)
        ):
            self.tx.add_notice(alert.id, alert.episode, rule.name, self.now, rule.repeat)

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
        silence = self._silenced(payload)
        if silence is not None:
            return "silenced", f"silence #{silence.id}: {silence.reason}", None, None
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
        if first.throttle_seconds and self.tx.throttled(
            rule.name, first.throttle_key or "", self.now, first.throttle_seconds
        ):
            return "throttled", f"throttled: key {first.throttle_key!r}", None, None
        if rule.hold and transition.what == "open":
            return "held", f"hold {format_duration(rule.hold)}", self.now + rule.hold, None
        return "pending", None, None, None

    def _silenced(self, payload: Mapping[str, Any]) -> Silence | None:
        for silence, conditions in self.silences:
            if _holds(conditions, payload):
                return silence
        return None

    # -- resolve ------------------------------------------------------------------------------

    def _resolve(self, event_id: str, payload: Mapping[str, Any], alert: Alert | None) -> None:
        assert alert is not None
        self.counts["cancelled"] += self.tx.cancel_held(
            alert.id, alert.episode, self.now, "cancelled: resolved before it was sent"
        )
        if self._resolved_messages(event_id, payload, alert):
            self.tx.end_repeats(alert.id, alert.episode)

    def _resolved_messages(self, event_id: str, payload: Mapping[str, Any], alert: Alert) -> bool:
        """A resolved message from each rule with resolve: true whose notification about the
        alert's episode was sent; whether any rule noticed the episode at all."""
        notices = self.tx.notices(alert.id, alert.episode)
        if not notices:
            return False
        extra: dict[str, Any] = {}
        if self.texts:
            extra = {
                "opener": _json(self.tx.event_body(alert.opened_event or "")),
                "opened_at": alert.opened_ts,
                "duration": _seconds(alert.opened_ts, alert.resolved_ts),
            }
        for notice in notices:
            rule = self.ruleset.by_name.get(notice.rule)
            if (
                rule is None
                or not rule.resolve
                or not self.tx.sent(alert.id, alert.episode, rule.name)
            ):
                continue  # never a resolved message for an alert that was never sent
            rendered = rule.render_resolved(payload, extra) if self.texts else UNTITLED
            for d in rule.decisions(rendered, self.ruleset.notifiers):
                self._add(
                    event_id,
                    _notification(d),
                    state="pending",
                    now=self.now,
                    kind="resolved",
                    alert=alert.id,
                    episode=alert.episode,
                )
            self.counts["resolved"] += 1
        return True

    # -- digests ------------------------------------------------------------------------------

    def _group(
        self, event_id: str, payload: Mapping[str, Any], rule: Rule, decisions: list[Decision]
    ) -> int:
        spec = rule.group
        assert spec is not None
        key = spec.key(dict(payload))
        group = self.tx.open_group(rule.name, key, self.now)
        if group is None:
            group = self.tx.new_group(rule.name, key, self.now, self.now + spec.wait)
            for d in decisions:  # the digest's rows, one per target; texts written later
                self.tx.add(
                    event_id,
                    _notification(d),
                    state="held",
                    now=self.now,
                    next_at=group.closes_at,
                    kind="digest",
                    group_id=group.id,
                    reason=f"digest of {rule.name} for {key}",
                )
        members = group.members[: DIGEST_MEMBERS - 1] + [
            {k: payload.get(k) for k in ("id", "type", "sessionId", "userId", "score")}
        ]
        group = Group(group.id, group.rule, group.key, group.closes_at, group.count + 1, members)
        release = group.count >= spec.max
        title, body = digest_text(rule, group) if self.texts else ("", "")
        self.tx.update_group(group, title=title, body=body, now=self.now, release=release)
        return group.id

    # -- timers: repeats and the heartbeat ------------------------------------------------------

    def repeats(self) -> None:
        for notice in self.tx.due_repeats(self.now):
            alert = self.tx.alert(notice.alert)
            rule = self.ruleset.by_name.get(notice.rule)
            if (
                alert is None
                or alert.state != "open"
                or alert.episode != notice.episode
                or rule is None
                or rule.repeat is None
                or not self.tx.sent(alert.id, alert.episode, rule.name)
            ):
                self.tx.repeated(notice, None)
                continue
            opener = _json(self.tx.event_body(alert.opened_event or ""))
            rendered = rule.render(opener)
            open_for = format_duration(max(1.0, self.now - notice.notified_at))
            state, reason = "pending", None
            if self._silenced(opener) is not None:
                state, reason = "silenced", "silenced"
            elif rule.active is not None and not rule.active.contains(self.now):
                state, reason = "muted", f"muted outside the active window ({rule.active.text})"
            for d in rule.decisions(rendered, self.ruleset.notifiers):
                n = _notification(d)
                n = Notification(
                    n.rule,
                    n.notifier,
                    n.target,
                    f"[still open] {n.title}",
                    f"{n.body}\nopen for {open_for}, repeat {notice.repeats + 1}",
                )
                self.tx.add(
                    alert.opened_event or "-",
                    n,
                    state=state,
                    reason=reason,
                    now=self.now,
                    kind="repeat",
                    alert=alert.id,
                    episode=alert.episode,
                )
            self.counts["repeat"] += 1
            self.tx.repeated(notice, self.now + rule.repeat)

    def heartbeat(self, last_event: float, *, arrived: bool) -> None:
        """Fire when nothing arrived for silent_for; resolve when events flow again."""
        beat = self.ruleset.heartbeat
        firing = bool((self.tx.get_state("heartbeat") or {}).get("firing"))
        if beat is None:
            return
        silent = self.now - last_event
        if not firing and not arrived and silent >= beat.silent_for:
            since = datetime.fromtimestamp(last_event).astimezone().strftime("%Y-%m-%d %H:%M %Z")
            self._heartbeat(
                beat.notify,
                f"No events for {format_duration(beat.silent_for)}",
                f"No event has arrived since {since}. Is the Attention Scoring "
                "Service still sending to this receiver?",
            )
            self.tx.set_state("heartbeat", {"firing": True, "since": last_event})
        elif firing and arrived:
            state = self.tx.get_state("heartbeat") or {}
            gap = format_duration(max(1.0, last_event - float(state.get("since", last_event))))
            self._heartbeat(
                beat.notify,
                "Events are arriving again",
                f"Events are arriving again after {gap} of silence.",
                kind="resolved",
            )
            self.tx.set_state("heartbeat", {"firing": False, "since": last_event})

    def _heartbeat(
        self, names: Sequence[str], title: str, body: str, kind: str = "heartbeat"
    ) -> None:
        for name in names:
            for target in range(len(self.ruleset.notifiers[name].urls)):
                n = Notification(HEARTBEAT, name, target, title, body)
                self.tx.add("-", n, state="pending", now=self.now, kind=kind, alert=HEARTBEAT)
        self.counts["heartbeat"] += 1


def digest_text(rule: Rule, group: Group) -> tuple[str, str]:
    """One message for a digest: the count, the worst scores and the sessions."""
    members = group.members
    types = sorted({str(m.get("type")) for m in members})
    title = f"[{rule.name}] {group.count} × {', '.join(types)}"
    if group.key != "*":
        title += f" ({group.key.replace('|', ', ')})"
    scored = sorted(
        (m for m in members if isinstance(m.get("score"), int | float)), key=lambda m: m["score"]
    )[:5]
    lines = [f"{group.count} events in {format_duration(rule.group.wait if rule.group else 0)}"]
    if scored:
        lines.append(
            "worst scores: "
            + ", ".join(f"{m.get('userId') or m.get('sessionId')} {m['score']}" for m in scored)
        )
    sessions = list(dict.fromkeys(str(m.get("sessionId")) for m in members))
    more = f" (+{len(sessions) - 10} more)" if len(sessions) > 10 else ""
    lines.append(f"sessions: {', '.join(sessions[:10])}{more}")
    return title, "\n".join(lines)


def _notification(d: Decision) -> Notification:
    return Notification(
        d.rule, d.notifier, d.target, d.title, d.body, d.throttle_key, d.throttle_seconds
    )


def _holds(conditions: Sequence[Condition], payload: Mapping[str, Any]) -> bool:
    return all(c.holds(payload) for c in conditions)


def active_silences(
    silences: Sequence[Silence],
) -> list[tuple[Silence, tuple[Condition, ...]]]:
    """Each silence with its compiled conditions. A silence with a matcher that no longer
    compiles (a regex made before RE2, with a backreference, say) silences nothing: with
    that condition dropped it would silence more than it says."""
    active = []
    for silence in silences:
        conditions, problems = _silence_conditions(
            json.dumps(silence.matchers, sort_keys=True, default=str)
        )
        if problems:
            _refused_silence(silence.id, "; ".join(problems))
        else:
            active.append((silence, conditions))
    return active


@functools.lru_cache(maxsize=256)  # each batch looks silences up again: compile each once
def _silence_conditions(matchers: str) -> tuple[tuple[Condition, ...], tuple[str, ...]]:
    conditions, problems = compile_match(json.loads(matchers))
    return conditions, tuple(problems)


@functools.lru_cache(maxsize=256)  # once per silence, not once per batch
def _refused_silence(silence_id: int, problems: str) -> None:
    log.warning(
        "silence #%d is ignored: %s; expire it and add it again in a form that is allowed",
        silence_id,
        problems,
    )


def _seconds(start: str | None, end: str | None) -> float:
    if not start or not end:
        return 0.0
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _json(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def explain_now(
    ruleset: Ruleset,
    payload: Mapping[str, Any],
    now: float,
    *,
    silences: Sequence[Silence] = (),
    alert: Alert | None = None,
    notified: Sequence[str] = (),
) -> list[str]:
    """What the lifecycle would do with payload now, one line each, for `receiver explain`.

    notified names the rules whose notification about the alert's open episode was sent:
    a closing event sends a resolved message for each of them that has resolve: true.
    """
    lines: list[str] = []
    aid = alert_id(payload)
    stale = aid is not None and alert is not None and event_time(payload) < alert.last_ts
    if aid is not None:
        state = "none yet" if alert is None else f"{alert.state}, newest event {alert.last_ts}"
        lines.append(f"alert {aid}: {state}")
        if stale:
            lines.append(
                "stale: older than the alert's newest event, so rules with hold, resolve or"
                " repeat send nothing; other rules forward it"
            )
        elif payload.get("type") in CLOSES:
            lines.append(_resolves_now(ruleset, alert, notified))
    for silence, conditions in active_silences(silences):
        if _holds(conditions, payload):
            until = date_or_why(
                silence.ends_at,
                lambda ts: datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC"),
            )
            lines.append(f"silenced by #{silence.id} until {until} ({silence.reason})")
    opening = payload.get("type") in OPENS
    for name in dict.fromkeys(d.rule for d in ruleset.route(payload)):
        rule = ruleset.by_name[name]
        notes = []
        if stale and rule.follows_alert:
            lines.append(f"{name}: stale, nothing sent")
            continue
        if rule.active is not None:
            if rule.active.contains(now):
                notes.append(f"inside its active window ({rule.active.text})")
            elif rule.active.defer:
                opens = datetime.fromtimestamp(rule.active.next_open(now), UTC)
                notes.append(f"deferred to {opens:%Y-%m-%d %H:%M UTC} ({rule.active.text})")
            else:
                notes.append(f"muted: outside its active window ({rule.active.text})")
        if rule.group is not None:
            by = ", ".join(rule.group.by) or "nothing"
            notes.append(
                f"grouped into a digest by {by} for {format_duration(rule.group.wait)}"
                f" (at most {rule.group.max})"
            )
        if rule.hold is not None and opening:
            notes.append(
                f"held {format_duration(rule.hold)}; cancelled if the alert resolves first"
            )
        if rule.resolve:
            notes.append("a resolved message when the alert resolves")
        if rule.repeat is not None:
            notes.append(f"repeated every {format_duration(rule.repeat)} while open")
        if notes:
            lines.append(f"{name}: " + "; ".join(notes))
    return lines


def _resolves_now(ruleset: Ruleset, alert: Alert | None, notified: Sequence[str]) -> str:
    """What closing the alert now sends besides the rules' own notifications."""
    if alert is None or alert.state != "open":
        return "not open: it resolves nothing, and sends no resolved message"
    rules = [ruleset.by_name[name] for name in notified if name in ruleset.by_name]
    parts = []
    count = 0
    for rule in (r for r in rules if r.resolve):
        urls = sum(len(ruleset.notifiers[name].urls) for name in rule.notify)
        count += urls
        plural = f" ({urls} urls)" if urls > 1 else ""
        parts.append(f"{rule.name} -> {', '.join(rule.notify)}{plural}")
    if not parts:
        return "resolves it; no rule with resolve: true notified about it, so no resolved message"
    return f"resolves it: {count} resolved message{'s' if count != 1 else ''}: {', '.join(parts)}"
