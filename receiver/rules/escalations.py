"""Escalation policies: who is paged, and when, while an alert stays open and unacknowledged.

    escalations:
      wake-someone:
        steps:
          - notify: [team-chat]               # at once (a first step's after defaults to 0s)
          - after: 5m                         # 5 minutes after the step before
            notify: [schedule:primary]
          - after: 15m
            notify: [schedule:secondary, lead-mail]
        repeat: 2      # then the whole chain again, at most twice (0-9; default 0)
        reack: 30m     # an acknowledged alert still open pages the current step again

A rule names one with `escalate: wake-someone`. Each step's `after` counts from the step
before it; a new round starts the last step's `after` after the last step, as if the alert
had opened then (so a policy with repeat needs a last step with an after). The policy is
frozen into the store when the alert's escalation starts (Policy.to_json): a reload does
not change a running chain. receiver.dispatch.escalations runs the chains.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from receiver.durations import format_duration, parse_duration
from receiver.matchers import show
from receiver.rules.notifiers import NAME_RE

POLICY_KEYS = ("steps", "repeat", "reack")
STEP_KEYS = ("after", "notify")
MAX_STEPS = 10
MAX_REPEAT = 9  # the "at most 9": a chain that pages for ever is not a policy


@dataclass(frozen=True)
class Step:
    after: float  # seconds after the step before (after the alert opened, for the first)
    notify: tuple[str, ...]  # notifier names and "schedule:NAME" targets


@dataclass(frozen=True)
class Policy:
    """A validated escalation policy; build one with check_escalations (rules.load_text)."""

    name: str
    steps: tuple[Step, ...]
    repeat: int = 0
    reack: float | None = None

    @property
    def round_gap(self) -> float:
        """How long after the last step a new round's first step comes."""
        return self.steps[-1].after

    def to_json(self) -> dict[str, Any]:
        """The policy as frozen into an alert's escalation (store: escalations.policy)."""
        return {
            "name": self.name,
            "steps": [{"after": s.after, "notify": list(s.notify)} for s in self.steps],
            "repeat": self.repeat,
            "reack": self.reack,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        return cls(
            str(data["name"]),
            tuple(Step(float(s["after"]), tuple(s["notify"])) for s in data["steps"]),
            int(data.get("repeat") or 0),
            None if data.get("reack") is None else float(data["reack"]),
        )

    def timeline(self) -> Iterator[tuple[float, int, int, Step]]:
        """(seconds after the start, round, step index, step) of every page the chain makes
        if nobody acknowledges and the alert stays open, in order. A new round starts
        round_gap after the last step, as if the alert had opened then."""
        at = 0.0
        for round_ in range(self.repeat + 1):
            if round_ > 0:
                at += self.round_gap
            for index, step in enumerate(self.steps):
                at += step.after
                yield at, round_, index, step

    def describe(self) -> str:
        """One line for `receiver check`: the steps and their offsets."""
        parts = [
            f"+{format_duration(at) if at else '0s'} {', '.join(step.notify)}"
            for at, round_, _, step in self.timeline()
            if round_ == 0
        ]
        tail = []
        if self.repeat:
            tail.append(f"repeat {self.repeat}")
        if self.reack is not None:
            tail.append(f"reack {format_duration(self.reack)}")
        extra = f" ({', '.join(tail)})" if tail else ""
        return f"{self.name}: {'; '.join(parts)}{extra}"


def check_escalations(raw: Any, targets: Sequence[str], problems: list[str]) -> dict[str, Policy]:
    """The policies under rules.yaml's `escalations:`, each problem appended to problems with
    the policy and key named: 'escalation "wake-someone": steps[2].after: ...'. targets: the
    notifier names and "schedule:NAME" targets defined."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"escalations: expected a mapping of policy names, got {show(raw)}")
        return {}
    found: dict[str, Policy] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            problems.append(
                f"escalations: invalid policy name {show(name)}; allowed: letters, digits, "
                "'_', '.', '-', starting with a letter or digit"
            )
            continue
        before = len(problems)
        policy = _check_one(name, spec, targets, problems)
        problems[before:] = [f'escalation "{name}": {p}' for p in problems[before:]]
        if policy is not None and len(problems) == before:
            found[name] = policy
    return found


def _check_one(name: str, spec: Any, targets: Sequence[str], problems: list[str]) -> Policy | None:
    if not isinstance(spec, dict):
        problems.append(f"expected a mapping with keys {', '.join(POLICY_KEYS)}, got {show(spec)}")
        return None
    for key in spec:
        if key not in POLICY_KEYS:
            problems.append(f'unknown key "{key}"; allowed: {", ".join(POLICY_KEYS)}')
    raw_steps = spec.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        problems.append(f"steps: expected a non-empty list of steps, got {show(raw_steps)}")
        return None
    if len(raw_steps) > MAX_STEPS:
        problems.append(f"steps: {len(raw_steps)} steps; at most {MAX_STEPS} are allowed")
        return None
    steps = [_step(i, s, targets, problems) for i, s in enumerate(raw_steps)]
    repeat = spec.get("repeat", 0)
    if type(repeat) is not int or not 0 <= repeat <= MAX_REPEAT:
        problems.append(
            f"repeat: expected a whole number from 0 to {MAX_REPEAT}, got {show(repeat)}"
        )
        repeat = 0
    reack = _duration("reack", spec["reack"], problems) if spec.get("reack") is not None else None
    if reack is not None and reack <= 0:
        problems.append("reack: 0s; use at least 1s, or leave reack out")
    if any(s is None for s in steps):
        return None
    done = tuple(s for s in steps if s is not None)
    if repeat and done[-1].after <= 0:
        problems.append(
            "repeat: the chain would start again at once; give the last step an after "
            "(a new round begins that long after it)"
        )
    return Policy(name, done, repeat, reack)


def _step(index: int, raw: Any, targets: Sequence[str], problems: list[str]) -> Step | None:
    where = f"steps[{index + 1}]"
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping with keys after, notify, got {show(raw)}")
        return None
    before = len(problems)
    for key in raw:
        if key not in STEP_KEYS:
            problems.append(f'{where}: unknown key "{key}"; allowed: {", ".join(STEP_KEYS)}')
    after = 0.0
    if "after" in raw:
        found = _duration(f"{where}.after", raw["after"], problems)
        after = found if found is not None else 0.0
        if found == 0 and index > 0:
            problems.append(
                f"{where}.after: 0s; a step after the first comes at least 1s after the one "
                "before (or list its targets in that step)"
            )
    elif index > 0:
        problems.append(f'{where}: missing required key "after" (how long after the step before)')
    notify = _targets(where, raw.get("notify"), targets, problems)
    if len(problems) > before:
        return None
    return Step(after, notify)


def _targets(where: str, raw: Any, targets: Sequence[str], problems: list[str]) -> tuple[str, ...]:
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names:
        problems.append(f"{where}.notify: expected a notifier name or a non-empty list of them")
        return ()
    result: list[str] = []
    for name in names:
        if not isinstance(name, str):
            problems.append(f"{where}.notify: expected notifier names, got {show(name)}")
        elif "://" in name:  # never echo it: a url pasted here usually carries a token
            problems.append(
                f"{where}.notify: an apprise url is not allowed here; define it under "
                "notifiers: and name that notifier"
            )
        elif name not in targets:
            kind = "schedule" if name.startswith("schedule:") else "notifier"
            problems.append(f'{where}.notify: undefined {kind} "{name}"')
        elif name in result:
            problems.append(f'{where}.notify: "{name}" is listed twice')
        else:
            result.append(name)
    return tuple(result)


def _duration(where: str, raw: Any, problems: list[str]) -> float | None:
    if not isinstance(raw, str):
        problems.append(f"{where}: expected a duration such as 2s, 5m, 1h30m, got {show(raw)}")
        return None
    try:
        return parse_duration(raw)
    except ValueError as exc:
        problems.append(f"{where}: {exc}")
        return None
