"""`make bench`'s tracing part: what OpenTelemetry tracing costs ingest and routing.

Three receivers, alternately, each round, flat out on the bench stream:

- before: the receiver as it was before tracing was built (commit BEFORE, read from this
  repository's history with `git archive`), so "off costs nothing" is measured against
  code that has no tracing at all, not against itself;
- off: the receiver as shipped, no OTEL_* endpoint set (the default);
- on, 10%: spans exported to a local OTLP/HTTP collector (a thread of this process that
  reads and discards them), OTEL_TRACES_SAMPLER=parentbased_traceidratio at 0.1.

    .venv/bin/python -m bench.run --parts tracing
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The last commit before tracing: its receiver has no trace column, no hook, no import.
BEFORE = "d6de1a8"
VARIANTS = ("before", "off", "on, 10%")


class Collector:
    """POST /v1/traces answered 200 and dropped: a collector that costs the receiver
    nothing but the export itself. Counts the requests and bytes it took."""

    def __init__(self) -> None:
        outer = self
        self.requests = 0
        self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(size)
                outer.requests += 1
                outer.bytes += size
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def before_tree(work: Path) -> Path | None:
    """The receiver package of BEFORE extracted under work; None if this clone's history
    does not have it (a shallow clone)."""
    target = Path(tempfile.mkdtemp(prefix="before-tracing-", dir=work))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", BEFORE, "receiver"], capture_output=True
    )
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def run(
    args: argparse.Namespace,
    work: Path,
    sink_port: int,
    stream: Path,
    warmup: Path,
    pin: bool,
    make_server: Callable[..., Any],
    measure: Callable[..., Any],
) -> list[str]:
    """The part's section of bench/RESULTS.md."""
    lines = [
        "## What tracing costs",
        "",
        f"The receiver before tracing was built (commit {BEFORE}), as shipped with tracing",
        "off (no OTEL_* endpoint: the default), and with tracing on, sampling 10% of",
        "traces (parentbased_traceidratio 0.1) and exporting them to a local OTLP/HTTP",
        "collector that discards them; alternately, flat out on the bench stream.",
        "",
        "| run | receiver | stored+routed/s | p99 ms | vs before | CPU µs an event | vs before |"
        " load |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    before = before_tree(work)
    collector = Collector()
    costs: dict[str, list[float]] = {v: [] for v in VARIANTS[1:]}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS[1:]}
    try:
        for round_no in range(1, args.rounds + 1):
            # Each round in another order: no variant always runs first on a shared machine.
            turn = (round_no - 1) % len(VARIANTS)
            figures: dict[str, Any] = {}
            for variant in VARIANTS[turn:] + VARIANTS[:turn]:
                env: dict[str, str] = {}
                if variant == "before":
                    if before is None:
                        continue
                    env["PYTHONPATH"] = f"{before}"
                elif variant.startswith("on"):
                    env |= {
                        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                        "OTEL_TRACES_SAMPLER_ARG": "0.1",
                    }
                server = make_server("receiver", work, sink_port, env_extra=env)
                print(f"tracing {round_no}: {variant} ...", file=sys.stderr, flush=True)
                figures[variant] = measure(server, round_no, args, stream, warmup, pin)
            lines += _rows(round_no, figures, costs, cpu)
    finally:
        collector.close()
    lines.append("")
    if before is None:
        lines.append(f"(Commit {BEFORE} is not in this clone's history: no 'before' runs.)")
    for variant, found in costs.items():
        if found:
            mean = sum(found) / len(found)
            each = ", ".join(f"{c:+.1%}" for c in found)
            lines.append(
                f"- {variant}: {mean:+.1%} stored+routed/s against before on average"
                f" (each round {each})."
            )
        if cpu[variant]:
            mean = sum(cpu[variant]) / len(cpu[variant])
            each = ", ".join(f"{c:+.1%}" for c in cpu[variant])
            lines.append(
                f"- {variant}: {mean:+.1%} server CPU an event against before on average"
                f" (each round {each}; + costs more)."
            )
    lines.append(
        f"- The collector took {collector.requests:,} export requests,"
        f" {collector.bytes / 1e6:,.1f} MB in all."
    )
    return [*lines, ""]


def _rows(
    round_no: int,
    figures: dict[str, Any],
    costs: dict[str, list[float]],
    cpu: dict[str, list[float]],
) -> list[str]:
    """A round's rows, in VARIANTS' order, each compared with the round's before."""
    base = figures.get("before")
    base_rate = base.routing.sustained if base is not None and base.routing else 0.0
    base_cpu = base.cpu_us if base is not None else None
    rows = []
    for variant in VARIANTS:
        r = figures.get(variant)
        if r is None:
            continue
        rate = r.routing.sustained if r.routing is not None else 0.0
        vs = vs_cpu = "-"
        if variant != "before" and base_rate:
            costs[variant].append(rate / base_rate - 1)
            vs = f"{rate / base_rate - 1:+.1%}"
        if variant != "before" and base_cpu and r.cpu_us:
            cpu[variant].append(r.cpu_us / base_cpu - 1)
            vs_cpu = f"{r.cpu_us / base_cpu - 1:+.1%}"
        used = f"{r.cpu_us:.0f}" if r.cpu_us else "-"
        rows.append(
            f"| {round_no} | {variant} | {rate:,.0f} | {r.p99_ms:.2f} | {vs} | {used} | {vs_cpu}"
            f" | {r.load} |"
        )
    return rows
