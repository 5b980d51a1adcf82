"""A small OTLP/HTTP sink: a real local server taking what an OpenTelemetry exporter POSTs
to /v1/traces (protobuf, gzip or not), decoding each span; and tree(), which prints the
spans of one trace as the tree an operator's tracing backend would show.

with OTLPSink() as otlp:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    ...
    spans = otlp.wait_for(lambda spans: any(s.name == "route" for s in spans))
    print(tree(spans, trace_id))
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.servers import HOST

_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class Span:
    """One span as the collector got it: ids in hex (parent "" for a root)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None  # the status message of a span marked failed
    service: str
    trace_state: str
    scope: str = ""  # the instrumentation scope's name and version
    scope_version: str = ""

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


def decode(body: bytes) -> list[Span]:
    """The spans of one OTLP/HTTP protobuf export request."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(
                    Span(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        kind=_KINDS.get(s.kind, "unspecified"),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        error=s.status.message if s.status.code == 2 else None,
                        service=str(resource.get("service.name", "")),
                        trace_state=s.trace_state,
                        scope=scope_spans.scope.name,
                        scope_version=scope_spans.scope.version,
                    )
                )
    return spans


class OTLPSink:
    """Takes POST /v1/traces on a free port of 127.0.0.1; `spans` is all it decoded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        self.exports = 0  # export requests taken
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                found = decode(body)
                with outer._lock:
                    outer._spans.extend(found)
                    outer.exports += 1
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> OTLPSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, done: Callable[[list[Span]], bool], what: str, timeout: float = 30.0
    ) -> list[Span]:
        """The spans once done(spans) holds; the deadline is generous (a busy machine), and
        the wait ends as soon as they are there."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({s.name for s in spans})
                raise AssertionError(f"timed out waiting for {what}; spans so far: {names}")
            time.sleep(0.05)


_SHOWN = tuple(
    f"receiver.{name}"
    for name in ("event.id", "rule", "decision", "notifier", "subscriber", "attempt", "outcome")
)


def tree(spans: Sequence[Span], trace_id: str, *, timed: bool = True) -> str:
    """The spans of trace_id as an indented tree, children in start order, each with its
    kind, when it started (from the trace's first span) and how long it took, the
    attributes an operator filters on, and its error if it failed:

        POST /v1/events [server] at +0.0 ms, took 13.2 ms event.id=evt_1 ...
          verify [internal] at +0.1 ms, took 5.3 ms
          ...
    """
    mine = [s for s in spans if s.trace_id == trace_id]
    ids = {s.span_id for s in mine}
    children: dict[str, list[Span]] = {}
    for s in sorted(mine, key=lambda s: s.start_ns):
        parent = s.parent_id if s.parent_id in ids else ""
        children.setdefault(parent, []).append(s)
    lines: list[str] = []
    t0 = min((s.start_ns for s in mine), default=0)

    def walk(parent: str, depth: int) -> None:
        for s in children.get(parent, []):
            shown = [f"{k}={s.attributes[k]}" for k in _keys(s)]
            took = [f"at +{(s.start_ns - t0) / 1e6:.1f} ms, took {s.ms:.1f} ms"] if timed else []
            error = [f"ERROR {s.error}"] if s.error else []
            parts = [s.name, f"[{s.kind}]", *took, *shown, *error]
            lines.append("  " * depth + " ".join(parts))
            walk(s.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)


def _keys(span: Span) -> list[str]:
    return [k for k in (*_SHOWN, "http.response.status_code") if k in span.attributes]
