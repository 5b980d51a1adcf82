"""The alert-lifecycle options of a rule (hold, resolve, group, repeat, active, storm, flap)
and the top-level heartbeat: their shapes, validation, and the pure time arithmetic of active
windows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from receiver.durations import format_duration, parse_duration
from receiver.matchers import show

LIFECYCLE_KEYS = (
    "hold", "resolve", "resolved_title", "resolved_body", "group", "repeat", "active", "storm",
    "flap",
)  # fmt: skip
# The options that make a rule follow its alert's state, and so the order of the alert's
# events: a late event (older than the alert's newest) is stale for such a rule and sends
# nothing. A rule with none of them forwards every matching event, in any order. group,
# active and throttle go by the receiver's clock, not the alert, and do not count.
ALERT_KEYS = ("hold", "resolve", "repeat", "escalate", "flap")
# Pairs of rule keys that do not combine, each with the reason `receiver check` gives
# (named by its second key). Every other pair combines; docs/rules.md has the table of
# what each pair does, and tests/dispatch/test_key_pairs.py runs every pair.
_DIGEST = "a rule that groups events into digests sends one message for many alerts"
REFUSED: dict[tuple[str, str], str] = {
    ("group", "storm"): f"{_DIGEST} already; use storm or group",
    ("group", "escalate"): (
        "a rule that groups events into digests cannot escalate; escalate from a rule of its own"
    ),
    ("group", "hold"): (
        f"{_DIGEST}, never one alert's notification to hold; hold in a rule of its own"
    ),
    ("group", "resolve"): (
        f"{_DIGEST}, never one alert's notification, so no alert's resolve answers it;"
        " resolve in a rule of its own"
    ),
    ("group", "repeat"): (
        f"{_DIGEST}, never one alert's notification to repeat; repeat in a rule of its own"
    ),
    ("group", "throttle"): f"{_DIGEST} a wait already; use throttle or group",
    ("group", "flap"): (
        f"{_DIGEST}, never one alert's notification, so no alert's changes can hold it back;"
        " detect flapping in a rule of its own"
    ),
    ("flap", "throttle"): (
        "flap already holds back an alert's messages while it flaps, and a throttle would"
        " drop its one flapping message or its settle message; use flap or throttle"
    ),
    ("escalate", "throttle"): (
        "a chain pages each alert once already, so throttle would hold back nothing it"
        " pages; cap a burst of alerts with storm: {max, per}"
    ),
}
ESCALATE_ONLY_REPEAT = (
    "a rule that only escalates (no notify) has no notification of its own to repeat;"
    " repeat the chain with its policy's repeat, or add notify"
)
ALL_KEYS = ("notify", "escalate", "throttle", "continue", *LIFECYCLE_KEYS)
GROUP_KEYS = ("by", "wait", "max")
ACTIVE_KEYS = ("days", "hours", "tz", "defer")
HEARTBEAT_KEYS = ("silent_for", "notify")
STORM_KEYS = ("max", "per")
FLAP_KEYS = ("changes", "within", "quiet")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
# Which events open and which close an alert, and its kind: a session's attention, or an
# intervention (keyed by session and interventionId).
OPENS = {"score.drop": "session", "intervention.fired": "intervention"}
CLOSES = {
    "score.recover": "session",
    "session.stopped": "session",
    "intervention.resolved": "intervention",
}
_HOURS = re.compile(r"([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)")


@dataclass(frozen=True)
class GroupSpec:
    """Events matching inside `wait` with the same values of `by` go out as one digest."""

    by: tuple[str, ...]
    wait: float
    max: int

    def key(self, payload: dict[str, Any]) -> str:
        return "|".join(f"{field}={_flat(payload.get(field))}" for field in self.by) or "*"


@dataclass(frozen=True)
class ActiveWindow:
    """When a rule may notify: weekdays and a daily time range in one time zone.

    A range whose end is not after its start runs overnight: "20:00-08:00" on
    mon starts Monday evening and ends Tuesday morning.

    >>> w = ActiveWindow(frozenset({0}), 8 * 60, 20 * 60, ZoneInfo("UTC"), defer=False)
    >>> w.contains(datetime(2026, 11, 23, 9, 0, tzinfo=ZoneInfo("UTC")).timestamp())
    True
    """

    days: frozenset[int]
    start: int  # minutes after local midnight
    end: int
    tz: ZoneInfo
    defer: bool
    text: str = ""

    def contains(self, ts: float) -> bool:
        local = datetime.fromtimestamp(ts, self.tz)
        minute = local.hour * 60 + local.minute
        day = local.weekday()
        if self.start < self.end:
            return day in self.days and self.start <= minute < self.end
        return (minute >= self.start and day in self.days) or (
            minute < self.end and (day - 1) % 7 in self.days
        )

    def next_open(self, ts: float) -> float:
        """The first moment at or after ts inside the window."""
        if self.contains(ts):
            return ts
        local = datetime.fromtimestamp(ts, self.tz)
        for offset in range(8):
            day: date = local.date() + timedelta(days=offset)
            if day.weekday() not in self.days:
                continue
            begin = datetime.combine(day, time(self.start // 60, self.start % 60), self.tz)
            if begin.timestamp() > ts:
                return begin.timestamp()
        raise ValueError("window has no days")  # unreachable: days is never empty


@dataclass(frozen=True)
class StormSpec:
    """A storm guard: past `max` notifications of the rule inside `per` seconds, one storm
    message a window instead of the rest (receiver.dispatch.storm)."""

    max: int
    per: float


@dataclass(frozen=True)
class FlapSpec:
    """Flap detection: `changes` opens and resolves of one alert within `within` seconds make
    it flapping (one message, the rest held) until it stays in one state for `quiet`
    seconds (one settle message; receiver.dispatch.flap)."""

    changes: int
    within: float
    quiet: float

    @property
    def text(self) -> str:
        return f"{self.changes} changes in {format_duration(self.within)}"


@dataclass(frozen=True)
class Heartbeat:
    """Alert when no event at all has arrived for `silent_for` seconds."""

    silent_for: float
    notify: tuple[str, ...]


def check_options(raw: dict[str, Any], label: str, problems: list[str]) -> dict[str, Any]:
    """The lifecycle keyword arguments of a Rule from its raw mapping, adding any problems."""
    found: dict[str, Any] = {}
    for key in ("hold", "repeat"):
        if raw.get(key) is not None:
            found[key] = _duration(raw[key], f"{label}: {key}", problems)
    if "resolve" in raw and not isinstance(raw["resolve"], bool):
        problems.append(f"{label}: resolve: expected true or false, got {show(raw['resolve'])}")
    found["resolve"] = raw.get("resolve") is True
    if raw.get("group") is not None:
        found["group"] = _group(raw["group"], f"{label}: group", problems)
    if raw.get("active") is not None:
        found["active"] = _active(raw["active"], f"{label}: active", problems)
    if raw.get("storm") is not None:
        found["storm"] = _storm(raw["storm"], f"{label}: storm", problems)
    if raw.get("flap") is not None:
        found["flap"] = _flap(raw["flap"], f"{label}: flap", problems)
    check_pairs(raw, label, problems)
    for key in ("resolved_title", "resolved_body"):
        if key in raw and not raw.get("resolve"):
            problems.append(f"{label}: {key}: only used with resolve: true")
    return found


def check_pairs(raw: dict[str, Any], label: str, problems: list[str]) -> None:
    """A problem for each pair of the rule's keys that REFUSED names (and for repeat on a
    rule that only escalates), named by the pair's second key."""
    present = {key for key in ALL_KEYS if raw.get(key) not in (None, False)}
    for (first, second), why in REFUSED.items():
        if first in present and second in present:
            problems.append(f"{label}: {second}: {why}")
    if {"escalate", "repeat"} <= present and raw.get("notify") is None:
        problems.append(f"{label}: repeat: {ESCALATE_ONLY_REPEAT}")


def check_heartbeat(raw: Any, problems: list[str]) -> tuple[Heartbeat | None, list[str]]:
    """The heartbeat and the notifier names it uses (checked against notifiers by the caller)."""
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        problems.append(f"heartbeat: expected a mapping with keys {', '.join(HEARTBEAT_KEYS)}")
        return None, []
    _unknown(raw, HEARTBEAT_KEYS, "heartbeat", problems)
    if "silent_for" not in raw or "notify" not in raw:
        problems.append('heartbeat: "silent_for" and "notify" are both required')
        return None, []
    silent = _duration(raw["silent_for"], "heartbeat: silent_for", problems)
    names = [raw["notify"]] if isinstance(raw["notify"], str) else raw["notify"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        problems.append("heartbeat: notify: expected a notifier name or a non-empty list of them")
        return None, []
    return Heartbeat(silent or 1.0, tuple(names)), list(names)


def _duration(value: Any, where: str, problems: list[str]) -> float:
    try:
        seconds = parse_duration(str(value)) if isinstance(value, str) else -1.0
    except ValueError as exc:
        problems.append(f"{where}: {exc}")
        return 0.0
    if seconds <= 0:
        problems.append(f"{where}: expected a duration such as 90s, 15m, 1h30m, got {show(value)}")
    return seconds


def _storm(raw: Any, where: str, problems: list[str]) -> StormSpec | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping with keys {', '.join(STORM_KEYS)}")
        return None
    _unknown(raw, STORM_KEYS, where, problems)
    if "max" not in raw or "per" not in raw:
        problems.append(f'{where}: "max" and "per" are both required, as in {{max: 10, per: 5m}}')
        return None
    most = raw["max"]
    if type(most) is not int or most < 1:
        problems.append(f"{where}.max: expected a whole number of at least 1, got {show(most)}")
        most = 1
    per = _duration(raw["per"], f"{where}.per", problems)
    return StormSpec(most, per or 1.0)


def _flap(raw: Any, where: str, problems: list[str]) -> FlapSpec | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping with keys {', '.join(FLAP_KEYS)}")
        return None
    _unknown(raw, FLAP_KEYS, where, problems)
    missing = [k for k in FLAP_KEYS if k not in raw]
    if missing:
        problems.append(
            f"{where}: {', '.join(f'{k!r}' for k in missing)} required, as in"
            " {changes: 4, within: 10m, quiet: 15m}"
        )
        return None
    changes = raw["changes"]
    if type(changes) is not int or not 2 <= changes <= 1000:
        problems.append(
            f"{where}.changes: expected a whole number from 2 to 1000, got {show(changes)}"
        )
        changes = 2
    within = _duration(raw["within"], f"{where}.within", problems)
    quiet = _duration(raw["quiet"], f"{where}.quiet", problems)
    return FlapSpec(changes, within or 1.0, quiet or 1.0)


def _group(raw: Any, where: str, problems: list[str]) -> GroupSpec | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping with keys {', '.join(GROUP_KEYS)}")
        return None
    _unknown(raw, GROUP_KEYS, where, problems)
    by = raw.get("by", [])
    by = [by] if isinstance(by, str) else by
    if not isinstance(by, list) or not all(isinstance(f, str) and f for f in by):
        problems.append(f"{where}.by: expected a list of payload field names, got {show(by)}")
        by = []
    wait = _duration(raw.get("wait", "30s"), f"{where}.wait", problems)
    most = raw.get("max", 50)
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        problems.append(f"{where}.max: expected a whole number of at least 1, got {show(most)}")
        most = 50
    return GroupSpec(tuple(by), wait, most)


def _active(raw: Any, where: str, problems: list[str]) -> ActiveWindow | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping with keys {', '.join(ACTIVE_KEYS)}")
        return None
    _unknown(raw, ACTIVE_KEYS, where, problems)
    days_raw = raw.get("days", list(DAYS))
    days: set[int] = set()
    for day in days_raw if isinstance(days_raw, list) else [days_raw]:
        if isinstance(day, str) and day.lower()[:3] in DAYS and len(day) >= 3:
            days.add(DAYS.index(day.lower()[:3]))
        else:
            problems.append(f"{where}.days: unknown day {show(day)}; allowed: {', '.join(DAYS)}")
    hours = raw.get("hours", "00:00-24:00")
    match = _HOURS.fullmatch(hours) if isinstance(hours, str) else None
    if match is None:
        problems.append(
            f'{where}.hours: expected "HH:MM-HH:MM" such as "08:00-20:00", got {show(hours)}'
        )
        return None
    h1, m1, h2, m2 = (int(g) for g in match.groups())
    tz_name = raw.get("tz", "UTC")
    try:
        tz = ZoneInfo(str(tz_name))
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(
            f"{where}.tz: unknown time zone {show(tz_name)}; use an IANA name "
            'such as "Europe/Berlin" or "UTC"'
        )
        return None
    defer = raw.get("defer", False)
    if not isinstance(defer, bool):
        problems.append(f"{where}.defer: expected true or false, got {show(defer)}")
    if not days:
        return None
    start, end = h1 * 60 + m1, h2 * 60 + m2
    text = f"{','.join(DAYS[d] for d in sorted(days))} {hours} {tz_name}"
    return ActiveWindow(
        frozenset(days), start, end if end != start else start + 24 * 60, tz, defer is True, text
    )


def _unknown(
    raw: dict[str, Any], allowed: tuple[str, ...], where: str, problems: list[str]
) -> None:
    for key in raw:
        if key not in allowed:
            problems.append(f'{where}: unknown key "{key}"; allowed: {", ".join(allowed)}')


def _flat(value: Any) -> str:
    return "" if value is None else str(value)
