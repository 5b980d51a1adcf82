"""On-call schedules (receiver/rules/schedules.py): who is on call, when that changes, across
daylight-saving changes and overrides; examples, then properties over random times and zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receiver.rules.schedules import Schedule, check_schedules, handoffs, shift_start, who

MEMBERS = ["alice", "bob", "carol"]
NOTIFIERS = [*MEMBERS, "dave"]
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def schedule(**spec: Any) -> Schedule:
    raw = {
        "timezone": "Europe/Berlin",
        "rotation": "weekly",
        "handoff": "Mon 09:00",
        "start": "2026-11-30",
        "members": MEMBERS,
        **spec,
    }
    problems: list[str] = []
    found = check_schedules({"primary": raw}, NOTIFIERS, problems)
    assert problems == []
    return found["primary"]


def local(text: str, zone: ZoneInfo = BERLIN) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=zone)


@pytest.mark.parametrize(
    ("when", "member"),
    [
        pytest.param("2026-11-30T09:00", "alice", id="first-shift-starts-at-the-handoff"),
        pytest.param("2026-12-07T08:59", "alice", id="a-minute-before-the-next-handoff"),
        pytest.param("2026-12-07T09:00", "bob", id="the-next-handoff"),
        pytest.param("2026-12-14T09:00", "carol", id="third"),
        pytest.param("2026-12-21T09:00", "alice", id="wraps-around"),
        pytest.param("2026-11-30T08:59", "carol", id="before-start-the-rotation-runs-backwards"),
    ],
)
def test_a_weekly_rotation_hands_off_on_monday_at_nine(when: str, member: str) -> None:
    assert who(schedule(), local(when)) == member


def test_the_first_shift_begins_at_the_handoff_on_or_after_start() -> None:
    s = schedule(start="2026-12-02")  # a Wednesday: the first shift is Monday the 7th
    assert shift_start(s, 0) == local("2026-12-07T09:00")
    assert who(s, local("2026-12-07T09:00")) == "alice"


def test_an_override_wins_inside_its_window_only() -> None:
    s = schedule(
        overrides=[{"from": "2026-12-24T00:00", "to": "2026-12-27T00:00", "member": "dave"}]
    )
    assert who(s, local("2026-12-23T23:59")) == "alice"
    assert who(s, local("2026-12-24T00:00")) == "dave"
    assert who(s, local("2026-12-26T23:59")) == "dave"
    assert who(s, local("2026-12-27T00:00")) == "alice"


def test_handoffs_list_changes_of_who_is_on_call_overrides_included() -> None:
    s = schedule(
        overrides=[{"from": "2026-12-24T00:00", "to": "2026-12-27T00:00", "member": "dave"}]
    )
    got = [(h.at, h.member) for h in handoffs(s, local("2026-12-15T12:00"), 4)]
    assert got == [
        (local("2026-12-21T09:00"), "alice"),
        (local("2026-12-24T00:00"), "dave"),
        (local("2026-12-27T00:00"), "alice"),
        (local("2026-12-28T09:00"), "bob"),
    ]


def test_a_handoff_hidden_by_an_override_is_not_listed() -> None:
    s = schedule(
        overrides=[{"from": "2026-12-20T00:00", "to": "2026-12-22T00:00", "member": "dave"}]
    )
    got = [(h.at, h.member) for h in handoffs(s, local("2026-12-15T12:00"), 2)]
    assert got == [(local("2026-12-20T00:00"), "dave"), (local("2026-12-22T00:00"), "alice")]


def test_one_member_never_hands_off() -> None:
    assert handoffs(schedule(members=["alice"]), local("2026-12-15T12:00"), 3) == []


def test_a_duration_rotation_hands_off_every_twelve_hours_from_the_handoff() -> None:
    s = schedule(rotation="12h", handoff="09:00", members=["alice", "bob"])
    assert who(s, local("2026-11-30T09:00")) == "alice"
    assert who(s, local("2026-11-30T21:00")) == "bob"
    assert who(s, local("2026-12-01T09:00")) == "alice"


@pytest.mark.parametrize(
    ("zone", "day"),
    [
        pytest.param("Europe/Berlin", "2027-03-28", id="berlin-spring-forward"),
        pytest.param("Europe/Berlin", "2026-10-25", id="berlin-fall-back"),
        pytest.param("America/New_York", "2027-03-14", id="new-york-spring-forward"),
        pytest.param("America/New_York", "2026-11-01", id="new-york-fall-back"),
    ],
)
def test_a_daylight_saving_change_keeps_the_local_handoff_time(zone: str, day: str) -> None:
    s = schedule(timezone=zone, rotation="daily", handoff="09:00", start="2026-01-01")
    tz = ZoneInfo(zone)
    change = datetime.fromisoformat(day).replace(tzinfo=tz)
    found = handoffs(s, change - timedelta(days=2), 4)
    assert [h.at.astimezone(tz).strftime("%H:%M") for h in found] == ["09:00"] * 4
    # (in UTC: Python subtracts two times of one zone on the wall clock)
    gaps = {b.at.astimezone(UTC) - a.at for a, b in zip(found, found[1:], strict=False)}
    assert len(gaps) == 2  # the shift across the change is 23 or 25 hours, the others 24
    assert timedelta(hours=24) in gaps


@pytest.mark.parametrize(
    ("zone", "day", "handoff", "jump"),
    [
        pytest.param("Europe/Berlin", "2027-03-28", "02:30", "2027-03-28T01:00", id="berlin"),
        pytest.param("America/New_York", "2027-03-14", "02:59", "2027-03-14T07:00", id="new-york"),
        pytest.param("Australia/Lord_Howe", "2026-10-04", "02:15", "2026-10-03T15:30", id="lhi"),
    ],
)
def test_a_handoff_at_a_time_the_gap_skips_happens_when_the_clock_jumps(
    zone: str, day: str, handoff: str, jump: str
) -> None:
    s = schedule(timezone=zone, rotation="daily", handoff=handoff, start="2026-01-01",
                 members=["alice", "bob"])  # fmt: skip
    tz = ZoneInfo(zone)
    at = datetime.fromisoformat(f"{day}T00:00").replace(tzinfo=tz) - timedelta(hours=12)
    found = handoffs(s, at, 2)
    assert found[0].at.astimezone(UTC) == datetime.fromisoformat(jump).replace(tzinfo=UTC)
    # the first instant after the gap, not a gap's length after it; the next day as usual
    assert found[1].at.astimezone(tz).strftime("%H:%M") == handoff
    jumped = found[0].at.astimezone(UTC)
    assert who(s, jumped - timedelta(seconds=1)) != who(s, jumped) == found[0].member


def test_an_override_from_a_time_the_gap_skips_starts_when_the_clock_jumps() -> None:
    s = schedule(
        overrides=[{"from": "2027-03-28T02:30", "to": "2027-03-28T12:00", "member": "dave"}]
    )
    jump = datetime(2027, 3, 28, 1, 0, tzinfo=UTC)
    assert who(s, jump - timedelta(seconds=1)) != "dave"
    assert who(s, jump) == "dave"


def test_a_weekly_handoff_after_the_change_is_still_monday_nine_local() -> None:
    s = schedule(timezone="America/New_York", start="2026-10-26")
    found = handoffs(s, local("2026-10-28T12:00", NEW_YORK), 2)
    assert [h.at for h in found] == [
        local("2026-11-02T09:00", NEW_YORK),
        local("2026-11-09T09:00", NEW_YORK),
    ]
    assert found[0].at.astimezone(UTC) - local("2026-10-26T09:00", NEW_YORK) == timedelta(
        days=7, hours=1
    )


def test_a_timestamp_is_an_instant_too() -> None:
    s = schedule()
    at = local("2026-12-07T09:00")
    assert who(s, at.timestamp()) == who(s, at) == "bob"


# -- properties ---------------------------------------------------------------------------------

ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Europe/London",
    "Australia/Sydney",
    "Australia/Lord_Howe",  # a half-hour daylight-saving change
    "Asia/Kolkata",
    "America/Sao_Paulo",
    "UTC",
]
EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
instants = st.integers(0, 15 * 365 * 86400).map(lambda s: EPOCH + timedelta(seconds=s))


@st.composite
def schedules(draw: st.DrawFn, *, overrides: bool = False) -> Schedule:
    rotation = draw(st.sampled_from(["daily", "weekly", "12h", "8h", "36h", "1h", "3h"]))
    # 05:00-23:59: a handoff in the small hours may fall into a daylight-saving gap, where
    # that local time does not exist on the day of the change.
    hour, minute = draw(st.integers(5, 23)), draw(st.integers(0, 59))
    day = draw(st.sampled_from(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]))
    handoff = f"{day} {hour:02}:{minute:02}" if rotation == "weekly" else f"{hour:02}:{minute:02}"
    start = (EPOCH + timedelta(days=draw(st.integers(0, 15 * 365)))).date().isoformat()
    members = draw(st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=4))
    return schedule(
        timezone=draw(st.sampled_from(ZONES)),
        rotation=rotation,
        handoff=handoff,
        start=start,
        members=members,
    )


@settings(max_examples=200)
@given(schedules(), instants)
def test_exactly_one_member_is_on_call_and_it_is_the_shifts(s: Schedule, at: datetime) -> None:
    member = who(s, at)
    assert member in s.members
    found = handoffs(s, at, 1)
    if found:
        assert found[0].at > at
        assert who(s, found[0].at) == found[0].member != member


@settings(max_examples=200)
@given(schedules(), instants, st.floats(0, 1))
def test_the_member_changes_only_at_handoffs(s: Schedule, at: datetime, part: float) -> None:
    found = handoffs(s, at, 1)
    if not found:
        return
    # Anywhere between at and the next handoff, the same member is on call.
    between = at + (found[0].at - at) * part
    if between < found[0].at:
        assert who(s, between) == who(s, at)
    assert who(s, found[0].at - timedelta(microseconds=1)) == who(s, at)


@settings(max_examples=200)
@given(schedules(), st.integers(-2000, 2000))
def test_shift_k_belongs_to_member_k_and_starts_at_the_local_handoff_time(
    s: Schedule, k: int
) -> None:
    begins = shift_start(s, k)
    assert shift_start(s, k + 1) >= begins
    if shift_start(s, k + 1) > begins:  # an hourly shift in a spring-forward gap has no length
        assert who(s, begins) == s.members[k % len(s.members)]
    if s.rotation in ("daily", "weekly"):
        wall = begins.astimezone(s.zone).strftime("%a %H:%M")
        expected = s.handoff if s.rotation == "weekly" else f"{wall[:3]} {s.handoff}"
        assert wall == expected


@settings(max_examples=200)
@given(schedules(), instants, st.integers(1, 30 * 86400), instants)
def test_an_override_wins_inside_its_window_and_only_there(
    s: Schedule, begins: datetime, length: int, at: datetime
) -> None:
    def wall(t: datetime) -> str:
        return t.astimezone(s.zone).strftime("%Y-%m-%dT%H:%M")

    ends = begins + timedelta(seconds=length)
    raw = {
        "timezone": s.zone.key,
        "rotation": s.rotation,
        "handoff": s.handoff,
        "start": s.first.date().isoformat(),
        "members": list(s.members),
        "overrides": [{"from": wall(begins), "to": wall(ends), "member": "dave"}],
    }
    problems: list[str] = []
    found = check_schedules({"primary": raw}, NOTIFIERS, problems)
    if problems:  # a window under a minute, or inside a repeated hour: refused, not used
        assert "is not after from" in problems[0]
        return
    with_override = found["primary"]
    window = with_override.overrides[0]
    if window.start <= at < window.end:
        assert who(with_override, at) == "dave"
    else:
        assert who(with_override, at) == who(s, at)
