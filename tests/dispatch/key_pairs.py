"""The lifecycle keys of a rule, each with a minimal valid value, and a rules file of any set
of them: the table tests/dispatch/test_key_pairs.py runs every pair of (and a simulation of
all the keys may draw from). Besides a rule's own keys (receiver/rules/load.py RULE_KEYS,
receiver/rules/options.py) it has what the rest of the grammar does to a rule: a
`schedule:NAME` target, the rule's events as the target or the source of an `inhibit:`
rule, and a silence over some of them (not a key, but every rule meets them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)  # a Monday, 10:00 UTC: the stream's start


@dataclass(frozen=True)
class Key:
    """What a key adds to the rule (its lines), its targets, and the file's other parts."""

    lines: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()  # notify targets it adds
    inhibit: tuple[str, ...] = ()  # inhibition rules it adds (items of inhibit:)
    after: tuple[str, ...] = ()  # rules after it, rules.yaml lines
    silence: bool = False  # a silence over session s4 while the stream runs
    key: str = ""  # the rules.yaml key it is a value of, when another entry is one too


def same_key(first: str, second: str) -> bool:
    """Whether two entries are values of one key (active and active-defer): no pair."""
    return bool(KEYS[first].key) and KEYS[first].key == KEYS[second].key


KEYS: dict[str, Key] = {
    "notify": Key(targets=("chat",)),
    "schedule": Key(targets=("schedule:primary",)),
    "escalate": Key(lines=("escalate: page",)),
    "group": Key(lines=("group: {by: [type], wait: 2m, max: 50}",)),
    "hold": Key(lines=("hold: 1m",)),
    "resolve": Key(lines=("resolve: true",)),
    "repeat": Key(lines=("repeat: 10m",)),
    "throttle": Key(lines=("throttle: {every: 1h}",)),
    "storm": Key(lines=("storm: {max: 2, per: 30s}",)),
    # s2's drop and recover are two changes within 10m: it flaps, and settles 5m later.
    "flap": Key(lines=("flap: {changes: 2, within: 10m, quiet: 5m}",)),
    # Quiet all through the stream (it runs from 10:00 to about 11:00 UTC).
    "active": Key(lines=('active: {hours: "20:00-21:00", tz: UTC}',), key="active"),
    # Closed at first, open from 10:05: what it held goes out then.
    "active-defer": Key(
        lines=('active: {hours: "10:05-23:00", tz: UTC, defer: true}',), key="active"
    ),
    "continue": Key(
        lines=("continue: true",),
        after=("  - name: after", "    match: {type: score.drop}", "    notify: [chat]"),
    ),
    "inhibit-target": Key(
        inhibit=(
            "  - name: covers",
            "    source: {type: intervention.fired}",
            "    target: {type: score.drop}",
            "    equal: [sessionId]",
        )
    ),
    "inhibit-source": Key(
        inhibit=(
            "  - name: boss",
            "    source: {type: score.drop, sessionId: s3}",
            "    target: {type: intervention.fired}",
            "    equal: [sessionId]",
        )
    ),
    "silence": Key(silence=True),
}

HEAD = """
notifiers:
  chat: "json://127.0.0.1:9/chat"
  pager: "json://127.0.0.1:9/pager"
  lead: "json://127.0.0.1:9/lead"
schedules:
  primary:
    timezone: UTC
    rotation: daily
    handoff: "09:00"
    start: 2026-11-01
    members: [pager, lead]
escalations:
  page:
    steps:
      - notify: [pager]
      - after: 5m
        notify: [lead]
"""


@dataclass
class Built:
    """A rules file of some keys, and what the stream needs besides."""

    text: str
    silence: bool = False
    keys: tuple[str, ...] = field(default_factory=tuple)


def rules_of(*names: str) -> Built:
    """The rules file of one rule `r` (events of type score.drop) with these keys; a rule
    with neither notify nor escalate gets `notify: [chat]` (one of them is required)."""
    keys = [KEYS[n] for n in names]
    targets = [t for k in keys for t in k.targets]
    if not targets and "escalate" not in names:
        targets = ["chat"]
    lines = ["  - name: r", "    match: {type: score.drop}"]
    if targets:
        lines.append(f"    notify: [{', '.join(targets)}]")
    lines += [f"    {line}" for k in keys for line in k.lines]
    lines += [line for k in keys for line in k.after]
    inhibit = [line for k in keys for line in k.inhibit]
    top = ["inhibit:", *inhibit] if inhibit else []
    text = HEAD + "\n".join(top) + "\nrules:\n" + "\n".join(lines) + "\n"
    return Built(text, silence=any(k.silence for k in keys), keys=tuple(names))


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
