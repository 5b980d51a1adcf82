"""Loading rules.yaml: strict decoding, validation collecting every problem, then a Ruleset.

Decoding is strict (unknown keys are errors), each rule is checked on its
own so one bad rule does not hide another's problems, and cross-references
(notifiers named by rules) are checked last. All problems are raised together
in one ConfigError, each message naming the rule and key, Alertmanager style:

    rule "deep-drop": match.score: unknown operator "less"; allowed: lt, lte, gt, gte, eq, between
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from receiver.durations import parse_duration
from receiver.errors import ConfigError
from receiver.matchers import compile_match, show
from receiver.rules import templates
from receiver.rules.escalations import Policy, check_escalations
from receiver.rules.inhibit import check_inhibit
from receiver.rules.maintenance import check_maintenance
from receiver.rules.notifiers import CONSOLE, CONSOLE_URL, NAME_RE, Notifier, build_notifier
from receiver.rules.options import LIFECYCLE_KEYS, check_heartbeat, check_options
from receiver.rules.rule import Rule
from receiver.rules.ruleset import Ruleset
from receiver.rules.schedules import PREFIX, check_schedules

TOP_KEYS = (
    "notifiers", "rules", "heartbeat", "schedules", "escalations", "inhibit", "maintenance",
)  # fmt: skip
RULE_KEYS = (
    "name", "match", "notify", "title", "body", "throttle", "continue", *LIFECYCLE_KEYS, "escalate"
)  # fmt: skip
THROTTLE_KEYS = ("key", "every")
_EXPECTED = {
    "notifiers": "a mapping of notifier names to apprise urls",
    "schedules": "a mapping of schedule names",
    "rules": "a list of rules",
    "match": "a mapping of payload fields to conditions",
    "throttle": "a mapping with keys key, every",
    "continue": "true or false",
    "every": "a duration such as 90s, 15m, 1h30m",
    "name": "a string",
    "title": "a template string",
    "body": "a template string",
    "key": "a template string",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ThrottleSpec(_Strict):
    key: str | None = None
    every: str


class RuleSpec(_Strict):
    """The shape of one rule; values are checked further by _check_rule."""

    name: str
    match: dict[Any, Any] | None = None
    notify: Any = None  # a notifier name or a list of them (required without escalate)
    escalate: Any = None  # an escalation policy's name
    title: str | None = None
    body: str | None = None
    throttle: ThrottleSpec | None = None
    continue_: bool = Field(default=False, alias="continue")
    # The lifecycle options are checked by lifecycle.check_options, with their own messages.
    hold: Any = None
    resolve: Any = None
    resolved_title: str | None = None
    resolved_body: str | None = None
    group: Any = None
    repeat: Any = None
    active: Any = None
    storm: Any = None
    flap: Any = None


class FileSpec(_Strict):
    notifiers: dict[Any, Any] | None = None
    rules: list[Any] | None = None
    heartbeat: Any = None
    schedules: Any = None  # checked by schedules.check_schedules, with its own messages
    escalations: Any = None  # checked by escalations.check_escalations
    inhibit: Any = None  # checked by inhibit.check_inhibit
    maintenance: Any = None  # checked by maintenance.check_maintenance


def load_file(
    path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    *,
    lenient_env: bool = False,
) -> Ruleset:
    """Load and validate a rules file; raises ConfigError listing every problem.

    lenient_env: an unset ${VAR} in a notifier url is not a problem (see load_text).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read rules file: {reason.lower()}", source=source) from exc
    return load_text(text, env, source=source, lenient_env=lenient_env)


def load_text(
    text: str,
    env: Mapping[str, str] | None = None,
    source: str = "rules.yaml",
    *,
    lenient_env: bool = False,
) -> Ruleset:
    """Load rules from YAML text; env (default os.environ) fills ${VAR} in notifier urls.

    With lenient_env (`receiver check` and `explain`, which send nothing), a variable
    unset or empty is no problem: its urls are left unresolved and unchecked, and
    Ruleset.unresolved_env lists it. The server never loads rules this way.
    """
    env = os.environ if env is None else env
    raw = _parse_yaml(text, source)
    if raw and not any(key in raw for key in TOP_KEYS):
        # Some other file (`receiver backtest /etc/shadow`): its keys are its lines, and
        # may be secret, so none is named.
        raise ConfigError(
            f"not a rules file: none of the top-level keys {', '.join(TOP_KEYS)}"
            f" ({len(raw)} other key{'s' if len(raw) != 1 else ''}, not shown)",
            source=source,
        )
    problems: list[str] = []
    try:
        FileSpec.model_validate(raw)
    except ValidationError as exc:
        problems.extend(_describe(err, "") for err in exc.errors())
    raw_notifiers = raw.get("notifiers")
    raw_rules = raw.get("rules")
    raw_notifiers = raw_notifiers if isinstance(raw_notifiers, dict) else {}
    raw_rules = raw_rules if isinstance(raw_rules, list) else []

    notifiers, builtin = _notifiers(raw_notifiers, env, lenient_env, problems)
    # A notifier with a problem is still defined: rules naming it are not wrong too.
    defined = [str(n) for n in raw_notifiers if isinstance(n, str)] + sorted(builtin)
    schedules = check_schedules(raw.get("schedules"), defined, problems)
    # A schedule is a target wherever a notifier is: "schedule:primary".
    raw_schedules = raw.get("schedules")
    if isinstance(raw_schedules, dict):
        defined = defined + [f"{PREFIX}{n}" for n in raw_schedules if isinstance(n, str)]

    policies = check_escalations(raw.get("escalations"), defined, problems)
    inhibit = check_inhibit(raw.get("inhibit"), problems)
    raw_policies = raw.get("escalations")
    named = (
        [n for n in raw_policies if isinstance(n, str)] if isinstance(raw_policies, dict) else []
    )

    rules: list[Rule] = []
    seen: set[str] = set()
    for index, item in enumerate(raw_rules):
        rule, found = _check_rule(index, item, defined, seen, (policies, named))
        problems.extend(found)
        if rule is not None:
            rules.append(rule)
    heartbeat, names = check_heartbeat(raw.get("heartbeat"), problems)
    for name in names:
        if name not in defined:
            problems.append(_undefined(name, "heartbeat", defined))
    maintenance = check_maintenance(raw.get("maintenance"), defined, problems)
    if problems:
        raise ConfigError(problems, source=source)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    return Ruleset(
        notifiers=notifiers,
        rules=rules,
        digest=digest,
        source=source,
        builtin=builtin,
        heartbeat=heartbeat,
        schedules=schedules,
        escalations=policies,
        inhibit=inhibit,
        maintenance=maintenance,
        text=text,
    )


def _notifiers(
    raw: dict[Any, Any], env: Mapping[str, str], lenient: bool, problems: list[str]
) -> tuple[dict[str, Notifier], frozenset[str]]:
    """The notifiers, and the built-in ones added (console, unless the file defines it)."""
    notifiers: dict[str, Notifier] = {}
    for name, value in raw.items():
        notifier, found = build_notifier(name, value, env, lenient=lenient)
        problems.extend(found)
        if notifier is not None:
            notifiers[notifier.name] = notifier
    builtin = frozenset() if CONSOLE in raw else frozenset({CONSOLE})
    if builtin:
        notifiers[CONSOLE] = Notifier(CONSOLE, (CONSOLE_URL,))
    return notifiers, builtin


def _check_rule(
    index: int,
    raw: Any,
    defined: list[str],
    seen: set[str],
    policies: tuple[dict[str, Policy], list[str]] = ({}, []),
) -> tuple[Rule | None, list[str]]:
    name = raw.get("name") if isinstance(raw, dict) else None
    label = f'rule "{name}"' if isinstance(name, str) and name else f"rule #{index + 1}"
    if not isinstance(raw, dict):
        keys = ", ".join(RULE_KEYS)
        return None, [f"{label}: expected a mapping with keys {keys}, got {show(raw)}"]
    problems: list[str] = []
    bad: set[str] = set()
    try:
        RuleSpec.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(_describe(err, label))
            bad.add(str(err["loc"][0]))

    if isinstance(name, str):
        if not NAME_RE.fullmatch(name):
            problems.append(
                f"{label}: name: invalid name; allowed: letters, digits, '_', '.', '-', "
                "starting with a letter or digit"
            )
        elif name in seen:
            problems.append(f'{label}: duplicate rule name "{name}"; rule names must be unique')
        seen.add(name)

    conditions, found = compile_match(raw.get("match") if "match" not in bad else None)
    problems.extend(f"{label}: {p}" for p in found)
    notify = _check_notify(raw.get("notify"), label, defined, problems) if "notify" in raw else ()
    escalate = _check_escalate(raw, label, policies, problems)

    options = check_options(raw, label, problems)
    sources: dict[str, str | None] = {
        "title": templates.DEFAULT_TITLE if raw.get("title") is None else raw["title"],
        "body": templates.DEFAULT_BODY if raw.get("body") is None else raw["body"],
        "resolved_title": raw.get("resolved_title") or templates.DEFAULT_RESOLVED_TITLE,
        "resolved_body": raw.get("resolved_body") or templates.DEFAULT_RESOLVED_BODY,
    }
    every = _throttle(raw, label, bad, sources, problems)
    compiled: dict[str, Any] = {}
    for key, source in sources.items():
        if source is None or key.split(".")[0] in bad:
            continue
        if key != "title" and not source.strip():
            hint = "omit it for the default" if key == "body" else "omit it for one rule-wide key"
            problems.append(f"{label}: {key}: empty template; {hint}")
            continue
        try:
            compiled[key] = templates.compile_template(source)
        except ValueError as exc:
            problems.append(f"{label}: {key}: {exc}")
    if problems:
        return None, problems
    return Rule(
        name=str(name),
        conditions=conditions,
        notify=notify,
        title=str(sources["title"]),
        body=str(sources["body"]),
        throttle_key=sources.get("throttle.key"),
        throttle_every=every,
        continue_=bool(raw.get("continue", False)),
        _compiled=(compiled["title"], compiled["body"], compiled.get("throttle.key")),
        _resolved=(compiled["resolved_title"], compiled["resolved_body"]),
        escalate=escalate,
        **options,
    ), []


def _throttle(
    raw: dict[Any, Any],
    label: str,
    bad: set[str],
    sources: dict[str, str | None],
    problems: list[str],
) -> float | None:
    """A rule's throttle window in seconds (its key template goes into sources)."""
    throttle = raw.get("throttle")
    if "throttle" in bad or not isinstance(throttle, dict):
        return None
    sources["throttle.key"] = throttle.get("key")
    try:
        every = parse_duration(throttle["every"])
        if every <= 0:
            raise ValueError(f'duration "{throttle["every"]}" is zero; use at least 1s')
    except ValueError as exc:
        problems.append(f"{label}: throttle.every: {exc}")
        return None
    return every


def _check_escalate(
    raw: dict[Any, Any],
    label: str,
    policies: tuple[dict[str, Policy], list[str]],
    problems: list[str],
) -> Policy | None:
    """The policy a rule's escalate names; a rule needs notify, escalate or both."""
    name = raw.get("escalate")
    if name is None:
        if "notify" not in raw:
            problems.append(f'{label}: missing required key "notify" (or "escalate")')
        return None
    found, named = policies
    if not isinstance(name, str):
        problems.append(
            f"{label}: escalate: expected an escalation policy's name, got {show(name)}"
        )
        return None
    if name not in named:
        problems.append(
            f'{label}: escalate: undefined escalation policy "{name}"; '
            f"defined: {', '.join(named) or '(none)'}"
        )
        return None
    return found.get(name)  # None when the policy has problems of its own, reported there


def _check_notify(raw: Any, label: str, defined: list[str], problems: list[str]) -> tuple[str, ...]:
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names:
        problems.append(f"{label}: notify: expected a notifier name or a non-empty list of them")
        return ()
    result: list[str] = []
    for name in names:
        if not isinstance(name, str):
            problems.append(f"{label}: notify: expected notifier names, got {show(name)}")
        elif "://" in name:
            # Never echo it: a url pasted here usually carries a token.
            problems.append(
                f"{label}: notify: an apprise url is not allowed here; define it under "
                "notifiers: and name that notifier"
            )
        elif name in result:
            problems.append(f'{label}: notify: notifier "{name}" is listed twice')
        elif name not in defined:
            problems.append(_undefined(name, label, defined))
        else:
            result.append(name)
    return tuple(result)


def _undefined(name: str, where: str, defined: list[str]) -> str:
    """'undefined notifier "ops" used in rule "x"; defined: ...', or the same of a schedule."""
    if name.startswith(PREFIX):
        known = [n.removeprefix(PREFIX) for n in defined if n.startswith(PREFIX)]
        return (
            f'undefined schedule "{name.removeprefix(PREFIX)}" used in {where}; '
            f"defined schedules: {', '.join(known) or '(none)'}"
        )
    notifiers = [n for n in defined if not n.startswith(PREFIX)]
    return f'undefined notifier "{name}" used in {where}; defined: {", ".join(notifiers)}'


def _describe(err: ErrorDetails, label: str) -> str:
    """A pydantic error as a rules.yaml message: 'rule "x": throttle: unknown key "per"; ...'."""
    loc = [str(p) for p in err["loc"]]
    head = f"{label}: " if label else ""
    where = ".".join(loc)
    if err["type"] == "extra_forbidden":
        parent, key = loc[:-1], loc[-1]
        allowed = THROTTLE_KEYS if parent else RULE_KEYS if label else TOP_KEYS
        scope = f"{'.'.join(parent)}: " if parent else ""
        kind = "key" if label else "top-level key"
        return f'{head}{scope}unknown {kind} "{key}"; allowed: {", ".join(allowed)}'
    if err["type"] == "missing":
        parent = loc[:-1]
        scope = f"{'.'.join(parent)}: " if parent else ""
        return f'{head}{scope}missing required key "{loc[-1]}"'
    expected = _EXPECTED.get(loc[-1], err["msg"].lower().removeprefix("input should be "))
    # Top-level values may hold notifier urls: name their kind, never their text.
    got = _kind(err["input"]) if not label else show(err["input"])
    return f"{head}{where}: expected {expected}, got {got}"


MAX_YAML_VALUES = 100_000  # after anchors and aliases are expanded ("billion laughs")


def _parse_yaml(text: str, source: str) -> dict[Any, Any]:
    loader = _UniqueKeyLoader(text)  # a SafeLoader subclass
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_size(node) > MAX_YAML_VALUES:
            raise ConfigError(
                f"the file expands to more than {MAX_YAML_VALUES} values through anchors and "
                "aliases; write it out or use fewer aliases",
                source=source,
            )
        data = None if node is None else loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        # Only the position and the problem: the offending line may hold a token.
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"yaml syntax error{where}: {exc.problem}", source=source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"yaml syntax error: {type(exc).__name__}", source=source) from None
    except ValueError as exc:
        # A value YAML could not build: a date like 2026-13-45, or an integer longer than
        # Python converts (its message names sys.set_int_max_str_digits, not the file).
        digits = re.search(r"limit \((\d+) digits\).*value has (\d+) digits", str(exc))
        reason = (
            f"a number has {digits.group(2)} digits; at most {digits.group(1)} are allowed"
            if digits
            else str(exc).lower()
        )
        raise ConfigError(f"yaml value error: {reason}", source=source) from None
    finally:
        loader.dispose()
    if data is None:
        raise ConfigError(
            "the file is empty; expected a mapping with keys notifiers, rules", source=source
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping with keys notifiers, rules at the top level, got {_kind(data)}",
            source=source,
        )
    return data


def _expanded_size(node: yaml.Node) -> int:
    """How many values the document holds once aliases are expanded, counting to just past
    the limit: an aliased node is one object reached many times, so this stays cheap."""
    count, stack = 0, [node]
    while stack and count <= MAX_YAML_VALUES:
        current = stack.pop()
        count += 1
        if isinstance(current, yaml.MappingNode):
            stack.extend(part for pair in current.value for part in pair)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return count


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key repeated in one mapping is an error, not a silent win."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            ident = (key_node.tag, key_node.value)
            if ident in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f'duplicate key "{key_node.value}"', key_node.start_mark
                )
            seen.add(ident)
        return super().construct_mapping(node, deep=deep)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "a mapping" if isinstance(value, dict) else f"a {type(value).__name__}"
