"""POST /v1/events: size -> signature -> JSON -> event -> store.accept, and its error contract.

A lean ASGI endpoint rather than a Starlette Request/Response pair: this is the
hot path, and the framework objects cost more per request than HMAC and JSON
together. The contract (codes, statuses, shapes) is the README's table.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from receiver import events, signature, tracing
from receiver.durations import format_age
from receiver.errors import (
    ClientDisconnected,
    EventFromFutureError,
    EventTooOldError,
    InvalidSignatureError,
    MethodNotAllowedError,
    PayloadTooLargeError,
    RequestError,
    StorageUnavailableError,
)
from receiver.logs import LogLimiter
from receiver.metrics import Metrics
from receiver.store import Store

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("receiver.ingest")

_SIGNATURE = signature.SIGNATURE_HEADER.lower().encode("latin-1")
_JSON_HEADERS = [(b"content-type", b"application/json")]


class IngestEndpoint:
    """The ASGI app mounted at POST /v1/events."""

    def __init__(
        self,
        *,
        store: Store,
        secrets: Sequence[bytes],
        max_body: int,
        metrics: Metrics,
        max_event_age: float = 0.0,
        max_clock_skew: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.clock = clock  # the time the age and skew limits are measured against
        self.secrets = list(secrets)
        self.max_body = max_body
        self.metrics = metrics
        self.max_event_age = max_event_age  # seconds; 0 = no limit
        self.max_clock_skew = max_clock_skew  # seconds; 0 = no limit
        # Rejections and conflicts are what a sender can make us log at will: a few lines a
        # minute per reason and client, then a summary (the metrics count every one).
        self.limited_log = LogLimiter(log)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        if tracing.on:
            span = tracing.start_ingest(scope)
            with tracing.current(span):
                answer = await self._respond(scope, receive, span)
            tracing.end(
                span,
                {tracing.STATUS: answer[0] if answer else 499},
                error=None if answer is None or answer[0] < 500 else str(answer[0]),
            )
        else:
            answer = await self._respond(scope, receive, None)
        if answer is None:
            return  # nobody to answer (a body timeout already was)
        status, payload = answer
        body = _answer(payload)
        headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.metrics.ingest_seconds.observe(time.perf_counter() - started)

    async def _respond(
        self, scope: Scope, receive: Receive, span: Span | None
    ) -> tuple[int, dict[str, Any]] | None:
        """The answer to one request: its status and body; None if the client went away.
        span: the request's trace span (receiver.tracing), None while tracing is off."""
        try:
            if span is None or not span.is_recording():  # off, or a trace not sampled
                event, body = await self._verified(scope, receive)
                return await self._keep(scope, event, body, tracing.carrier(span))
            with tracing.step(span, tracing.VERIFY):
                event, body = await self._verified(scope, receive)
            span.set_attributes(
                {tracing.EVENT_ID: event.id, tracing.EVENT_TYPE: event.type}
                | ({tracing.SESSION_ID: event.sessionId} if event.sessionId else {})
            )
            with tracing.step(span, tracing.STORE):
                answer = await self._keep(scope, event, body, tracing.carrier(span))
            span.set_attribute(tracing.RESULT, answer[1]["status"])
            return answer
        except ClientDisconnected:
            return None
        except RequestError as exc:
            event_id = exc.event_id
            self.metrics.rejected[exc.code].inc()
            client = scope.get("client")
            source = client[0] if client else "-"
            self.limited_log.warning(
                f"{exc.code} rejections",
                source,
                "rejected %s from %s%s: %s",
                exc.code,
                source,
                "" if event_id is None else f" (event {event_id})",
                exc.message,
                extra={"code": exc.code, "event_id": event_id},
            )
            if span is not None:
                span.set_attribute(tracing.RESULT, exc.code)
                if event_id is not None:
                    span.set_attribute(tracing.EVENT_ID, event_id)
            return exc.status, exc.to_dict()

    async def _verified(self, scope: Scope, receive: Receive) -> tuple[events.BaseEvent, bytes]:
        """The request's event and raw body once its size, signature, JSON, model and
        timestamp pass; else the RequestError that says why (a signed body that is no
        event is quarantined first)."""
        if scope["method"] != "POST":
            raise MethodNotAllowedError(f"{scope['method']} is not allowed here; use POST")
        header: str | None = None
        signatures = 0
        length: int | None = None
        for name, value in scope["headers"]:
            if name == _SIGNATURE:
                signatures += 1
                header = value.decode("latin-1")
            elif name == b"content-length":
                length = int(value) if value.isdigit() else None
        if length is not None and length > self.max_body:
            raise PayloadTooLargeError(
                f"body of {length} bytes exceeds the limit of {self.max_body} bytes"
            )
        # A body trickled too slowly is cut off by the protocol (receiver.edge.http), which answers
        # 408 body_timeout and closes the connection: the read below then ends as a disconnect.
        body = await self._read_body(receive)
        if signatures > 1:
            raise InvalidSignatureError(
                f"{signature.SIGNATURE_HEADER} must appear once, got {signatures} headers"
            )
        signature.verify(self.secrets, body, header)
        try:
            event = events.parse(body)
        except RequestError as exc:
            # Signed but unusable: keep the bytes so nothing the sender signed is lost.
            client = scope.get("client")
            event_id = _guess_id(body)
            exc.event_id = event_id
            await self._quarantine(body, exc, client[0] if client else None, event_id)
            raise
        if self.max_event_age or self.max_clock_skew:
            self._check_timestamp(event)
        return event, body

    async def _keep(
        self, scope: Scope, event: events.BaseEvent, body: bytes, trace: str | None
    ) -> tuple[int, dict[str, Any]]:
        """Store a verified event (with its trace context): 202 accepted, 200 duplicate."""
        try:
            result = await self.store.events.accept(event, body, trace)
        except StorageUnavailableError as exc:
            exc.event_id = event.id
            raise
        if result == "new":
            self.metrics.accepted.inc()
            log.debug("accepted %s %s", event.type, event.id)
            return 202, {"id": event.id, "status": "accepted"}
        if result == "conflict":
            # Same id, other bytes: a sender bug or a forged id. The first body stays; the
            # answer is the duplicate's, so a sender's retry loop ends as it would anyway.
            self.metrics.conflict.inc()
            client = scope.get("client")
            source = client[0] if client else "-"
            self.limited_log.warning(
                "conflicting duplicates",
                source,
                "conflict: event %s from %s repeats a stored id with a different body;"
                " answered 200 duplicate, the stored body is kept",
                event.id,
                source,
                extra={"code": "conflict", "event_id": event.id},
            )
        else:
            self.metrics.duplicate.inc()
            log.debug("duplicate %s %s", event.type, event.id)
        return 200, {"id": event.id, "status": "duplicate"}

    def _check_timestamp(self, event: events.BaseEvent) -> None:
        """Raise EventTooOldError or EventFromFutureError if the event's timestamp is out of
        the window the settings allow around this receiver's clock (a limit of 0 is off)."""
        age = self.clock() - events.to_utc(event.timestamp).timestamp()
        if self.max_event_age and age > self.max_event_age:
            # Not quarantined: it is a replay (the service stops retrying after about 11 hours),
            # and keeping each copy would let a captured request fill the disk.
            too_old = EventTooOldError(
                f"timestamp {event.timestamp.isoformat()} is {format_age(age)} old; events older"
                f" than {format_age(self.max_event_age)} are refused (RECEIVER_MAX_EVENT_AGE)"
            )
            too_old.event_id = event.id
            raise too_old
        if self.max_clock_skew and -age > self.max_clock_skew:
            # Refused, or this one event would make every later event of its session look
            # stale (the lifecycle orders by timestamp). Not quarantined, as too old is not:
            # a captured copy could be sent again and again. The sender's retries carry the
            # same timestamp: one that comes once it is no longer that far ahead is accepted.
            future = EventFromFutureError(
                f"timestamp {event.timestamp.isoformat()} is {format_age(-age)} ahead of this"
                f" receiver's clock; events more than {format_age(self.max_clock_skew)} ahead are"
                " refused (RECEIVER_MAX_CLOCK_SKEW): the sender's clock is wrong, and its"
                " retries of this event will be refused too until that time; check its"
                " clock (NTP)"
            )
            future.event_id = event.id
            raise future

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise PayloadTooLargeError(f"body exceeds the limit of {self.max_body} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _quarantine(
        self, body: bytes, exc: RequestError, client: str | None, event_id: str | None
    ) -> None:
        try:
            await self.store.events.quarantine(
                body, reason=f"{exc.code}: {exc.message}", client=client, event_id=event_id
            )
        except StorageUnavailableError as store_exc:
            # Not kept, so don't say "invalid": the sender must retry and we keep it then.
            raise StorageUnavailableError(
                f"{exc.code} ({exc.message}), and it could not be quarantined: {store_exc.message}"
            ) from store_exc


_json_string = json.encoder.encode_basestring_ascii  # json.dumps of a str, in C


def _answer(payload: dict[str, Any]) -> bytes:
    """The response body: json.dumps(payload), with the two answers every delivery gets
    written directly (an id is a JSON string either way)."""
    if len(payload) == 2 and (status := payload.get("status")) in ("accepted", "duplicate"):
        return b'{"id": %s, "status": "%s"}' % (
            _json_string(payload["id"]).encode(),
            status.encode(),
        )
    return json.dumps(payload).encode()


def _guess_id(body: bytes) -> str | None:
    """The id field of a body that failed validation, if one can be read, for logs."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    value = data.get("id") if isinstance(data, dict) else None
    if not isinstance(value, str):
        return None
    # A lone surrogate (from a \u escape) cannot be stored as text: replace it.
    return value[:256].encode("utf-8", "replace").decode("utf-8")
