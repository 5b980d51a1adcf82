"""event_time(): the order key of an event's timestamp, with a fast path for UTC Z times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from receiver.dispatch.alerts import event_time
from receiver.events import iso, utc_z


def parsed(text: str) -> str:
    """The slow path: parse, to UTC, format."""
    ts = datetime.fromisoformat(text)
    ts = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@given(
    moment=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    digits=st.integers(0, 6),
    offset=st.sampled_from([None, "Z", "+00:00", "+05:30", "-08:00"]),
)
@settings(max_examples=500)
def test_every_written_form_gives_the_parsed_order_key(
    moment: datetime, digits: int, offset: str | None
) -> None:
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.year < 1000:
        text = f"{moment.year:04d}{text[text.index('-') :]}"
    if digits:
        text += "." + f"{moment.microsecond:06d}"[:digits]
    text += offset or ""
    assert event_time({"timestamp": text}) == parsed(text)


def test_the_service_s_milliseconds_are_padded() -> None:
    assert event_time({"timestamp": "2026-11-24T10:00:00.123Z"}) == "2026-11-24T10:00:00.123000Z"
    assert event_time({"timestamp": "2026-11-24T10:00:00Z"}) == "2026-11-24T10:00:00.000000Z"
    later = datetime(2026, 11, 24, 12, tzinfo=timezone(timedelta(hours=2)))
    assert event_time({"timestamp": later.isoformat()}) == "2026-11-24T10:00:00.000000Z"


@given(
    year=st.integers(1, 9999),
    month=st.integers(0, 13),
    day=st.integers(0, 32),
    clock=st.tuples(st.integers(0, 24), st.integers(0, 60), st.integers(0, 60)),
    fraction=st.sampled_from(["", ".1", ".12", ".123", ".123456", ".1234567", "."]),
    zone=st.sampled_from(["Z", "", "+00:00", "-03:00", "z"]),
)
@settings(max_examples=1000)
def test_utc_z_is_the_parser_or_steps_aside(
    year: int, month: int, day: int, clock: tuple[int, int, int], fraction: str, zone: str
) -> None:
    """For any text, even impossible dates (February 30, hour 24, second 60): utc_z() says
    what parsing it says, or None and leaves it to the parser."""
    hour, minute, second = clock
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}{fraction}{zone}"
    fast = utc_z(text)
    try:
        slow: str | None = iso(datetime.fromisoformat(text))
    except ValueError:
        slow = None
    assert fast is None or fast == slow, (text, fast, slow)
    service_form = zone == "Z" and fraction not in (".", ".1234567")
    if service_form and slow is not None and year >= 1000 and day <= 28:
        assert fast == slow  # the service's own form takes the fast path
