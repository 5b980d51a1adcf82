"""Recurring maintenance windows (rules.yaml `maintenance:`): their shapes, validation, and
the pure time arithmetic of "is t inside window W" and "the next windows after t".

A window is inside exactly when the wall clock of its timezone is inside one of its weekly
ranges or one-off dates, so DST keeps local times: "Sat 22:00-Sun 02:00" is 22:00 local
in summer and winter alike. On a DST day a local time may not exist or may happen twice;
reading the wall clock settles both: a range that starts at a time the clock skips starts
when the clock jumps past it, and a time the clock shows twice is inside (or outside)
both times. docs/alert-lifecycle.md says the same for users.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from receiver.matchers import Condition, compile_match, show

KEYS = ("name", "match", "timezone", "every", "dates", "notify")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY = 86400  # seconds
WEEK = 7 * DAY
_RANGE = re.compile(
    r"(?P<d1>[A-Za-z]{3})\s+(?P<t1>\d\d:\d\d(?::\d\d)?)\s*-\s*(?:(?P<d2>[A-Za-z]{3})\s+)?(?P<t2>\d\d:\d\d(?::\d\d)?)"
)
_DATES = re.compile(r"(\d{4}-\d\d-\d\d)(?:\.\.(\d{4}-\d\d-\d\d))?")
# How far the listing looks for a window that comes again (one-off dates further on too).
HORIZON = timedelta(days=400)


@dataclass(frozen=True)
class Weekly:
    """A weekly range in seconds of the local week (Mon 00:00 is 0); end < start wraps
    past Sunday midnight."""

    start: int
    end: int
    text: str

    def holds(self, second: int) -> bool:
        if self.start < self.end:
            return self.start <= second < self.end
        return second >= self.start or second < self.end


@dataclass(frozen=True, eq=False)  # one per rules file, compared (and cached) as itself
class Window:
    """One named maintenance window of rules.yaml."""

    name: str
    tz: ZoneInfo
    weekly: tuple[Weekly, ...] = ()
    dates: tuple[tuple[date, date], ...] = ()  # inclusive local days
    conditions: tuple[Condition, ...] = ()
    notify: tuple[str, ...] = ()

    def matches(self, payload: Mapping[str, Any]) -> bool:
        return all(c.holds(payload) for c in self.conditions)

    def contains(self, t: float) -> bool:
        """Whether the instant t (epoch seconds) is inside the window: its wall clock is."""
        local = datetime.fromtimestamp(t, self.tz)
        day = local.date()
        if any(first <= day <= last for first, last in self.dates):
            return True
        second = local.weekday() * DAY + local.hour * 3600 + local.minute * 60 + local.second
        return any(r.holds(second) for r in self.weekly)

    def spans(self, since: float, until: float) -> list[tuple[float, float]]:
        """The window's stretches [start, end) that overlap [since, until), whole: one
        that began before since starts where it began (up to 8 days before)."""
        points = sorted(p for p in self._boundaries(since - 8 * 86400, until) if p < until)
        found: list[tuple[float, float]] = []
        start: float | None = None
        inside = self.contains(points[0]) if points else False
        for point in points:
            now_inside = self.contains(point)
            if now_inside and not inside:
                start = point
            elif inside and not now_inside and start is not None:
                found.append((start, point))
                start = None
            inside = now_inside
        if start is not None:  # still inside at until: the end lies further on
            found.append((start, self._end_after(until)))
        return [(s, e) for s, e in found if e > since]

    def around(self, t: float) -> tuple[float, float] | None:
        """The stretch of the window that t is inside, if any."""
        if not self.contains(t):
            return None
        return next(((s, e) for s, e in self.spans(t, t + 1) if s <= t < e), None)

    def upcoming(self, t: float, n: int) -> list[tuple[float, float]]:
        """The next n stretches that end after t (one t is inside first), soonest first."""
        found: list[tuple[float, float]] = []
        step = 14 * 86400
        since = t
        limit = t + HORIZON.total_seconds() + self._last_date_after(t)
        while len(found) < n and since < limit:
            for span in self.spans(since, since + step):
                if span[1] > t and span not in found:
                    found.append(span)
            since += step
        return sorted(found)[:n]

    def _last_date_after(self, t: float) -> float:
        """Seconds from t to the end of the last one-off date (0 if none lies beyond)."""
        ends = [_local(last + timedelta(days=1), time(0), self.tz, 0) for _, last in self.dates]
        return max([e - t for e in ends if e > t] or [0.0])

    def _end_after(self, t: float) -> float:
        """The first boundary after t where the window is no longer in force."""
        since, limit = t, t + HORIZON.total_seconds()
        while since < limit:
            chunk = since + 8 * 86400
            for point in sorted(p for p in self._boundaries(since, chunk) if p > t):
                if not self.contains(point):
                    return point
            since = chunk
        return limit  # in force all the time (its ranges chained): as good as never ends

    def _boundaries(self, since: float, until: float) -> Iterator[float]:
        """Every instant in [since, until] where the wall clock may enter or leave the
        window: each range's ends and each date's midnights (both readings of a local time
        the clock shows twice), and the DST jump between two readings that differ."""
        first = datetime.fromtimestamp(since, self.tz).date() - timedelta(days=1)
        last = datetime.fromtimestamp(until, self.tz).date() + timedelta(days=1)
        local: list[tuple[date, time]] = []
        day = first
        while day <= last:
            for r in self.weekly:
                for second in (r.start, r.end):
                    if second // DAY % 7 == day.weekday():
                        into = second % DAY
                        local.append((day, time(into // 3600, into // 60 % 60, into % 60)))
            local.append((day, time(0)))
            day += timedelta(days=1)
        for day, at in local:
            early, late = _local(day, at, self.tz, 0), _local(day, at, self.tz, 1)
            yield early
            yield late
            if early != late:
                yield _jump(min(early, late), max(early, late), self.tz)


def _local(day: date, at: time, tz: ZoneInfo, fold: int) -> float:
    return datetime.combine(day, at, tzinfo=tz).replace(fold=fold).timestamp()


def _jump(lo: float, hi: float, tz: ZoneInfo) -> float:
    """The first second in (lo, hi] with hi's UTC offset: where the clock jumps."""
    target = datetime.fromtimestamp(hi, tz).utcoffset()
    lo_s, hi_s = int(lo), int(hi)
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == target:
            hi_s = mid
        else:
            lo_s = mid
    return float(hi_s)


def holding(windows: Sequence[Window], payload: Mapping[str, Any], now: float) -> Window | None:
    """The first window that matches payload and is in force at now."""
    for window in windows:
        if window.weekly or window.dates:
            if window.matches(payload) and window.contains(now):
                return window
    return None


@functools.lru_cache(maxsize=256)  # a batch's rows share one now: its end is found once
def held_reason(window: Window, now: float) -> str:
    """An outbox row's reason: "maintenance: weekly-deploy (until 2026-11-29 02:00 CET)"."""
    span = window.around(now)
    if span is None:
        return f"maintenance: {window.name}"
    end = datetime.fromtimestamp(span[1], window.tz)
    return f"maintenance: {window.name} (until {end.strftime(f'%Y-%m-%d {_clock(end)} %Z')})"


def next_boundary(windows: Iterable[Window], now: float) -> float | None:
    """The soonest start or end of any window after now (the timers wake then)."""
    soonest: float | None = None
    for window in windows:
        for start, end in window.spans(now, now + 8 * 86400):
            for point in (start, end):
                if point > now and (soonest is None or point < soonest):
                    soonest = point
    return soonest


def check_maintenance(raw: Any, defined: Sequence[str], problems: list[str]) -> tuple[Window, ...]:
    """The maintenance windows of rules.yaml; each problem appended with its window."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append("maintenance: must be a list of windows, each with name and every/dates")
        return ()
    windows: list[Window] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        window = _check_window(index, item, defined, seen, problems)
        if window is not None:
            windows.append(window)
    return tuple(windows)


def _check_window(
    index: int, item: Any, defined: Sequence[str], seen: set[str], problems: list[str]
) -> Window | None:
    if not isinstance(item, dict):
        problems.append(f"maintenance[{index}]: must be a mapping with name and every/dates")
        return None
    name = item.get("name")
    label = f'maintenance "{name}"' if isinstance(name, str) and name else f"maintenance[{index}]"
    before = len(problems)
    for key in item:
        if key not in KEYS:
            problems.append(f"{label}: unknown key {show(key)}; allowed: {', '.join(KEYS)}")
    if not isinstance(name, str) or not name.strip():
        problems.append(f"{label}: name is required (a non-empty string)")
    elif name in seen:
        problems.append(f"{label}: the name is used by another window; names must differ")
    else:
        seen.add(name)
    tz = _timezone(item.get("timezone", "UTC"), label, problems)
    weekly = tuple(_weekly(item.get("every"), label, problems))
    dates = tuple(_dates(item.get("dates"), label, problems))
    if not weekly and not dates and "every" not in item and "dates" not in item:
        problems.append(f"{label}: needs every (weekly ranges) or dates (one-off days)")
    raw_match = item.get("match")
    conditions: tuple[Condition, ...] = ()
    if raw_match is not None and not isinstance(raw_match, dict):
        problems.append(f"{label}: match must be a mapping of fields to matchers")
    else:
        found, wrong = compile_match(raw_match)
        conditions = tuple(found)
        problems.extend(f"{label}: {p}" for p in wrong)
    notify = _notify(item.get("notify"), label, defined, problems)
    if len(problems) > before or tz is None:
        return None
    return Window(str(name), tz, weekly, dates, conditions, notify)


def _timezone(raw: Any, label: str, problems: list[str]) -> ZoneInfo | None:
    try:
        if not isinstance(raw, str) or not raw:
            raise ValueError
        return ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(
            f"{label}: timezone {show(raw)} is not a known IANA zone such as Europe/Berlin or UTC"
        )
        return None


def _weekly(raw: Any, label: str, problems: list[str]) -> Iterator[Weekly]:
    if raw is None:
        return
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        problems.append(f'{label}: every must be a list of ranges such as "Sat 22:00-Sun 02:00"')
        return
    for text in items:
        found = _RANGE.fullmatch(text.strip()) if isinstance(text, str) else None
        if found is None:
            problems.append(
                f"{label}: every: {show(text)} is not a range such as"
                ' "Sat 22:00-Sun 02:00" or "Wed 12:00-12:30"'
            )
            continue
        yield from _range(found, str(text), label, problems)


def _range(found: re.Match[str], text: str, label: str, problems: list[str]) -> Iterator[Weekly]:
    d1, d2 = found["d1"].lower(), (found["d2"] or found["d1"]).lower()
    wrong = [d for d in (d1, d2) if d not in DAYS]
    if wrong:
        problems.append(
            f"{label}: every: {show(text)}: unknown day {show(wrong[0])}; days: {', '.join(DAYS)}"
        )
        return
    t1, t2 = _second(found["t1"], end=False), _second(found["t2"], end=True)
    if t1 is None or t2 is None:
        problems.append(
            f"{label}: every: {show(text)}: times are HH:MM from 00:00 to 24:00"
            " (seconds optional: HH:MM:SS)"
        )
        return
    start, end = DAYS.index(d1) * DAY + t1, DAYS.index(d2) * DAY + t2
    if d1 == d2 and end == start:
        problems.append(f"{label}: every: {show(text)} is empty: it ends where it starts")
        return
    if d1 == d2 and end < start:
        problems.append(
            f"{label}: every: {show(text)} is reversed: it ends before it starts; to cross"
            f' midnight name the end day, such as "{found["d1"]} {found["t1"]}-'
            f'{DAYS[(DAYS.index(d1) + 1) % 7].title()} {found["t2"]}"'
        )
        return
    yield Weekly(start % WEEK, end % WEEK, text)


def _second(text: str, *, end: bool) -> int | None:
    """Seconds into the day of "HH:MM" or "HH:MM:SS"; 24:00 only as an end."""
    hours, minutes, seconds = int(text[:2]), int(text[3:5]), int(text[6:] or 0)
    if minutes > 59 or seconds > 59 or hours > 24:
        return None
    if hours == 24 and (minutes or seconds or not end):
        return None
    return hours * 3600 + minutes * 60 + seconds


def _dates(raw: Any, label: str, problems: list[str]) -> Iterator[tuple[date, date]]:
    if raw is None:
        return
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        problems.append(f'{label}: dates must be a list such as ["2026-12-24..2026-12-26"]')
        return
    for text in items:
        found = _DATES.fullmatch(str(text).strip()) if isinstance(text, str | date) else None
        try:
            if found is None:
                raise ValueError
            first = date.fromisoformat(found[1])
            last = date.fromisoformat(found[2] or found[1])
        except ValueError:
            problems.append(
                f"{label}: dates: {show(text)} is not a day or days such as"
                ' "2026-12-24" or "2026-12-24..2026-12-26"'
            )
            continue
        if last < first:
            problems.append(f"{label}: dates: {show(text)} is reversed: it ends before it starts")
            continue
        yield first, last


def _notify(raw: Any, label: str, defined: Sequence[str], problems: list[str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(n, str) for n in items):
        problems.append(f"{label}: notify must be a list of notifier names")
        return ()
    known = [n for n in defined if not n.startswith("schedule:")]
    for name in items:
        if name not in known:
            problems.append(
                f'{label}: undefined notifier "{name}" in notify; defined: {", ".join(known)}'
            )
    return tuple(items)


def describe(window: Window, start: float, end: float) -> dict[str, str]:
    """One stretch for `receiver maintenance`: local and UTC start and end."""

    def both(at: float) -> tuple[str, str]:
        moment = datetime.fromtimestamp(at, window.tz)
        local = moment.strftime(f"%a %Y-%m-%d {_clock(moment)} %Z")
        return local, datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    (ls, us), (le, ue) = both(start), both(end)
    return {"name": window.name, "start": ls, "end": le, "start_utc": us, "end_utc": ue}


def _clock(moment: datetime) -> str:
    """The time format for moment: seconds only when a range has them (few do)."""
    return "%H:%M:%S" if moment.second else "%H:%M"
