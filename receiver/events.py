"""Models of the five event types the service delivers, and parsing of a signed body into one.

Fields the service adds later are kept (``extra="allow"``), and the raw body is
stored beside the parsed columns, so nothing the sender said is dropped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    TypeAdapter,
)
from pydantic import ValidationError as _ValidationError

from receiver.errors import InvalidEventError, InvalidJSONError

EVENT_TYPES = (
    "score.drop",
    "score.recover",
    "session.stopped",
    "intervention.fired",
    "intervention.resolved",
)

# No NUL: PostgreSQL's text cannot hold one (a 422 here, not a 503 the sender retries).
Id = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00]+$")]
Number = StrictInt | StrictFloat
# ISO 8601 text with a date and a time, as the service writes timestamps. pydantic would
# also read a number or a numeric string as epoch seconds, and a date alone as midnight.
_DATE_AND_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _iso_text(value: Any) -> Any:
    """Refuse a timestamp that is not ISO 8601 text with a date and a time."""
    if isinstance(value, datetime):  # built in Python, not parsed from a body
        return value
    example = "such as 2026-11-21T10:00:00Z"
    if not isinstance(value, str):
        raise ValueError(
            f"must be an ISO 8601 date and time as a string, {example};"
            f" got a JSON {_json_kind(value)}"
        )
    if not _DATE_AND_TIME.match(value):
        raise ValueError(f"must be an ISO 8601 date and time, {example}; got {_short(value)}")
    return value


Timestamp = Annotated[datetime, BeforeValidator(_iso_text)]


class BaseEvent(BaseModel):
    """The fields every event type has; each type below adds its own. `Event` is their
    union, the type a parsed body has."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: Id
    type: str
    timestamp: Timestamp
    sessionId: Id
    userId: Id | None = None
    score: Number | None = None
    threshold: Number | None = None

    def payload(self) -> dict[str, Any]:
        """The event as the sender wrote it (extra fields included), JSON-ready."""
        return self.model_dump(mode="json", exclude_none=True)


class ScoreDrop(BaseEvent):
    type: Literal["score.drop"]
    userId: Id
    score: Number
    threshold: Number


class ScoreRecover(BaseEvent):
    type: Literal["score.recover"]
    userId: Id
    score: Number
    threshold: Number


class SessionStopped(BaseEvent):
    type: Literal["session.stopped"]


class InterventionFired(BaseEvent):
    type: Literal["intervention.fired"]


class InterventionResolved(BaseEvent):
    type: Literal["intervention.resolved"]


Event = Annotated[
    ScoreDrop | ScoreRecover | SessionStopped | InterventionFired | InterventionResolved,
    Field(discriminator="type"),
]
_adapter: TypeAdapter[Event] = TypeAdapter(Event)


# A \u escape in the surrogate range: legal JSON, but alone it is not text and cannot be stored.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _checked_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:20]}... is out of range")
    return value


# What json.loads(body, parse_constant=..., parse_float=...) does, without building a new
# decoder and scanner for every request.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_checked_float)


# msgspec's JSON decoder: about an eighth of json.loads' time on an event. It is stricter
# (UTF-8 only, no lone surrogates, integers within 64 bits, no NaN or Infinity), and what
# it accepts it reads as json.loads does (tests/test_events.py checks that on generated
# documents); whatever it refuses goes through the standard library, for the same
# answer and the same error as ever.
_FAST = msgspec.json.Decoder()


def load_stored(body: str | bytes) -> Any:
    """json.loads() of a stored body (one that was accepted), faster."""
    try:
        return _FAST.decode(body)
    except (ValueError, RecursionError):  # msgspec.DecodeError is a ValueError
        return json.loads(body)


def loads(body: bytes) -> dict[str, Any]:
    """Parse a body as one JSON object, or raise InvalidJSONError saying why.

    Stricter than ``json.loads``: NaN and Infinity are refused, so is a number
    too large for a float.
    """
    try:
        data = _FAST.decode(body)
    except (ValueError, RecursionError):  # msgspec.DecodeError is a ValueError
        return _loads(body)  # the same answer, or the error saying what is wrong
    if not isinstance(data, dict) or _SURROGATE_ESCAPE.search(body):
        return _loads(body)
    return data


def _loads(body: bytes) -> dict[str, Any]:
    """loads() through the standard library: its errors, in our words."""
    try:
        data = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except UnicodeDecodeError as exc:
        raise InvalidJSONError(f"body is not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidJSONError(
            f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except (ValueError, RecursionError) as exc:
        raise InvalidJSONError(f"body is not acceptable JSON: {_reason(exc)}") from exc
    if not isinstance(data, dict):
        raise InvalidJSONError(f"body must be a JSON object, got a JSON {_json_kind(data)}")
    if _SURROGATE_ESCAPE.search(body):  # rare, so only then the full check (pairs are fine)
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidJSONError(
                "body is not acceptable JSON: a \\u escape encodes a lone surrogate"
            ) from exc
    return data


def validate(data: dict[str, Any]) -> BaseEvent:
    """Turn a parsed JSON object into an event, or raise InvalidEventError naming the field."""
    kind = data.get("type")
    if "type" not in data:  # pydantic would say "unable to extract tag using discriminator"
        raise InvalidEventError(f"type: field required; one of {', '.join(EVENT_TYPES)}")
    if not (isinstance(kind, str) and kind in EVENT_TYPES):
        raise InvalidEventError(
            f"type: must be one of {', '.join(EVENT_TYPES)}; got {_short(kind)}"
        )
    try:
        event = _adapter.validate_python(data)
    except _ValidationError as exc:
        raise InvalidEventError(_describe(exc)) from None
    except RecursionError:
        raise InvalidEventError("event is nested too deeply") from None
    if event.timestamp.year in (1, 9999):  # at datetime's ends, the zone can push UTC past them
        try:
            to_utc(event.timestamp)
        except OverflowError:
            raise InvalidEventError(
                f"timestamp: {event.timestamp.isoformat()} is out of range in UTC"
            ) from None
    return event


def parse(body: bytes) -> BaseEvent:
    """loads() then validate(): the whole path from signed bytes to an event."""
    return validate(loads(body))


# The service retries a failed delivery after these delays (API part 6): five retries over
# 10h36m, then it gives up on the delivery.
SENDER_RETRIES = (60.0, 300.0, 1800.0, 7200.0, 28800.0)


def to_utc(ts: datetime) -> datetime:
    """An event timestamp in UTC; a timestamp without a zone is taken as UTC."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def iso(ts: datetime, *, digits: int = 6) -> str:
    """A timestamp as ISO 8601 UTC with `digits` of the second's fraction and a Z: text
    order is time order. The service writes milliseconds (digits=3); the store keeps
    microseconds.

    >>> iso(datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC), digits=3)
    '2026-05-01T12:00:00.123Z'
    """
    u = to_utc(ts)
    # Not strftime: its %Y writes year 497 as "497", which sorts after "2026".
    text = (
        f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}"
        f".{u.microsecond:06d}"
    )
    return text[: len(text) - 6 + digits] + "Z"


# A timestamp already in UTC with a Z, as the service writes them, and a plainly valid one
# (days 29 to 31 are left to the parser, which knows the months): utc_z() pads its fraction
# instead of parsing it, on each event's way through ingest and routing (docs/performance.md).
_UTC_Z = re.compile(
    r"([1-9]\d{3}-(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])"
    r"T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d)(?:\.(\d{1,6}))?Z"
)


def utc_z(text: str) -> str | None:
    """iso(datetime.fromisoformat(text)) for a UTC Z timestamp of years 1000 to 9999,
    without parsing it; None for any other text (parse that).

    >>> utc_z("2026-11-24T10:00:00.12Z"), utc_z("2026-02-30T10:00:00Z")
    ('2026-11-24T10:00:00.120000Z', None)
    """
    if (utc := _UTC_Z.fullmatch(text)) is None:
        return None
    return f"{utc[1]}.{(utc[2] or '').ljust(6, '0')}Z"


def iso_epoch(ts: float, *, digits: int = 3) -> str:
    """Epoch seconds as iso() text: what the API shows of the store's times.

    >>> iso_epoch(0)
    '1970-01-01T00:00:00.000Z'
    """
    return iso(datetime.fromtimestamp(ts, UTC), digits=digits)


def date_or_why(ts: float, render: Callable[[float], str]) -> str:
    """render(ts), or what ts is if no date can show it (past the year 9999, before 1970
    where the platform refuses): a stored row written by hand, or before a duration cap,
    must not fail the page, command or explanation that shows it.

    >>> date_or_why(1e20, iso_epoch), date_or_why(-1e20, iso_epoch)
    ('after 9999', 'not a date')
    """
    try:
        return render(ts)
    except (OverflowError, OSError, ValueError):
        return "after 9999" if ts > 0 else "not a date"


def _describe(exc: _ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        loc = [str(p) for p in err["loc"]]
        # The discriminated union puts the tag first in the location; the field is what matters.
        if loc and loc[0] in EVENT_TYPES:
            loc = loc[1:]
        field = ".".join(loc) or "event"
        message = err["msg"].lower()
        if err["type"] == "value_error":  # ours, already in our words (and case)
            message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "string_pattern_mismatch":
            message = "must not contain a NUL character (\\u0000)"
        parts.append(f"{field}: {message}")
    return "; ".join(parts)


_TOO_MANY_DIGITS = re.compile(r"limit \((\d+) digits\).*value has (\d+) digits")


def _reason(exc: BaseException) -> str:
    """Why a body's JSON was refused, in our words: Python's message about its integer
    digit limit names sys.set_int_max_str_digits(), which means nothing to a sender."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc)
    found = _TOO_MANY_DIGITS.search(text)
    if found:
        return f"a number has {found.group(2)} digits; at most {found.group(1)} are allowed"
    return text[:200]


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else f'"{value}"'
    return text if len(text) <= 60 else text[:57] + "..."


def _json_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def sample(kind: str = "score.drop", **fields: Any) -> dict[str, Any]:
    """A plausible event of kind, for `receiver send` / `explain` and tests; fields override.

    >>> sample("score.drop", id="evt_1")["id"]
    'evt_1'
    """
    import uuid

    event: dict[str, Any] = {
        "id": f"evt_{uuid.uuid4().hex[:16]}",
        "type": kind,
        "sessionId": "sess_demo",
        "userId": "user_42",
        "timestamp": iso(datetime.now(UTC), digits=3),
    }
    if kind.startswith("score."):
        event["score"] = 22 if kind == "score.drop" else 61
        event["threshold"] = 40
    event.update({k: v for k, v in fields.items() if v is not None})
    return event
