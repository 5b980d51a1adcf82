import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from receiver import events
from receiver.errors import InvalidEventError, InvalidJSONError
from receiver.events import iso
from tests.samples import sample

DROP = sample(score=22)


def body(**changes: Any) -> bytes:
    event = {**DROP, **changes}
    return json.dumps({k: v for k, v in event.items() if v is not ...}).encode()


@pytest.mark.parametrize("kind", events.EVENT_TYPES)
def test_each_event_type_parses(kind: str) -> None:
    event = events.parse(body(type=kind))
    assert event.type == kind and event.id == "evt_1"


def test_unknown_fields_are_kept() -> None:
    event = events.parse(body(context="checkout", meta={"page": "/pay"}))
    assert event.payload()["context"] == "checkout"
    assert event.payload()["meta"] == {"page": "/pay"}


def test_other_types_need_only_id_type_timestamp_session() -> None:
    event = events.parse(
        json.dumps(
            {
                "id": "e",
                "type": "session.stopped",
                "sessionId": "s",
                "timestamp": "2026-11-21T10:00:00Z",
            }
        ).encode()
    )
    assert event.userId is None and event.score is None


INVALID_EVENTS = [
    pytest.param(body(id=...), "id: field required", id="missing-id"),
    pytest.param(body(type=...), "field required|type", id="missing-type"),
    pytest.param(body(timestamp=...), "timestamp: field required", id="missing-timestamp"),
    pytest.param(
        body(type="score.spike"), 'type: must be one of .*got "score.spike"', id="unknown-type"
    ),
    pytest.param(body(type=7), "type: must be one of .*got 7", id="type-not-string"),
    pytest.param(body(id=12), "id: input should be a valid string", id="id-not-string"),
    pytest.param(body(id=""), "id: string should have at least 1 character", id="id-empty"),
    pytest.param(body(score="low"), "score", id="score-not-number"),
    pytest.param(body(score=True), "score", id="score-bool"),
    pytest.param(
        body(timestamp="yesterday"),
        'timestamp: must be an ISO 8601 date and time, such as .*; got "yesterday"',
        id="bad-timestamp",
    ),
    pytest.param(
        body(timestamp="2026-11-21T25:00:00Z"),
        "timestamp: input should be a valid datetime",
        id="bad-hour",
    ),
    *[
        pytest.param(
            body(timestamp=stamp),
            f"timestamp: must be an ISO 8601 date and time{how}",
            id=f"timestamp-{name}",
        )
        for name, stamp, how in [
            ("epoch-seconds", 1795700000, " as a string, .*; got a JSON number"),
            ("epoch-float", 1795700000.5, " as a string, .*; got a JSON number"),
            ("epoch-string", "1795700000", ', such as .*; got "1795700000"'),
            ("date-alone", "2026-11-21", ', such as .*; got "2026-11-21"'),
            ("boolean", True, " as a string, .*; got a JSON boolean"),
            ("object", {"s": 1}, " as a string, .*; got a JSON object"),
        ]
    ],
    pytest.param(body(sessionId=...), "sessionId: field required", id="missing-session"),
    pytest.param(body(threshold=...), "threshold: field required", id="drop-without-threshold"),
]


@pytest.mark.parametrize(("raw", "message"), INVALID_EVENTS)
def test_invalid_event_names_the_field(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidEventError, match=message):
        events.parse(raw)


INVALID_JSON = [
    pytest.param(b"", "not valid JSON", id="empty"),
    pytest.param(b"{", "not valid JSON", id="truncated"),
    pytest.param(b"[1, 2]", "must be a JSON object, got a JSON array", id="array"),
    pytest.param(b'"text"', "got a JSON string", id="string"),
    pytest.param(b"null", "got a JSON null", id="null"),
    pytest.param(b'{"a": NaN}', "NaN is not valid JSON", id="nan"),
    pytest.param(b'{"a": Infinity}', "Infinity is not valid JSON", id="infinity"),
    pytest.param(b'{"a": 1e400}', "out of range", id="huge-float"),
    pytest.param(b'{"a": ' + b"9" * 5000 + b"}", "not acceptable JSON", id="huge-int"),
    pytest.param(b'{"a": "\xff"}', "not UTF-8", id="invalid-utf8"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "not acceptable JSON", id="deep-nesting"),
]


@pytest.mark.parametrize(("raw", "message"), INVALID_JSON)
def test_invalid_json_says_why(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidJSONError, match=message):
        events.parse(raw)


def test_duplicate_keys_take_the_last_value() -> None:
    event = events.parse(
        b'{"id": "a", "id": "b", "type": "session.stopped",'
        b' "sessionId": "s", "timestamp": "2026-11-21T10:00:00Z"}'
    )
    assert event.id == "b"


def test_sample_builds_a_valid_event_of_each_type() -> None:
    for kind in events.EVENT_TYPES:
        assert events.validate(events.sample(kind)).type == kind


@pytest.mark.parametrize("stamp", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"])
def test_a_timestamp_out_of_range_in_utc_is_an_invalid_event(stamp: str) -> None:
    # Not a 500 later, when the timestamp is compared with the clock or stored in UTC.
    with pytest.raises(InvalidEventError, match="timestamp: .* is out of range in UTC"):
        events.parse(body(timestamp=stamp))


@pytest.mark.parametrize("field", ["id", "sessionId", "userId"])
def test_a_nul_in_an_id_is_an_invalid_event_not_a_storage_error(field: str) -> None:
    # PostgreSQL's text cannot hold a NUL: refused here (422), not a 503 retried for hours.
    body = json.dumps(events.sample("score.drop", **{field: "a\x00b"})).encode()
    with pytest.raises(InvalidEventError, match=f"{field}: must not contain a NUL"):
        events.parse(body)


def test_iso_pads_the_year_so_text_order_stays_time_order() -> None:
    early = iso(datetime(497, 10, 30, 3, 10, tzinfo=timezone(timedelta(hours=-9, minutes=-10))))
    assert early == "0497-10-30T12:20:00.000000Z"
    assert early < iso(datetime(2026, 1, 1, tzinfo=UTC)) < iso(datetime(9999, 1, 1, tzinfo=UTC))
    assert iso(datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC), digits=3) == (
        "2026-05-01T12:00:00.123Z"
    )


# -- the fast JSON decoder (msgspec) reads what it accepts as the standard library does ------

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 is not 1.0, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


def _both(body: bytes) -> tuple[Any, Any]:
    """(loads(body), the standard library's reading of it): a value or the error message."""
    results = []
    for parse in (events.loads, events._loads):
        try:
            results.append(parse(body))
        except InvalidJSONError as exc:
            results.append(f"error: {exc.message}")
    return results[0], results[1]


@given(st.dictionaries(st.text(), _json_values, max_size=6), st.booleans())
def test_loads_reads_documents_as_the_standard_library(doc: dict[str, Any], ascii: bool) -> None:
    body = json.dumps(doc, ensure_ascii=ascii).encode("utf-8", "surrogatepass")
    fast, slow = _both(body)
    assert _same(fast, slow)


@given(st.binary(max_size=60), st.integers(min_value=0, max_value=40))
def test_loads_agrees_on_damaged_bodies(noise: bytes, at: int) -> None:
    """Bytes spliced into a valid body: both accept with the same value, or both refuse
    with the same message."""
    body = b'{"id": "evt_1", "score": 1.5, "tags": ["a", null, true]}'
    damaged = body[:at] + noise + body[at:]
    fast, slow = _both(damaged)
    assert _same(fast, slow)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1e400}',
        b'{"a": NaN}',
        b'{"a": "\\ud800"}',
        b'{"a": "\\ud83d\\ude00"}',
        b'\xef\xbb\xbf{"a": 1}',
        b'{"a": 123456789012345678901234567890}',
        b'{"a": "\xed\xa0\x80"}',
        b'{"a": "\x01"}',
        b"[1]",
        b'"text"',
        b"[" * 3000 + b"]" * 3000,
        json.dumps({"a": 1}).encode("utf-16"),
    ],
)
def test_loads_answers_as_before_where_the_fast_decoder_refuses(raw: bytes) -> None:
    fast, slow = _both(raw)
    assert _same(fast, slow)


@given(st.dictionaries(st.text(), _json_values, max_size=6))
def test_load_stored_reads_a_stored_body_as_json_loads(doc: dict[str, Any]) -> None:
    text = json.dumps(doc)
    assert _same(events.load_stored(text), json.loads(text))


@pytest.mark.e2e
def test_a_numeric_timestamp_is_422_invalid_event_over_http(tmp_path: Path) -> None:
    """README says ISO 8601: an epoch number is refused, not read as seconds."""
    from tests.harness import Receiver, signed

    server = Receiver(tmp_path).start()
    try:
        for stamp in (1795700000, "1795700000"):
            raw = body(id=f"evt_n{stamp!r}", timestamp=stamp)
            response = server.post(raw, signed(raw))
            assert response.status_code == 422
            error = response.json()["error"]
            assert error["code"] == "invalid_event"
            assert error["message"].startswith("timestamp: must be an ISO 8601 date and time")
        good = body(id="evt_iso", timestamp=events.iso(datetime.now(UTC)))
        assert server.post(good, signed(good)).status_code == 202
    finally:
        server.stop()
