"""rules.yaml `maintenance:`: windows read and refused with clear messages (by the loader and
by `receiver check`), and their time arithmetic across DST in two zones: an instant is inside
a stretch the listing gives iff its local wall clock is inside a range (hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from receiver import rules
from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.rules.maintenance import Window, check_maintenance, holding, next_boundary

FILE = """
notifiers:
  team-chat: "json://127.0.0.1:9/chat"
rules:
  - name: r
    match: {{type: score.drop}}
    notify: team-chat
maintenance:
  - name: weekly-deploy
    match: {{cohort: beta}}
    timezone: {tz}
    every: [{every}]
    dates: ["2026-12-24..2026-12-26"]
    notify: [team-chat]
"""
ZONES = ("Europe/Berlin", "America/New_York")
# A range across midnight, one inside the hour the clock skips (02:30 in spring in both
# zones) or shows twice (02:00-03:00 in autumn in Berlin; New York's twice-shown hour,
# 01:00-02:00, is inside the Saturday night range), and one that ends at 24:00.
RANGES = '"Sat 22:00-Sun 02:00", "Sun 02:30-03:15", "Wed 12:00-12:30", "Fri 23:00-24:00"'
H, M = 3600, 60
WALL = [(5, 22 * H, 6, 2 * H), (6, 150 * M, 6, 195 * M), (2, 720 * M, 2, 750 * M)]
WALL += [(4, 23 * H, 4, 24 * H)]
# Ranges with seconds: short, one just before the Saturday night range, one an hour after
# the DST hour, one crossing midnight into Monday by seconds.
SECONDS = '"Sat 21:59:30-21:59:45", "Sun 03:40:20-03:41:05", "Sun 23:59:50-Mon 00:00:40"'
WALL_S = [(5, 22 * H - 30, 5, 22 * H - 15), (6, 3 * H + 40 * M + 20, 6, 3 * H + 41 * M + 5)]
WALL_S += [(6, 24 * H - 10, 0, 40)]
EVERY = {"minutes": (RANGES, WALL), "seconds": (f"{RANGES}, {SECONDS}", WALL + WALL_S)}


def _window(tz: str, kind: str = "minutes") -> Window:
    every = EVERY[kind][0]
    return rules.load_text(FILE.format(tz=tz, every=every), env={}).maintenance[0]


def _wall_inside(t: float, tz: str, kind: str = "minutes") -> bool:
    """The test's own reading of the wall clock: weekday and second against WALL."""
    local = datetime.fromtimestamp(t, ZoneInfo(tz))
    if (local.month, local.day) in ((12, 24), (12, 25), (12, 26)) and local.year == 2026:
        return True
    second = local.hour * H + local.minute * M + local.second
    for d1, m1, d2, m2 in EVERY[kind][1]:
        day = local.weekday()
        if d1 == d2 and day == d1 and m1 <= second < m2:
            return True
        if d1 != d2 and ((day == d1 and second >= m1) or (day == d2 and second < m2)):
            return True
    return False


# Instants around the 2026 DST changes of both zones (March 8/29, Oct 25/Nov 1) and Christmas.
_DAYS = [
    datetime(2026, m, d, tzinfo=UTC).timestamp()
    for m, d in ((3, 7), (3, 28), (10, 24), (10, 31), (12, 23))
]  # noqa: E501
instants = st.builds(
    lambda base, off: base + off, st.sampled_from(_DAYS), st.integers(0, 3 * 86400)
)
# Instants within two minutes of a range's local start or end, so the seconds ranges are hit.
_EDGES = [(d, s) for d1, s1, d2, s2 in WALL + WALL_S for d, s in ((d1, s1), (d2, s2))]


def _near_edge(tz: str, base: float, edge: int, off: int) -> float:
    """An instant about off seconds from a range edge's local time in the week from base
    (a DST change in between moves it by an hour: still an instant worth checking)."""
    weekday, second = _EDGES[edge]
    local = datetime.fromtimestamp(base, ZoneInfo(tz)).replace(hour=0, minute=0, second=0)
    shift = (weekday - local.weekday()) % 7
    return local.timestamp() + shift * 86400 + second + off


def _instant(draw: st.DrawFn, tz: str) -> float:
    if draw(st.booleans()):
        return float(draw(instants))
    edge = draw(st.integers(0, len(_EDGES) - 1))
    return _near_edge(tz, draw(st.sampled_from(_DAYS)), edge, draw(st.integers(-120, 120)))


@st.composite
def cases(draw: st.DrawFn) -> tuple[float, str, str]:
    tz = draw(st.sampled_from(ZONES))
    return _instant(draw, tz), tz, draw(st.sampled_from(sorted(EVERY)))


@settings(max_examples=400, deadline=None)
@given(case=cases())
def test_an_instant_is_inside_a_listed_stretch_iff_its_wall_clock_is(
    case: tuple[float, str, str],
) -> None:
    t, tz, kind = case
    window = _window(tz, kind)
    expected = _wall_inside(t, tz, kind)
    assert window.contains(t) == expected
    in_span = any(s <= t < e for s, e in window.spans(t - 86400, t + 86400))
    assert in_span == expected
    assert (window.around(t) is not None) == expected


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_stretches_are_ordered_and_each_boundary_changes_the_wall_clock(
    case: tuple[float, str, str],
) -> None:
    t, tz, kind = case
    window = _window(tz, kind)
    spans = window.upcoming(t, 5)
    assert len(spans) == 5 and spans == sorted(spans)
    for (s, e), nxt in zip(spans, [*spans[1:], None], strict=True):
        assert s < e and e > t
        assert _wall_inside(s, tz, kind) and not _wall_inside(s - 1, tz, kind)
        assert not _wall_inside(e, tz, kind) and _wall_inside(e - 1, tz, kind)
        if nxt is not None:
            assert e < nxt[0]
    assert next_boundary([window], t) == min(p for sp in spans for p in sp if p > t)


def test_dst_keeps_local_times_and_a_skipped_start_begins_at_the_jump() -> None:
    berlin = _window("Europe/Berlin")
    at = datetime(2026, 3, 28, tzinfo=UTC).timestamp()
    utc = [
        (datetime.fromtimestamp(s, UTC), datetime.fromtimestamp(e, UTC))
        for s, e in berlin.upcoming(at, 2)
    ]  # noqa: E501
    # Sat 22:00 CET (21:00Z) until the clock jumps 02:00 -> 03:00 CEST and 02:30-03:15 follows:
    # one stretch to 03:15 CEST (01:15Z).
    assert utc[0] == (
        datetime(2026, 3, 28, 21, 0, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 15, tzinfo=UTC),
    )  # noqa: E501
    later = datetime(2026, 4, 4, tzinfo=UTC).timestamp()
    first = berlin.upcoming(later, 1)[0]  # summer: 22:00 CEST is 20:00Z
    assert datetime.fromtimestamp(first[0], UTC) == datetime(2026, 4, 4, 20, 0, tzinfo=UTC)


def test_the_shown_twice_hour_is_inside_both_times() -> None:
    ny = _window("America/New_York")
    at = datetime(2026, 10, 31, 12, tzinfo=UTC).timestamp()
    spans = [
        (
            datetime.fromtimestamp(s, UTC).strftime("%dT%H:%M"),
            datetime.fromtimestamp(e, UTC).strftime("%dT%H:%M"),
        )
        for s, e in ny.upcoming(at, 3)
    ]  # noqa: E501
    # Sat 22:00 EDT to Sun 02:00 ... the clock shows 01:00-02:00 twice (EDT, then EST):
    # 02:00 EST is 07:00Z; then 02:30-03:15 EST once.
    assert spans[:2] == [("01T02:00", "01T07:00"), ("01T07:30", "01T08:15")]


def test_holding_matches_the_payload_and_the_time() -> None:
    window = _window("Europe/Berlin")
    inside = datetime(2026, 12, 25, 12, tzinfo=UTC).timestamp()
    outside = datetime(2026, 12, 22, 12, tzinfo=UTC).timestamp()
    assert holding([window], {"cohort": "beta"}, inside) is window
    assert holding([window], {"cohort": "ga"}, inside) is None
    assert holding([window], {"cohort": "beta"}, outside) is None


BAD = [
    ("timezone: Mars/Base", 'timezone "Mars/Base" is not a known IANA zone'),
    ('every: ["Wed 12:30-12:00"]', '"Wed 12:30-12:00" is reversed: it ends before it starts'),
    ('every: ["Wed 10:00-10:00"]', '"Wed 10:00-10:00" is empty'),
    ('every: ["Fun 10:00-11:00"]', 'unknown day "fun"'),
    ('every: ["Mon 25:00-Tue 01:00"]', "times are HH:MM from 00:00 to 24:00"),
    ('every: ["Mon 10:00:60-11:00"]', "times are HH:MM from 00:00 to 24:00 (seconds optional"),
    ('every: ["Mon 10:00-Tue 24:00:01"]', "times are HH:MM from 00:00 to 24:00"),
    ('every: ["Mon 24:00:00-Tue 01:00"]', "times are HH:MM from 00:00 to 24:00"),
    ('every: ["Mon 10:00:5-11:00"]', 'is not a range such as "Sat 22:00-Sun 02:00"'),
    ('every: ["Wed 12:00:30-12:00:10"]', '"Wed 12:00:30-12:00:10" is reversed'),
    ('every: ["Wed 12:00:00-12:00"]', '"Wed 12:00:00-12:00" is empty'),
    ('every: ["soon"]', 'is not a range such as "Sat 22:00-Sun 02:00"'),
    ('dates: ["2026-12-26..2026-12-24"]', '"2026-12-26..2026-12-24" is reversed'),
    ('dates: ["2026-13-01"]', "is not a day or days"),
    ("notify: [pager]", 'undefined notifier "pager" in notify; defined: team-chat'),
    ("match: {cohort: {regex: '('}}", "match.cohort"),
    ("colour: red", 'unknown key "colour"'),
]


@pytest.mark.parametrize(("line", "message"), BAD)
def test_check_refuses_with_the_window_named(tmp_path: Path, line: str, message: str) -> None:
    every = "" if line.startswith("every") else '    every: ["Sat 22:00-Sun 02:00"]\n'
    text = (
        "notifiers:\n  team-chat: json://127.0.0.1:9/chat\nmaintenance:\n"
        f"  - name: w\n{every}    {line}\n"
    )
    with pytest.raises(ConfigError) as err:
        rules.load_text(text, env={})
    assert any(p.startswith('maintenance "w": ') and message in p for p in err.value.problems)
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code != 0 and message in result.output


def test_overlapping_windows_and_ranges_are_allowed() -> None:
    problems: list[str] = []
    found = check_maintenance(
        [
            {"name": "a", "every": ["Sat 22:00-Sun 02:00", "Sun 01:00-03:00"]},
            {"name": "b", "every": "Sun 00:00-Sun 24:00", "timezone": "UTC"},
        ],
        [],
        problems,
    )
    assert problems == [] and [w.name for w in found] == ["a", "b"]
    problems = []
    check_maintenance(
        [{"name": "a", "every": "Mon 00:00-01:00"}, {"name": "a", "dates": "2026-01-01"}],
        [],
        problems,
    )  # noqa: E501
    assert problems == ['maintenance "a": the name is used by another window; names must differ']


def test_explain_now_says_the_window_and_its_end() -> None:
    from receiver.dispatch.explain import explain_now

    text = FILE.format(tz="Europe/Berlin", every=RANGES)
    ruleset = rules.load_text(text, env={})
    inside = datetime(2026, 11, 28, 22, 30, tzinfo=UTC).timestamp()  # Sat 23:30 CET
    payload = {"type": "score.drop", "sessionId": "s1", "cohort": "beta"}
    lines = explain_now(ruleset, payload, inside)
    assert "maintenance: weekly-deploy (until 2026-11-29 02:00 CET)" in lines
    assert not any(
        "maintenance" in line for line in explain_now(ruleset, payload, inside - 2 * 86400)
    )
    other = explain_now(ruleset, {**payload, "cohort": "ga"}, inside)
    assert not any("maintenance" in line for line in other)


def test_listing_and_reason_show_seconds_only_when_a_range_has_them() -> None:
    from receiver.rules.maintenance import describe, held_reason

    window = _window("Europe/Berlin", "seconds")
    at = datetime(2026, 11, 28, 20, 59, tzinfo=UTC).timestamp()  # Sat 21:59 CET
    short, whole = window.upcoming(at, 2)
    assert describe(window, *short) == {
        "name": "weekly-deploy",
        "start": "Sat 2026-11-28 21:59:30 CET",
        "end": "Sat 2026-11-28 21:59:45 CET",
        "start_utc": "2026-11-28T20:59:30Z",
        "end_utc": "2026-11-28T20:59:45Z",
    }
    assert describe(window, *whole)["start"] == "Sat 2026-11-28 22:00 CET"
    assert held_reason(window, short[0] + 5) == (
        "maintenance: weekly-deploy (until 2026-11-28 21:59:45 CET)"
    )
