"""One compiled rule: does it match a payload, and what notifications does it produce."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from jinja2 import Template

from receiver.matchers import Condition
from receiver.rules import templates
from receiver.rules.escalations import Policy
from receiver.rules.notifiers import Notifier
from receiver.rules.options import ALERT_KEYS, ActiveWindow, FlapSpec, GroupSpec, StormSpec
from receiver.rules.sandbox import Budget

RULE_WIDE_KEY = "*"
# The one decision of a rule with escalate and no notify: it matched, and its escalation
# starts; no notification is sent to it (receiver.dispatch.pipeline).
ESCALATE_ONLY = "(escalate)"


@dataclass(frozen=True)
class Decision:
    """One notification to send: one per (rule, notifier, url) of a matching rule.

    ``throttle_key`` is None exactly when ``throttle_seconds`` is; a rule
    throttled without a ``key`` template uses the single key ``"*"``.
    """

    rule: str
    notifier: str
    target: int
    title: str
    body: str
    throttle_key: str | None
    throttle_seconds: float | None
    fallback: bool
    error: str | None = None  # why the template failed, when fallback is true


@dataclass(frozen=True)
class Rendered:
    """A matching rule's texts, rendered once for all of its notifiers."""

    title: str
    body: str
    throttle_key: str | None
    throttle_seconds: float | None
    fallback: bool
    error: str | None = None


@dataclass(frozen=True)
class Rule:
    """A rule from rules.yaml, compiled: conditions, notifier names and templates."""

    name: str
    conditions: tuple[Condition, ...]
    notify: tuple[str, ...]
    title: str
    body: str
    throttle_key: str | None = None
    throttle_every: float | None = None
    continue_: bool = False
    _compiled: tuple[Template, Template, Template | None] | None = field(
        default=None, repr=False, compare=False
    )
    _resolved: tuple[Template, Template] | None = field(default=None, repr=False, compare=False)
    # The alert lifecycle (rules/options.py): all off by default.
    hold: float | None = None
    resolve: bool = False
    group: GroupSpec | None = None
    repeat: float | None = None
    active: ActiveWindow | None = None
    escalate: Policy | None = None  # the escalation policy its alerts start (escalations:)
    storm: StormSpec | None = None  # the storm guard: at most max a window, then one message
    flap: FlapSpec | None = None  # flap detection: one message while its alert flaps

    @cached_property
    def follows_alert(self) -> bool:
        """Whether this is a lifecycle rule: one with hold, resolve, repeat, escalate or flap
        (ALERT_KEYS).

        Such a rule notifies about the alert, so an event older than its alert's newest is
        stale for it. Any other rule forwards each matching event once, in any order.
        """
        return any(getattr(self, key) not in (None, False) for key in ALERT_KEYS)

    def render_resolved(self, payload: Mapping[str, Any], extra: Mapping[str, Any]) -> Rendered:
        """The resolved message: the closing event's payload plus opener, opened_at, duration."""
        if self._resolved is None:
            compiled = (
                templates.compile_template(templates.DEFAULT_RESOLVED_TITLE),
                templates.compile_template(templates.DEFAULT_RESOLVED_BODY),
            )
            object.__setattr__(self, "_resolved", compiled)
        assert self._resolved is not None
        title_t, body_t = self._resolved
        ctx = {**templates.context(payload, self.name), **extra}
        budget = Budget()  # one for both templates
        try:
            return Rendered(
                templates.render(title_t, ctx, budget),
                templates.render(body_t, ctx, budget),
                None,
                None,
                False,
            )
        except Exception as exc:  # a resolved message is never lost to a template either
            return Rendered(
                title=f"[{self.name}] resolved: {payload.get('sessionId', '?')}",
                body=templates.fallback_body(self.name, "resolved template", exc, payload),
                throttle_key=None,
                throttle_seconds=None,
                fallback=True,
                error=f"resolved template: {str(exc).strip()[:200] or type(exc).__name__}",
            )

    def test(self, payload: Mapping[str, Any]) -> list[tuple[bool, str]]:
        """Every condition's verdict and reason, in order (all hold for a match)."""
        return [c.test(payload) for c in self.conditions]

    def matches(self, payload: Mapping[str, Any]) -> bool:
        """Whether every condition holds: test()'s verdict without building any reason."""
        for condition in self.conditions:
            if not condition.holds(payload):
                return False
        return True

    def may_match_type(self, kind: str) -> bool:
        """Whether an event whose type is the string kind can match: its `type` conditions
        hold (Ruleset's index by type, built from this once per type)."""
        return all(c.matcher.ok(kind) for c in self.conditions if c.field == "type")

    @cached_property
    def conditions_besides_type(self) -> tuple[Condition, ...]:
        """What must still hold once may_match_type() has passed (Ruleset.matching())."""
        return tuple(c for c in self.conditions if c.field != "type")

    @cached_property
    def enriches(self) -> bool:
        """Whether the title or body names session or history (receiver.upstream.enrich):
        then they are rendered again, with the upstream's data, just before sending."""
        return templates.uses_enrichment(self.title) or templates.uses_enrichment(self.body)

    def render(
        self, payload: Mapping[str, Any], enrichment: Mapping[str, Any] | None = None
    ) -> Rendered:
        """Title, body and throttle key for payload; a failing template yields the fallback.

        A failing key template throttles under the rule-wide key "*" rather than
        not at all, so a broken template cannot flood a channel. enrichment: the
        session and history the upstream service gave (templates see them empty without).
        """
        title_t, body_t, key_t = self._templates()
        ctx = templates.context(payload, self.name, enrichment)
        budget = Budget()  # the caps hold for the three templates together
        seconds = self.throttle_every
        key: str | None = None if seconds is None else RULE_WIDE_KEY
        failed: tuple[str, Exception] | None = None
        title = body = ""
        what = "title"
        try:
            title = templates.render(title_t, ctx, budget)
            what = "body"
            body = templates.render(body_t, ctx, budget)
            if not body:
                raise ValueError("it rendered empty text")
        except Exception as exc:  # any template failure must still produce a message
            failed = (what, exc)
        if key_t is not None:
            try:
                key = templates.render(key_t, ctx, budget)
            except Exception as key_exc:
                failed = failed or ("throttle key", key_exc)
        if failed is None:
            return Rendered(title, body, key, seconds, fallback=False)
        what, error = failed
        return Rendered(
            title=templates.fallback_title(self.name, payload),
            body=templates.fallback_body(self.name, what, error, payload),
            throttle_key=key,
            throttle_seconds=seconds,
            fallback=True,
            error=f"{what}: {str(error).strip()[:200] or type(error).__name__}",
        )

    def render_key(self, payload: Mapping[str, Any]) -> Rendered:
        """render() without the title and body, for `receiver backtest`, which decides
        throttles and never reads texts: the same throttle key. (The key's template has a
        budget of its own here, where render() shares one with the title and body; only
        a title and body that spend nearly all of it would make the two keys differ.)"""
        key_t = self._templates()[2]
        seconds = self.throttle_every
        key: str | None = None if seconds is None else RULE_WIDE_KEY
        if key_t is not None:
            try:
                plain = templates.payload_only(key_t)  # no context to build
                ctx = payload if plain else templates.context(payload, self.name)
                key = templates.render(key_t, ctx)
            except Exception:  # render()'s fallback key
                key = RULE_WIDE_KEY
        return Rendered("", "", key, seconds, fallback=False)

    def decisions(self, rendered: Rendered, notifiers: Mapping[str, Notifier]) -> list[Decision]:
        """One decision for each url of each notifier the rule names (and for a rule that
        only escalates, one ESCALATE_ONLY decision that sends nothing)."""
        names = self.notify if self.notify or self.escalate is None else (ESCALATE_ONLY,)
        return self.decisions_for(names, rendered, notifiers)

    def decisions_for(
        self, names: Sequence[str], rendered: Rendered, notifiers: Mapping[str, Notifier]
    ) -> list[Decision]:
        """decisions() to these targets (an escalation step's)."""
        return [
            Decision(
                rule=self.name,
                notifier=name,
                target=index,
                title=rendered.title,
                body=rendered.body,
                throttle_key=rendered.throttle_key,
                throttle_seconds=rendered.throttle_seconds,
                fallback=rendered.fallback,
                error=rendered.error,
            )
            for name in names
            # A "schedule:NAME" target is one placeholder until routing puts the member on
            # call in its place (Ruleset.on_call), with one decision per url of theirs.
            for index in range(len(notifiers[name].urls) if name in notifiers else 1)
        ]

    def _templates(self) -> tuple[Template, Template, Template | None]:
        if self._compiled is not None:
            return self._compiled
        # Built directly (tests, callers): compile on first use; the loader pre-compiles.
        compiled = (
            templates.compile_template(self.title),
            templates.compile_template(self.body),
            None if self.throttle_key is None else templates.compile_template(self.throttle_key),
        )
        object.__setattr__(self, "_compiled", compiled)
        return compiled
