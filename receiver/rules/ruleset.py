"""A loaded rules.yaml: its notifiers and rules, routing a payload to decisions."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from receiver.durations import format_duration
from receiver.notify.registry import NOTIFY
from receiver.rules.escalations import Policy
from receiver.rules.index import TypeIndex
from receiver.rules.inhibit import Inhibition
from receiver.rules.maintenance import Window
from receiver.rules.notifiers import Notifier
from receiver.rules.options import Heartbeat
from receiver.rules.rule import Decision, Rule
from receiver.rules.schedules import PREFIX, Schedule, describe, who
from receiver.rules.verdict import Explanation, escalation_lines, explain

MAX_INDEXED_TYPES = 256  # event types remembered by the index; others are worked out each time


class Ruleset:
    """Rules in file order and the notifiers they name. Build one with rules.load_file().

    Example:

        rs = rules.load_file("rules.yaml")
        for decision in rs.route(event.payload()):
            outbox.add(decision)
        print(rs.explain(payload).format())
    """

    def __init__(
        self,
        *,
        notifiers: dict[str, Notifier],
        rules: list[Rule],
        digest: str,
        source: str = "rules.yaml",
        builtin: frozenset[str] = frozenset(),
        heartbeat: Heartbeat | None = None,
        schedules: Mapping[str, Schedule] | None = None,
        escalations: Mapping[str, Policy] | None = None,
        inhibit: Sequence[Inhibition] = (),
        maintenance: Sequence[Window] = (),
        text: str = "",
    ) -> None:
        self.notifiers = notifiers
        self.rules = rules
        self.by_name = {rule.name: rule for rule in rules}
        self.heartbeat = heartbeat
        self.schedules = dict(schedules or {})
        self.escalations = dict(escalations or {})
        self.inhibit = tuple(inhibit)  # inhibition rules, in file order
        self.maintenance = tuple(maintenance)  # maintenance windows, in file order
        self.flaps = any(rule.flap is not None for rule in rules)  # any rule detects flapping
        self.digest = digest
        self.text = text  # the file as loaded (${VAR} unresolved), kept for explain
        self.source = source
        self._builtin = builtin
        # By event type: the rules that can match it, each with its other conditions,
        # narrowed by the field most of them test for exact strings (receiver.rules.index).
        self._by_type: dict[str, TypeIndex] = {}

    def route(self, payload: Mapping[str, Any]) -> list[Decision]:
        """The notifications payload produces: rules in order, the first match wins
        unless it has ``continue: true``. Never raises for a template failure."""
        decisions: list[Decision] = []
        for rule in self.matching(payload):
            decisions.extend(rule.decisions(rule.render(payload), self.notifiers))
            if not rule.continue_:
                break
        return decisions

    def matching(self, payload: Mapping[str, Any]) -> Iterator[Rule]:
        """The rules payload matches, in file order. Only the rules that can match the
        event's type are tried (an index built once per type, which also narrows them by a
        field most of them test for exact strings); a payload without a string type meets
        every rule."""
        kind = payload.get("type")
        if type(kind) is not str:
            yield from (rule for rule in self.rules if rule.matches(payload))
            return
        index = self._by_type.get(kind)
        if index is None:
            index = TypeIndex(
                (rule, rule.conditions_besides_type)
                for rule in self.rules
                if rule.may_match_type(kind)
            )
            if len(self._by_type) < MAX_INDEXED_TYPES:  # types are the sender's to make up
                self._by_type[kind] = index
        for rule, conditions in index.candidates(payload):  # route()'s hot path
            for condition in conditions:
                if not condition.holds(payload):
                    break
            else:
                yield rule

    def channel(self, notifier: str, target: int) -> str:
        """The channel that sends to url `target` of notifier (receiver.notify.registry)."""
        found = self.notifiers.get(notifier)
        return NOTIFY if found is None else found.channel(target)

    def target(self, name: str, at: datetime | float) -> str:
        """The notifier a target names at the instant at: name itself, or for
        "schedule:NAME" the member on call then (receiver.rules.schedules)."""
        if not name.startswith(PREFIX):
            return name
        return who(self.schedules[name.removeprefix(PREFIX)], at)

    def on_call(self, decisions: Iterable[Decision], at: datetime | float) -> list[Decision]:
        """decisions with each "schedule:NAME" placeholder replaced by the member on call at
        at, one decision per url of theirs; called when a notification is placed, so the
        outbox row names a real notifier. A member a rule also names directly is sent once."""
        result: list[Decision] = []
        seen: set[tuple[str, str, int]] = set()
        for d in decisions:
            if d.notifier.startswith(PREFIX):
                member = self.target(d.notifier, at)
                made = [
                    dataclasses.replace(d, notifier=member, target=index)
                    for index in range(len(self.notifiers[member].urls))
                ]
            else:
                made = [d]
            for item in made:
                key = (item.rule, item.notifier, item.target)
                if key not in seen:
                    seen.add(key)
                    result.append(item)
        return result

    def explain(
        self,
        payload: Mapping[str, Any],
        enrichment: Mapping[str, Any] | None = None,
        *,
        at: datetime | float | None = None,
    ) -> Explanation:
        """Each rule's verdict on payload with reasons; ``.format()`` for humans.
        enrichment: what the upstream says of the session (receiver.upstream.enrich).
        A schedule target shows the member on call at at (default now)."""
        found = explain(self.rules, self.notifiers, payload, enrichment)
        if not self.schedules:
            return found
        at = time.time() if at is None else at
        moment = at.timestamp() if isinstance(at, datetime) else at
        outcomes = tuple(
            dataclasses.replace(
                r,
                notifiers=tuple(
                    f"{n} (on call: {self.target(n, at)})" if n.startswith(PREFIX) else n
                    for n in r.notifiers
                ),
                escalation=(
                    escalation_lines(
                        self.by_name[r.rule].escalate,  # type: ignore[arg-type]
                        lambda target, offset: self.target(target, moment + offset),
                    )
                    if r.escalation
                    else ()
                ),
            )
            for r in found.rules
        )
        resolved = tuple(
            dataclasses.replace(r, decisions=tuple(self.on_call(r.decisions, at)))
            for r in found.resolved
        )
        return dataclasses.replace(
            found,
            rules=outcomes,
            decisions=tuple(self.on_call(found.decisions, at)),
            resolved=resolved,
        )

    @property
    def unresolved_env(self) -> dict[str, list[str]]:
        """Environment variables left unset (rules loaded with lenient_env), each with the
        notifiers naming it; empty for rules the server loaded."""
        found: dict[str, list[str]] = {}
        for notifier in self.notifiers.values():
            for var in notifier.unresolved:
                found.setdefault(var, []).append(notifier.name)
        return found

    @property
    def counted(self) -> str:
        """How many rules, in words: "1 rule", "3 rules" (log lines)."""
        count = len(self.rules)
        return f"{count} rule{'s' if count != 1 else ''}"

    def summary(self) -> str:
        """A few lines for `receiver check`: counts, then each rule and its notifiers."""
        lines = [
            f"{self.source}: {self.counted}, "
            f"{len(self.notifiers)} notifier{'s' if len(self.notifiers) != 1 else ''} "
            f"(digest {self.digest})"
        ]
        for rule in self.rules:
            extras = []
            if rule.throttle_every is not None:
                extras.append(f"throttle {format_duration(rule.throttle_every)}")
            if rule.continue_:
                extras.append("continue")
            for option in ("hold", "repeat"):
                if getattr(rule, option) is not None:
                    extras.append(f"{option} {format_duration(getattr(rule, option))}")
            if rule.resolve:
                extras.append("resolve")
            if rule.group is not None:
                extras.append(
                    f"group by {', '.join(rule.group.by) or '-'} "
                    f"every {format_duration(rule.group.wait)}"
                )
            if rule.active is not None:
                extras.append(
                    f"active {rule.active.text}" + (" (defer)" if rule.active.defer else "")
                )
            if rule.escalate is not None:
                extras.append(f"escalate {rule.escalate.name}")
            tail = f" ({', '.join(extras)})" if extras else ""
            lines.append(f"  {rule.name} -> {', '.join(rule.notify) or '(escalation only)'}{tail}")
        described = []
        for name, notifier in self.notifiers.items():
            if name in self._builtin:
                described.append(f"{name} (built-in)")
            else:
                n = len(notifier.urls)
                described.append(f"{name} ({n} url{'s' if n != 1 else ''})")
        lines.append("notifiers: " + ", ".join(described))
        if self.heartbeat is not None:
            lines.append(
                f"heartbeat: after {format_duration(self.heartbeat.silent_for)} "
                f"without events -> {', '.join(self.heartbeat.notify)}"
            )
        for schedule in self.schedules.values():
            lines.append(f"schedule {describe(schedule)}")
        for window in self.maintenance:
            ranges = [r.text for r in window.weekly] + [f"{a}..{b}" for a, b in window.dates]
            told = f" -> {', '.join(window.notify)}" if window.notify else ""
            lines.append(f"maintenance {window.name} ({window.tz.key}): {', '.join(ranges)}{told}")
        for policy in self.escalations.values():
            lines.append(f"escalation {policy.describe()}")
        for inhibition in self.inhibit:
            source, target = inhibition.shown
            lines.append(
                f"inhibit {inhibition.name}: {target} muted while {source} is open,"
                f" equal {', '.join(inhibition.equal)}"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"<Ruleset {self.source} digest={self.digest} rules={len(self.rules)} "
            f"notifiers={sorted(self.notifiers)}>"
        )
