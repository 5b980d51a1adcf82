"""receiver.tracing's own parts: when it is on, the carrier kept in the store, what goes
out, and that off costs a test of one flag (nothing of the SDK is imported)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from receiver import tracing

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}


@pytest.mark.parametrize(
    ("mode", "environ", "on"),
    [
        ("auto", {}, False),
        ("auto", ENDPOINT, True),
        ("auto", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ("auto", {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ("off", ENDPOINT, False),
        ("on", {}, True),
    ],
)
def test_tracing_is_on_only_when_an_endpoint_or_the_setting_says_so(
    mode: str, environ: dict[str, str], on: bool
) -> None:
    assert tracing.wanted(mode, environ) is on


def test_off_imports_nothing_of_opentelemetry() -> None:
    code = (
        "import sys; from receiver import tracing; from receiver.app import create_app;"
        " from receiver.settings import Settings;"
        " create_app(Settings(db=':memory:', tracing='off'));"
        " print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_kept_carrier_and_outbound_headers_continue_a_span() -> None:
    """A span's carrier round-trips through the store format; its tracestate rides along
    after a newline; an invalid traceparent starts a new trace instead of failing."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import SpanKind, get_current_span, set_span_in_context

    tracer = TracerProvider().get_tracer("test")
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    ctx = tracing._context(parent + "\nvendor=a,other=b")
    span = tracer.start_span("x", ctx, SpanKind.INTERNAL)
    kept = tracing.carrier(span)
    assert kept is not None
    head, state = kept.split("\n")
    assert head.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-") and head.endswith("-01")
    assert head != parent and state == "vendor=a,other=b"
    assert tracing.outbound(span) == {"traceparent": head, "tracestate": state}
    assert tracing.outbound(None) == {} and tracing.carrier(None) is None
    bad = tracer.start_span("y", tracing._context("00-nonsense"), SpanKind.INTERNAL)
    assert tracing.carrier(bad) is not None  # a trace of its own
    assert not tracing.carrier(bad).startswith("00-4bf92f")  # type: ignore[union-attr]
    assert get_current_span(set_span_in_context(span)) is span


def test_an_unsampled_parent_costs_no_span_and_still_propagates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nine events in ten under a 10% sampler: routing and sends make no span of their
    own, and what goes out carries the unsampled trace as it came."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert tracing.configure("auto")
    try:
        quiet = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00\nvendor=a"
        span = tracing.start(tracing.ROUTE, quiet)
        assert span is not None and not span.is_recording()
        assert tracing.carrier(span) == quiet and tracing.child(span, "rule r") is None
        assert tracing.outbound(span) == {
            "traceparent": quiet.split("\n")[0],
            "tracestate": "vendor=a",
        }
        loud = tracing.start(tracing.ROUTE, quiet.replace("-00\n", "-01\n"))
        assert loud is not None and loud.is_recording()  # not ended: nothing to export
        assert tracing.carrier(loud) != quiet.replace("-00\n", "-01\n")
        assert tracing.sampled(tracing.carrier(loud) or "") and not tracing.sampled(quiet)
        assert tracing.start(tracing.ROUTE, "00-garbage").is_recording()  # type: ignore[union-attr]
    finally:
        tracing.shutdown(0)
    assert not tracing.on
