"""Title, body and throttle-key templates: a Jinja2 sandbox, its context and its filters.

Templates see every payload field by name, plus ``event`` (the whole payload),
``rule`` (the rule's name), ``delta`` (threshold - score, when both are
numbers) and ``links`` (the one-click action links, empty without them).
Undefined names are errors (StrictUndefined): a typo shows up as a fallback
message saying what failed instead of a silently empty notification.
The sandbox is the immutable one, so a template cannot change the payload that
later rules and templates see.

The sandbox caps a template's work whatever the event holds (receiver.rules.sandbox:
loop steps, CPU time, the size of any value built), and render cuts each text at
MAX_OUTPUT characters.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Generator, Mapping
from datetime import UTC, datetime
from typing import Any, cast

from jinja2 import StrictUndefined, Template, TemplateSyntaxError, UndefinedError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from receiver.durations import format_duration
from receiver.links import NO_LINKS
from receiver.matchers import lookup, show
from receiver.rules import sandbox
from receiver.rules.sandbox import Budget

MAX_OUTPUT = 16 * 1024  # characters of one rendered title, body or key; more is cut
TRUNCATED = "\n[cut: the template's output passed {limit} characters]"

# The default body ends with the alert's one-click links when there are any
# (RECEIVER_PUBLIC_URL set, an event of an alert); the resolved one with the alert's page.
DEFAULT_TITLE = (
    "[{{ rule }}] {{ event.type | default('event') }}"
    " for {{ event.sessionId | default('unknown session') }}"
)
DEFAULT_BODY = (
    "{% if event.userId is defined %}user {{ event.userId }}, {% endif %}"
    "session {{ event.sessionId | default('?') }}\n"
    "{% if event.score is defined %}score {{ event.score }}"
    "{{ ' (threshold %s)' % event.threshold if event.threshold is defined else '' }}\n"
    "{% endif %}"
    "event {{ event.id | default('?') }} at {{ event.timestamp | default('?') }}\n"
    "{% if links.ack %}"
    "Ack: {{ links.ack }}\nSnooze 1h: {{ links.snooze }}\nResolve: {{ links.resolve }}\n"
    "Alert: {{ links.alert }}"
    "{% endif %}"
)

# Resolved messages see the closing event's fields, plus opener (the event that opened the
# alert), opened_at (its timestamp) and duration (seconds between the two).
DEFAULT_RESOLVED_TITLE = "[{{ rule }}] resolved: {{ event.sessionId | default('unknown session') }}"
DEFAULT_RESOLVED_BODY = (
    "{{ opener.type }} at {{ opened_at | time('%H:%M UTC') }} ended by {{ type }}"
    " at {{ timestamp | time('%H:%M UTC') }}, after {{ duration | duration }}\n"
    "{% if links.alert %}Alert: {{ links.alert }}{% endif %}"
)

_FALLBACK_FIELDS = ("id", "type", "sessionId", "userId", "score", "threshold", "timestamp")


def _time(value: Any, fmt: str = "%Y-%m-%d %H:%M UTC") -> str:
    """Format an ISO-8601 timestamp (or epoch seconds) in UTC: {{ timestamp | time("%H:%M") }}."""
    if isinstance(value, bool):
        raise ValueError(f"time: expected a timestamp, got {show(value)}")
    if isinstance(value, int | float):
        moment = datetime.fromtimestamp(value, UTC)
    elif isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"time: {show(value)} is not an ISO-8601 timestamp") from None
    else:
        raise ValueError(f"time: expected a timestamp, got {show(value)}")
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.strftime(fmt)


def _duration(value: Any) -> str:
    """Seconds as a short duration: {{ 5400 | duration }} -> 1h30m."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"duration: expected a number of seconds, got {show(value)}")
    return format_duration(value)


def _json(value: Any) -> str:
    """Plain JSON (unlike the built-in tojson, which escapes < > & for HTML)."""
    return json.dumps(value, ensure_ascii=False, default=str)


def _finalize(value: Any) -> Any:
    # Print null and booleans as the event's JSON does, not as Python's None/True.
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _environment() -> ImmutableSandboxedEnvironment:
    env = sandbox.environment(
        undefined=StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )
    env.filters.update(time=_time, duration=_duration, json=_json)
    return env


ENV = _environment()


# A template that only prints one name, `{{ userId }}` (most throttle keys): render() looks
# the name up itself, as Jinja would print it, without Jinja's context and generator
# (docs/performance.md: the figures behind code choices).
_ONE_NAME = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
ONE_NAME = "receiver_one_name"  # the attribute of such a Template naming it
# The names context() sets whatever the payload says: a one-name template of any other name
# renders the same from the payload itself.
_CONTEXT_NAMES = frozenset(("event", "rule", "session", "history", "enriched", "links", "delta"))


def payload_only(template: Template) -> bool:
    """Whether render(template, payload) is render(template, context(payload, ...)): a
    template that prints one payload field (a throttle key's `{{ userId }}`)."""
    name = getattr(template, ONE_NAME, None)
    return name is not None and name not in _CONTEXT_NAMES


def compile_template(source: str) -> Template:
    """Compile one template; raises ValueError describing a syntax error or unknown filter,
    or a loop over a constant range() that could never finish within the caps.

    A source compiled before gives the same Template again (they are immutable): most
    rules use the default texts, and a reload, explain's kept rules files and a backtest
    load every rule again."""
    return _compiled(source)


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> Template:
    try:
        ast = ENV.parse(source)
        sandbox.check_ranges(ast)
        template = ENV.from_string(ast)
        if (one := _ONE_NAME.fullmatch(source)) is not None:
            setattr(template, ONE_NAME, one.group(1))
        return template
    except TemplateSyntaxError as exc:
        message = (exc.message or "invalid syntax").rstrip(".")
        message = message[:1].lower() + message[1:]
        raise ValueError(f"template syntax error at line {exc.lineno}: {message}") from None


# What the upstream service adds (receiver.upstream.enrich), when a notification is sent:
# the session's fields (context, status, signals, interventions, startedAt...) and its
# recent score points. Without it, session is empty, history too, and enriched false.
ENRICHED_NAMES = frozenset({"session", "history"})


def uses_enrichment(source: str) -> bool:
    """Whether a template names session or history, so it is worth rendering again with
    what the upstream service knows just before it is sent."""
    try:
        return bool(meta.find_undeclared_variables(ENV.parse(source)) & ENRICHED_NAMES)
    except TemplateSyntaxError:
        return False


def context(
    payload: Mapping[str, Any], rule: str, enrichment: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What a template sees: payload fields, then event, rule, delta, session, history and
    enriched (these names win).

    delta is set only when score and threshold are both numbers; session and history are
    the enrichment's when given, else empty.
    """
    ctx = dict(payload)
    ctx["event"] = payload
    ctx["rule"] = rule
    ctx["session"] = (enrichment or {}).get("session", {})
    ctx["history"] = (enrichment or {}).get("history", [])
    ctx["enriched"] = enrichment is not None
    # The one-click action links (receiver.links) the router adds to an alert's payload;
    # without them every name is there, empty, so `{% if links.ack %}` tests it.
    if not isinstance(ctx.get("links"), Mapping):
        ctx["links"] = NO_LINKS
    score, threshold = payload.get("score"), payload.get("threshold")
    if (
        isinstance(score, int | float)
        and isinstance(threshold, int | float)
        and not (isinstance(score, bool) or isinstance(threshold, bool))
    ):
        delta = threshold - score
        ctx["delta"] = delta if isinstance(delta, int) else round(delta, 6)
    return ctx


def render(template: Template, ctx: Mapping[str, Any], budget: Budget | None = None) -> str:
    """Render, stripped of surrounding whitespace; any failure propagates to the caller.

    The work is charged to budget (a fresh one if None): pass one Budget for all the
    templates of one rule and event. Output past MAX_OUTPUT characters is cut, with a
    line saying so; a cap on steps, time or value size raises TemplateLimitError.
    """
    name = getattr(template, ONE_NAME, None)
    if name is not None:
        if name not in ctx:
            raise UndefinedError(f"{name!r} is undefined")  # StrictUndefined's own words
        text = str(_finalize(ctx[name]))
        if len(text) > MAX_OUTPUT:
            return text[:MAX_OUTPUT].strip() + TRUNCATED.format(limit=f"{MAX_OUTPUT:,}")
        return text.strip()
    # Template.render() without its join, so that a template can be cut short: closing
    # the generator stops it where it is.
    chunks = template.root_render_func(template.new_context(cast(dict[str, Any], ctx)))
    with sandbox.charged_to(Budget() if budget is None else budget):
        try:
            parts: list[str] = []
            size = 0
            for chunk in chunks:
                parts.append(chunk)
                size += len(chunk)
                if size > MAX_OUTPUT:
                    text = "".join(parts)[:MAX_OUTPUT].strip()
                    return text + TRUNCATED.format(limit=f"{MAX_OUTPUT:,}")
            return "".join(parts).strip()
        finally:
            cast(Generator[str, None, None], chunks).close()


def fallback_title(rule: str, payload: Mapping[str, Any]) -> str:
    """``[deep-drop] score.drop for sess_1``: what is sent when a template fails."""
    kind = _text(lookup(payload, "type"), "event")
    session = _text(lookup(payload, "sessionId"), "unknown session")
    return f"[{rule}] {kind} for {session}"


def fallback_body(rule: str, what: str, error: BaseException, payload: Mapping[str, Any]) -> str:
    """A body naming the failed template and the error, then the event's key fields."""
    message = str(error).strip() or type(error).__name__
    lines = [f'the {what} template of rule "{rule}" failed: {message[:200]}']
    for name in _FALLBACK_FIELDS:
        value = lookup(payload, name)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            lines.append(f"{name}: {value}")
    return "\n".join(lines)


def _text(value: Any, default: str) -> str:
    return value if isinstance(value, str) and value else default
