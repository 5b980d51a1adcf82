"""OpenTelemetry tracing: one trace per event, from the sender's request to every send.

Off unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (spans
go there as OTLP over HTTP/protobuf), or RECEIVER_TRACING=on (the exporter's default,
http://localhost:4318); RECEIVER_TRACING=off forces it off. The rest is the OpenTelemetry
SDK's own environment: OTEL_SERVICE_NAME (default attention-receiver),
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER (default parentbased_always_on),
OTEL_EXPORTER_OTLP_HEADERS, OTEL_BSP_*. While off, nothing of the SDK is imported and each
hook below is one test of `on`.

One event's trace, whatever replica routes and sends it:

    POST /v1/events           ingest (SERVER), a child of the sender's traceparent
      verify                  signature, JSON, the event model
      store                   the durable insert (its group commit)
      route                   routing, later: a child of the ingest span, whose context
        rule <name>           the event row keeps; one span a notification placed, with
          notify <notifier>   its decision; one span a send attempt (CLIENT), retries
        webhook <subscriber>  hours later and after restarts included, under the decision
                              that queued them (its context is kept on the outbox row)

A retry is a span of the same trace, not a new trace linked to it: the tree then shows
every attempt under the decision that caused it, and a search by the event's trace id
finds all of them. (A backend that closes a trace after an idle time shows a late retry as
a later part of the same trace id.) Repeats, escalation steps and digests, queued by the
timers, are children of the ingest span of the event their row names.

The context travels as a carrier string: a W3C traceparent, and "\\n" + the tracestate
when there is one (a tracestate never holds a newline).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.trace import Span, Tracer

    from receiver.metrics import Metrics

log = logging.getLogger("receiver.tracing")

SERVICE_NAME = "attention-receiver"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

# Span names and the attributes an operator filters on, fixed (dashboards and queries
# name them): OpenTelemetry's semantic conventions where they have a name, ours under
# "receiver." (docs/operations.md#tracing has the table).
INGEST = "POST /v1/events"
INGEST_ROUTE = "/v1/events"
VERIFY = "verify"
STORE = "store"
ROUTE = "route"
EVENT_ID = "receiver.event.id"
EVENT_TYPE = "receiver.event.type"
SESSION_ID = "receiver.session.id"
RULE = "receiver.rule"
RULES_MATCHED = "receiver.rules_matched"
REPLAY = "receiver.replay"
NOTIFIER = "receiver.notifier"
SUBSCRIBER = "receiver.subscriber"
ATTEMPT = "receiver.attempt"
OUTBOX_ID = "receiver.outbox.id"
DECISION = "receiver.decision"  # what routing did: pending (sent), held, silenced, ...
REASON = "receiver.decision_reason"
RESULT = "receiver.result"  # ingest: accepted, duplicate, conflict, or the error code
OUTCOME = "receiver.outcome"  # a send: delivered, retry, dead
KIND = "receiver.notification.kind"  # event, resolved, repeat, escalation, digest, ...
# OpenTelemetry's (HTTP, URL, server and error semantic conventions).
METHOD = "http.request.method"
STATUS = "http.response.status_code"
RESEND_COUNT = "http.request.resend_count"
HTTP_ROUTE = "http.route"
URL_FULL = "url.full"
URL_PATH = "url.path"
URL_SCHEME = "url.scheme"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
_DEFAULT_PORTS = {"http": 80, "https": 443}

on = False  # whether spans are made (configure() decides)
_provider: TracerProvider | None = None
_tracer: Tracer | None = None
_api: Any = None  # opentelemetry.trace, once loaded (_load)
_CURRENT: contextvars.ContextVar[Span | None] = contextvars.ContextVar("span", default=None)


def wanted(mode: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether RECEIVER_TRACING=mode (auto, on, off) and the environment turn tracing on.

    >>> wanted("auto", {}), wanted("auto", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    (False, True)
    >>> wanted("off", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    False
    """
    if mode == "off":
        return False
    return mode == "on" or any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def configure(mode: str, metrics: Metrics | None = None) -> bool:
    """Turn tracing on or off for this process (each `--workers` process does its own);
    whether it is on. A provider configured before is shut down first."""
    global on, _provider, _tracer
    shutdown(0.0)
    if not wanted(mode):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {}
    given = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in given:
        attributes["service.name"] = SERVICE_NAME
    from receiver import __version__

    attributes["service.version"] = __version__
    # The sampler is the SDK's, from OTEL_TRACES_SAMPLER (parentbased_always_on unset).
    # shutdown_on_exit off: stop() ends it within the grace; at exit, an unreachable
    # collector must not hold the process.
    _provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    _provider.add_span_processor(BatchSpanProcessor(_counted(OTLPSpanExporter(), metrics)))
    _tracer = _provider.get_tracer("receiver", __version__)  # the instrumentation scope
    on = True
    log.info(
        "tracing on: spans to %s (sampler %s)",
        _endpoint(),
        os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
    )
    return True


def shutdown(timeout: float) -> None:
    """Export what is buffered, waiting at most timeout seconds, and stop; tracing is off
    afterwards. Runs in a thread at shutdown: an unreachable collector must not hold up
    the exit past the grace (spans not sent by then are lost, and counted)."""
    global on, _provider, _tracer
    provider, _provider, _tracer, on = _provider, None, None, False
    if provider is None:
        return
    if timeout > 0:
        provider.force_flush(int(timeout * 1000))
    provider.shutdown()


async def stop(timeout: float) -> None:
    """shutdown(timeout) in a daemon thread, waited for at most timeout (and a little): a
    collector that hangs must not hold the process past its grace, nor at its exit."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def run() -> None:
        try:
            shutdown(timeout)
        except Exception:  # noqa: BLE001 - spans lost at exit are logged, never fatal
            log.exception("stopping the trace exporter failed")
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_settle, done)

    threading.Thread(target=run, name="tracing-stop", daemon=True).start()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout + 0.1):
            await done


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _endpoint() -> str:
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return _strip_credentials(traces)
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
    return _strip_credentials(base.rstrip("/") + "/v1/traces")


def _strip_credentials(url: str) -> str:
    """url without a user part or query (a collector's token may ride in either)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _counted(exporter: SpanExporter, metrics: Metrics | None) -> SpanExporter:
    """exporter, counting the spans each export sends or loses
    (receiver_trace_spans_total{outcome}); a failing collector is logged by the SDK."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Counted(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            try:
                result = exporter.export(spans)
            except Exception:  # noqa: BLE001 - an exporter's bug loses spans, not the process
                log.exception("exporting %d spans failed", len(spans))
                result = SpanExportResult.FAILURE
            if metrics is not None:
                outcome = "exported" if result is SpanExportResult.SUCCESS else "failed"
                metrics.trace_spans.labels(outcome).inc(len(spans))
            return result

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return exporter.force_flush(timeout_millis)

    return Counted()


# -- contexts ---------------------------------------------------------------------------------


def _load() -> Any:
    """opentelemetry.trace (the API), imported once: the hooks below run for every event
    while tracing is on, and an import statement a call adds up."""
    global _api
    if _api is None:
        import opentelemetry.trace as api
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        api.w3c = TraceContextTextMapPropagator()  # type: ignore[attr-defined]
        _api = api
    return _api


def carrier(span: Span | None) -> str | None:
    """The context a span's children continue from, as kept in the store: its traceparent,
    and "\n" + its tracestate when it has one. None for no span."""
    if span is None:
        return None
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    parent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    return f"{parent}\n{state}" if state else parent


def sampled(kept: str) -> bool:
    """Whether a kept carrier's trace is sampled (its flags' last bit).

    >>> sampled("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), sampled("x")
    (True, False)
    """
    try:
        return int(kept[53:55], 16) & 1 == 1
    except ValueError:
        return False


def outbound(span: Span | None) -> dict[str, str]:
    """The headers that make span the parent of the request they go out with: traceparent,
    and tracestate when there is one; none while tracing is off."""
    kept = carrier(span)
    if kept is None:
        return {}
    parent, _, state = kept.partition("\n")
    return {"traceparent": parent, "tracestate": state} if state else {"traceparent": parent}


def current_headers() -> dict[str, str]:
    """outbound() of the current span: what an outgoing request carries (none while off)."""
    if not on:
        return {}
    return outbound(_CURRENT.get())


def recording() -> bool:
    """Whether the current span records (tracing on and the trace sampled): what a channel
    asks before working out attributes that only a recorded span keeps."""
    span = _CURRENT.get() if on else None
    return span is not None and span.is_recording()


def describe(name: str | None, attributes: Mapping[str, Any]) -> None:
    """Rename the current span (unless name is None) and add attributes (a channel naming
    what it sends to)."""
    span = _CURRENT.get() if recording() else None
    if span is not None:
        if name is not None:
            span.update_name(name)
        span.set_attributes(_clean(attributes))


def client_request(
    method: str | None, url: str | None, error_type: str | None = None
) -> dict[str, Any]:
    """The semantic conventions' attributes of a client's request: http.request.method,
    url.full, server.address and server.port (from url, the scheme's default port for
    http and https), error.type. url must already be free of secrets
    (receiver.notify.redaction.shown_url); None values are left out.

    >>> client_request("POST", "https://h.example/REDACTED")[SERVER_PORT]
    443
    """
    attributes: dict[str, Any] = {METHOD: method, URL_FULL: url, ERROR_TYPE: error_type}
    if url:
        parts = urlsplit(url)
        with contextlib.suppress(ValueError):
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
            if parts.hostname and parts.hostname != "redacted":  # a host that is a token
                attributes |= {SERVER_ADDRESS: parts.hostname, SERVER_PORT: port}
    return _clean(attributes)


def error_type(exc: BaseException) -> str:
    """error.type of a request that ended in exc: its class's full name.

    >>> error_type(ConnectionRefusedError())
    'builtins.ConnectionRefusedError'
    """
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _remote(kept: str | None) -> Any:
    """The span of a kept carrier (not recording: it lives elsewhere), to start children
    under or to propagate as it is; None for none, or for one that is no valid traceparent.
    Kept carriers are ours (made by carrier()), so they are read by position."""
    if not kept or len(kept) < 55 or kept[:3] != "00-":
        return None
    api = _load()
    parent, _, state = kept.partition("\n")
    try:
        trace_id, span_id = int(parent[3:35], 16), int(parent[36:52], 16)
        flags = api.TraceFlags(int(parent[53:55], 16))
    except ValueError:
        return None
    ctx = api.SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=flags,
        trace_state=api.TraceState.from_header([state]) if state else None,
    )
    return api.NonRecordingSpan(ctx) if ctx.is_valid else None


def _context(kept: str | None) -> Any:
    """The OpenTelemetry context to start a child of a kept carrier in; None (a new trace)
    for none, or for one that is not a valid traceparent."""
    span = _remote(kept)
    return None if span is None else _load().set_span_in_context(span)


def _incoming(headers: Iterable[tuple[bytes, bytes]]) -> Any:
    """The context of a request's traceparent (and tracestate); None without a valid one
    (an invalid one is ignored, never refused: W3C Trace Context, whose rules the SDK's
    propagator applies)."""
    carried: dict[str, str] = {}
    for name, value in headers:
        if name == b"traceparent":
            carried["traceparent"] = value.decode("latin-1")
        elif name == b"tracestate":
            before = carried.get("tracestate")
            state = value.decode("latin-1")
            carried["tracestate"] = f"{before},{state}" if before else state
    if "traceparent" not in carried:
        return None
    return _load().w3c.extract(carried)


# -- spans --------------------------------------------------------------------------------------


def start(
    name: str,
    parent: str | None = None,
    *,
    client: bool = False,
    attributes: Mapping[str, Any] | None = None,
) -> Span | None:
    """A span named name, a child of the kept carrier parent (a new trace without one);
    None while tracing is off. End it with end().

    A parent whose trace is not sampled gets no new span: its own (not recording) is
    returned, so its children, and the requests sent in it, carry the trace unsampled at
    the cost of no span (what a parent-based sampler would decide, without the SDK's
    work for each of the nine events in ten a 10% sampler drops)."""
    if not on or _tracer is None:
        return None
    if parent is not None and not sampled(parent):
        remote: Span | None = _remote(parent)
        if remote is not None:
            return remote
    api = _load()
    kind = api.SpanKind.CLIENT if client else api.SpanKind.INTERNAL
    return _tracer.start_span(name, _context(parent), kind, attributes=_clean(attributes))


def start_ingest(scope: Mapping[str, Any]) -> Span | None:
    """The ingest span of one request (SERVER, its ASGI scope), continuing its
    traceparent if valid."""
    if not on or _tracer is None:
        return None
    return _tracer.start_span(
        INGEST,
        _incoming(scope["headers"]),
        _load().SpanKind.SERVER,
        attributes={
            METHOD: "POST",
            URL_PATH: INGEST_ROUTE,
            URL_SCHEME: scope.get("scheme", "http"),
            HTTP_ROUTE: INGEST_ROUTE,
        },
    )


def child(parent: Span | None, name: str, attributes: Mapping[str, Any] | None = None) -> Any:
    """A span under parent (a live span); None without one, or under one not recording
    (an unsampled trace: its children would not be either)."""
    if parent is None or _tracer is None or not parent.is_recording():
        return None
    context = _load().set_span_in_context(parent)
    return _tracer.start_span(name, context, attributes=_clean(attributes))


def end(
    span: Span | None, attributes: Mapping[str, Any] | None = None, error: str | None = None
) -> None:
    """Set attributes (None values left out), mark an error, and end span (None: nothing)."""
    if span is None:
        return
    if attributes:
        span.set_attributes(_clean(attributes))
    if error is not None and span.is_recording():
        api = _load()
        span.set_status(api.Status(api.StatusCode.ERROR, error))
    span.end()


@contextlib.contextmanager
def step(parent: Span | None, name: str) -> Iterator[Span | None]:
    """A child span of parent for the block; an exception marks it failed (with the
    error's code, when it has one) and goes on."""
    span = child(parent, name)
    try:
        yield span
    except BaseException as exc:
        end(span, error=str(getattr(exc, "code", None) or type(exc).__name__))
        raise
    end(span)


class current:  # noqa: N801 - used as a function: `with tracing.current(span):`
    """Make span the current one meanwhile: log lines then carry its ids, and requests
    sent meanwhile its traceparent. Ours, not OpenTelemetry's context (no library here
    reads that one): one context variable set and reset, the cheapest way for every event."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span | None) -> None:
        self.span = span
        self.token: contextvars.Token[Span | None] | None = None

    def __enter__(self) -> None:
        if self.span is not None:
            self.token = _CURRENT.set(self.span)

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            _CURRENT.reset(self.token)


def log_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) of the current span, in hex, for log lines; None when there is
    none (or tracing is off)."""
    if not on:
        return None
    span = _CURRENT.get()
    if span is None:
        return None
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if v is not None}
