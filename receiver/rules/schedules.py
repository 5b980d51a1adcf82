"""On-call schedules: who of a rotation is on call at an instant, and when that changes.

A schedule rotates its members through shifts that start at a local handoff time in its
own timezone, so a daylight-saving change keeps the handoff at 09:00 local (the shift
around it is an hour shorter or longer). Overrides hand a window to someone else:

    schedules:
      primary:
        timezone: Europe/Berlin
        rotation: weekly        # daily, weekly, or a duration such as 12h
        handoff: "Mon 09:00"
        start: 2026-11-30       # the first shift begins at the handoff on or after this date
        members: [alice-chat, bob-chat, carol-mail]
        overrides:
          - {from: "2026-12-24T00:00", to: "2026-12-27T00:00", member: carol-mail}

`schedule:primary` is then a target wherever a notifier name is; routing puts the member
on call at that moment in the outbox row (Ruleset.on_call). Before the first shift the
rotation runs backwards, as if it had always run: a schedule always has someone on call.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from receiver.durations import parse_duration
from receiver.matchers import show
from receiver.rules.notifiers import NAME_RE

PREFIX = "schedule:"  # a target naming a schedule: "schedule:primary"
SCHEDULE_KEYS = ("timezone", "rotation", "handoff", "start", "members", "overrides")
OVERRIDE_KEYS = ("from", "to", "member")
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MIN_ROTATION = 3600.0  # a shift shorter than a daylight-saving jump could vanish in it

_HANDOFF_RE = re.compile(r"(?:(?P<day>[A-Z][a-z]{2}) )?(?P<hour>\d{2}):(?P<minute>\d{2})")
_LOCAL_RE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2})?")


@dataclass(frozen=True)
class Override:
    """member is on call from start (inclusive) to end (exclusive), both aware datetimes."""

    start: datetime
    end: datetime
    member: str


@dataclass(frozen=True)
class Schedule:
    """A validated schedule; build one with check_schedules (rules.load_text does)."""

    name: str
    zone: ZoneInfo
    period: timedelta  # the rotation, in local wall-clock time
    first: datetime  # the first shift's local start, naive (wall clock in zone)
    members: tuple[str, ...]
    overrides: tuple[Override, ...] = ()
    rotation: str = "weekly"
    handoff: str = "Mon 09:00"


@dataclass(frozen=True)
class Handoff:
    """From at on, member is on call (an aware datetime in the schedule's zone)."""

    at: datetime
    member: str


def who(schedule: Schedule, at: datetime | float) -> str:
    """The member on call at the instant at (an aware datetime or a Unix timestamp)."""
    instant = _instant(at)
    for override in schedule.overrides:
        if override.start <= instant < override.end:
            return override.member
    return schedule.members[_shift(schedule, instant) % len(schedule.members)]


def handoffs(schedule: Schedule, at: datetime | float, n: int) -> list[Handoff]:
    """The next n changes of who is on call after at: rotation handoffs and override edges
    where the member changes (a handoff inside an override changes nothing, so is left out).

    Example: a weekly "Mon 09:00" Berlin schedule [alice, bob] asked on a Wednesday gives
    [Handoff(next Mon 09:00 CET, "bob"), Handoff(the Mon after, "alice"), ...].
    """
    instant = _instant(at)
    current = who(schedule, instant)
    found: list[Handoff] = []
    # A rotation of one member (or [a, b, a]) may not change at every handoff: look a
    # bounded number of candidates ahead, enough for n changes if there are any.
    budget = (n + 1) * (len(schedule.members) + 1) + 2 * len(schedule.overrides)
    for moment in _candidates(schedule, instant):
        if len(found) >= n or budget <= 0:
            break
        budget -= 1
        member = who(schedule, moment)
        if member != current:
            found.append(Handoff(moment.astimezone(schedule.zone), member))
            current = member
    return found


def shift_start(schedule: Schedule, k: int) -> datetime:
    """The aware start of rotation shift k (0 is the first; negative ones run before it)."""
    return aware(schedule.first + k * schedule.period, schedule.zone)


def aware(wall: datetime, zone: ZoneInfo) -> datetime:
    """The UTC instant of the naive local time wall in zone. A time a daylight-saving gap
    skips (02:30 on a spring-forward night) is the instant the clock jumps, the first one
    after the gap: the shift starts at the jump, not a gap's length after it.

    Example: aware(2027-03-28 02:30, Europe/Berlin) is 01:00 UTC (03:00 CEST).
    """
    instant = wall.replace(tzinfo=zone).astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == wall:
        return instant
    # In a gap: fold=1 reads wall with the offset after the change, an instant before the
    # jump; fold=0 with the one before, the instant after it. The jump lies in between.
    before, after = wall.replace(tzinfo=zone, fold=1).astimezone(UTC), instant
    later = after.astimezone(zone).utcoffset()
    low, high = 0, int((after - before).total_seconds())
    while low < high:  # the first whole second whose offset is the later one
        middle = (low + high) // 2
        if (before + timedelta(seconds=middle)).astimezone(zone).utcoffset() == later:
            high = middle
        else:
            low = middle + 1
    return before + timedelta(seconds=low)


def _shift(schedule: Schedule, instant: datetime) -> int:
    """The rotation shift in which instant falls: shift_start(k) <= instant < shift_start(k+1)."""
    local = instant.astimezone(schedule.zone).replace(tzinfo=None)
    k = math.floor((local - schedule.first) / schedule.period)
    # The wall-clock estimate is off by one at most around a daylight-saving change.
    while shift_start(schedule, k) > instant:
        k -= 1
    while shift_start(schedule, k + 1) <= instant:
        k += 1
    return k


def _candidates(schedule: Schedule, instant: datetime) -> Iterator[datetime]:
    """Rotation handoffs and override edges after instant, in time order."""
    edges = sorted(
        {t for o in schedule.overrides for t in (o.start, o.end) if t > instant}, reverse=True
    )
    k = _shift(schedule, instant) + 1
    while True:
        rotation = shift_start(schedule, k)
        while edges and edges[-1] <= rotation:
            yield edges.pop()
        yield rotation
        k += 1


def _instant(at: datetime | float) -> datetime:
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ValueError("an instant needs a timezone")
        return at.astimezone(UTC)
    return datetime.fromtimestamp(at, UTC)


# -- validation ---------------------------------------------------------------------------------


def check_schedules(raw: Any, notifiers: Sequence[str], problems: list[str]) -> dict[str, Schedule]:
    """The schedules under rules.yaml's `schedules:`, each problem appended to problems
    with the schedule and key named: 'schedule "primary": handoff: ...'."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"schedules: expected a mapping of schedule names, got {show(raw)}")
        return {}
    found: dict[str, Schedule] = {}
    for name, spec in raw.items():
        label = f'schedule "{name}"'
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            problems.append(
                f"schedules: invalid schedule name {show(name)}; allowed: letters, digits, "
                "'_', '.', '-', starting with a letter or digit"
            )
            continue
        before = len(problems)
        schedule = _check_one(name, spec, notifiers, problems)
        problems[before:] = [f"{label}: {p}" for p in problems[before:]]
        if schedule is not None:
            found[name] = schedule
    return found


def _check_one(
    name: str, spec: Any, notifiers: Sequence[str], problems: list[str]
) -> Schedule | None:
    if not isinstance(spec, dict):
        problems.append(
            f"expected a mapping with keys {', '.join(SCHEDULE_KEYS)}, got {show(spec)}"
        )
        return None
    for key in spec:
        if key not in SCHEDULE_KEYS:
            problems.append(f'unknown key "{key}"; allowed: {", ".join(SCHEDULE_KEYS)}')
    for key in ("timezone", "handoff", "start", "members"):
        if key not in spec:
            problems.append(f'missing required key "{key}"')
    before = len(problems)
    zone = _zone(spec.get("timezone"), problems) if "timezone" in spec else None
    rotation = spec.get("rotation", "weekly")
    period = _rotation(rotation, problems)
    first = None
    if "handoff" in spec and "start" in spec and period is not None:
        first = _first(spec["handoff"], spec["start"], rotation, problems)
    members = _members(spec.get("members"), notifiers, problems) if "members" in spec else ()
    overrides = _overrides(spec.get("overrides"), zone, notifiers, problems)
    if len(problems) > before or zone is None or period is None or first is None or not members:
        return None
    return Schedule(
        name, zone, period, first, members, overrides, str(rotation), str(spec["handoff"])
    )


def _zone(raw: Any, problems: list[str]) -> ZoneInfo | None:
    if not isinstance(raw, str) or not raw:
        problems.append(
            f"timezone: expected an IANA zone name such as Europe/Berlin, got {show(raw)}"
        )
        return None
    try:
        return ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(f'timezone: unknown zone "{raw}"; use an IANA name such as Europe/Berlin')
        return None


def _rotation(raw: Any, problems: list[str]) -> timedelta | None:
    if raw == "daily":
        return timedelta(days=1)
    if raw == "weekly":
        return timedelta(weeks=1)
    allowed = "daily, weekly, or a duration such as 12h"
    if not isinstance(raw, str):
        problems.append(f"rotation: expected {allowed}, got {show(raw)}")
        return None
    try:
        seconds = parse_duration(raw)
    except ValueError as exc:
        problems.append(f"rotation: {exc}; allowed: {allowed}")
        return None
    if seconds < MIN_ROTATION:
        problems.append(f'rotation: "{raw}" is shorter than 1h; a shift lasts at least 1h')
        return None
    return timedelta(seconds=seconds)


def _first(handoff: Any, start: Any, rotation: Any, problems: list[str]) -> datetime | None:
    """The first shift's local start: the handoff on or after start."""
    weekly = rotation == "weekly"
    example = '"Mon 09:00"' if weekly else '"09:00"'
    m = _HANDOFF_RE.fullmatch(handoff) if isinstance(handoff, str) else None
    hour = int(m["hour"]) if m else 0
    minute = int(m["minute"]) if m else 0
    if m is None or hour > 23 or minute > 59:
        problems.append(f"handoff: expected a local time such as {example}, got {show(handoff)}")
        return None
    if weekly and m["day"] not in DAYS:
        problems.append(
            f"handoff: a weekly rotation hands off on a day and time such as {example}; "
            f"days: {', '.join(DAYS)}; got {show(handoff)}"
        )
        return None
    if not weekly and m["day"] is not None:
        problems.append(
            f'handoff: only a weekly rotation names a day; use a time such as "09:00", '
            f"got {show(handoff)}"
        )
        return None
    day = _date(start)
    if day is None:
        problems.append(f"start: expected a date such as 2026-11-30, got {show(start)}")
        return None
    if weekly:
        day += timedelta(days=(DAYS.index(m["day"]) - day.weekday()) % 7)
    return datetime(day.year, day.month, day.day, hour, minute)


def _date(raw: Any) -> date | None:
    if isinstance(raw, datetime):
        return None
    if isinstance(raw, date):
        return raw
    if isinstance(raw, str):
        try:
            return date.fromisoformat(raw)
        except ValueError:
            return None
    return None


def _members(raw: Any, notifiers: Sequence[str], problems: list[str]) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        problems.append(f"members: expected a non-empty list of notifier names, got {show(raw)}")
        return ()
    for member in raw:
        _member(member, "members", notifiers, problems)
    return tuple(str(m) for m in raw)


def _member(raw: Any, key: str, notifiers: Sequence[str], problems: list[str]) -> None:
    if not isinstance(raw, str):
        problems.append(f"{key}: expected notifier names, got {show(raw)}")
    elif raw not in notifiers:
        problems.append(f'{key}: undefined notifier "{raw}"; defined: {", ".join(notifiers)}')


def _overrides(
    raw: Any, zone: ZoneInfo | None, notifiers: Sequence[str], problems: list[str]
) -> tuple[Override, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(f"overrides: expected a list of {{from, to, member}}, got {show(raw)}")
        return ()
    found: list[Override] = []
    for index, item in enumerate(raw):
        where = f"overrides[{index}]"
        if not isinstance(item, dict):
            problems.append(
                f"{where}: expected a mapping with keys from, to, member, got {show(item)}"
            )
            continue
        before = len(problems)
        for key in item:
            if key not in OVERRIDE_KEYS:
                problems.append(
                    f'{where}: unknown key "{key}"; allowed: {", ".join(OVERRIDE_KEYS)}'
                )
        for key in OVERRIDE_KEYS:
            if key not in item:
                problems.append(f'{where}: missing required key "{key}"')
        if "member" in item:
            _member(item["member"], f"{where}.member", notifiers, problems)
        ends = [_local(item.get(key), f"{where}.{key}", problems) for key in ("from", "to")]
        if len(problems) > before or zone is None or ends[0] is None or ends[1] is None:
            continue
        start, end = (aware(t, zone) for t in ends if t is not None)
        if end <= start:
            problems.append(f'{where}: to "{item["to"]}" is not after from "{item["from"]}"')
            continue
        found.append(Override(start, end, str(item["member"])))
    found.sort(key=lambda o: o.start)
    for earlier, later in zip(found, found[1:], strict=False):
        if later.start < earlier.end:
            problems.append(
                f"overrides: {_show_local(later, zone)} overlaps {_show_local(earlier, zone)}; "
                "overrides must not overlap"
            )
    return tuple(found)


def _local(raw: Any, key: str, problems: list[str]) -> datetime | None:
    if isinstance(raw, datetime) and raw.tzinfo is None:
        return raw
    if isinstance(raw, str) and _LOCAL_RE.fullmatch(raw):
        try:
            return datetime.fromisoformat(raw)
        except ValueError:
            pass
    if raw is not None:
        problems.append(
            f'{key}: expected a local date and time such as "2026-12-24T00:00", got {show(raw)}'
        )
    return None


def _show_local(override: Override, zone: ZoneInfo | None) -> str:
    start, end = (
        t.astimezone(zone).strftime("%Y-%m-%dT%H:%M") for t in (override.start, override.end)
    )
    return f"{start}..{end} ({override.member})"


def describe(schedule: Schedule) -> str:
    """One line for `receiver check`: 'primary: weekly from Mon 09:00 Europe/Berlin: a, b'."""
    extra = f", {len(schedule.overrides)} override(s)" if schedule.overrides else ""
    return (
        f"{schedule.name}: {schedule.rotation} at {schedule.handoff} {schedule.zone.key} "
        f"from {schedule.first:%Y-%m-%d}: {', '.join(schedule.members)}{extra}"
    )
