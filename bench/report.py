"""The throughput part's report: the machine, the side-by-side table, the routing lag, the
section merge into bench/RESULTS.md and bench/figures.json for `make bench-check`."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.load import (
    Result,
)
from bench.servers import LOAD_CPU, SERVER_CPU, TARGETS

# -- the report -----------------------------------------------------------------------------


def machine() -> list[str]:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    import starlette
    import uvicorn

    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
    webhook = shutil.which("webhook")
    hook_version = (
        subprocess.run([webhook, "-version"], capture_output=True, text=True).stdout.strip()
        if webhook
        else "not installed"
    )
    loops = [m for m in ("uvloop", "httptools") if _importable(m)]
    return [
        f"CPU: {model.group(1) if model else platform.processor() or 'unknown'}, "
        f"{os.cpu_count()} cores visible",
        f"OS: {platform.platform()}",
        f"Python {platform.python_version()}, uvicorn {uvicorn.__version__} "
        f"({' + '.join(loops) or 'asyncio + h11'}), starlette {starlette.__version__}",
        f"wrk {wrk_version.split()[1] if wrk_version else 'unknown'}; {hook_version}",
    ]


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def table(results: list[Result]) -> list[str]:
    by = {(r.target, r.round): r for r in results}
    lines = [
        "| target | run | accepted/s | stored+routed/s | max routing lag s | p50 ms | p99 ms "
        "| vs ceiling | vs webhook | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(results, key=lambda r: (TARGETS.index(r.target), r.round)):
        ceiling, hook = by.get(("ceiling", r.round)), by.get(("webhook", r.round))
        errors = ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-"
        sustained = f"{r.routing.sustained:,.0f}" if r.routing else "-"
        lag = f"{r.routing.lag_max:.2f}" if r.routing else "-"
        lines.append(
            f"| {r.target} | {r.round} | {r.rps:,.0f} | {sustained} | {lag} | {r.p50_ms:.2f} | "
            f"{r.p99_ms:.2f} | {_ratio(r, ceiling)} | {_ratio(r, hook)} | {errors} |"
        )
    return lines


def lag_table(results: list[Result], paced: list[Result]) -> list[str]:
    """The receiver flat out and paced, round by round: what it accepted vs what it routed."""
    burst = {r.round: r for r in results if r.target == "receiver"}
    lines = [
        "| run | sender | offered/s | accepted/s | stored+routed/s | routing lag max s | p99 s "
        "| p50 ms | p99 ms | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in paced:
        for r in (burst.get(p.round), p):
            if r is None:
                continue
            if r.offered is None:
                sender, offered = "flat out", "-"
            else:
                base = burst.get(r.round)
                share = f" ({r.offered / base.rps:.0%} of burst)" if base and base.rps else ""
                sender, offered = f"paced{share}", f"{r.offered:,.0f}"
            route = r.routing
            figures = (
                f"{route.sustained:,.0f} | {route.lag_max:.2f} | {route.lag_p99:.2f}"
                if route
                else "- | - | -"
            )
            lines.append(
                f"| {r.round} | {sender} | {offered} | {r.rps:,.0f} | {figures} | "
                f"{r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.load} |"
            )
    return lines


def _ratio(r: Result, base: Result | None) -> str:
    return f"{r.rps / base.rps:.2f}x" if base and base.rps else "-"


def report(
    results: list[Result], paced: list[Result], args: argparse.Namespace, extra: list[str]
) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    notes = [f"- {r.target} run {r.round}: {'; '.join(r.notes)}" for r in results if r.notes]
    notes += [
        f"- receiver paced run {r.round} ({r.offered:,.0f}/s offered): {'; '.join(r.notes)}"
        for r in paced
        if r.notes and r.offered is not None
    ]
    lag = [
        "## Routing lag: flat out and paced",
        "",
        f"The receiver flat out (wrk keeps {args.connections} connections busy) and paced: the "
        f"same {args.connections} connections, wrk's delay() hook spacing the requests to the "
        "offered rate, "
        + (
            f"{args.paced_rate:,.0f}/s (--paced-rate). "
            if args.paced_rate
            else f"{args.paced:.0%} of the flat-out (burst) rate measured just before in the "
            "same round. "
        )
        + "stored+routed/s counts the events stored from the first accept to the "
        "routing of the last one (the drain after wrk stops included); the routing lag of an "
        "event is routed_at - received_at, read from the SQLite file: from its accept (just "
        "before the 202) to the router taking it.",
        "",
        *lag_table(results, paced),
        "",
    ]
    return "\n".join(
        [
            "# bench/RESULTS.md",
            "",
            f"Written by `make bench` (bench/run.py) on {when}. Each target ran {args.rounds} "
            f"time(s), in rounds (ceiling, receiver, webhook), {args.duration}s each after a "
            f"{args.warmup}s warm-up, wrk -t1 -c{args.connections} on core {LOAD_CPU}, the server "
            f"on core {SERVER_CPU}. Ratios compare runs of the same round. Numbers from a shared "
            "machine are noisy: compare rounds before trusting a difference.",
            "",
            *table(results),
            "",
            "accepted/s: 202s a second while wrk ran (the ratios compare it). stored+routed/s: "
            "the events the run stored, over the time from the first accept to the routing of "
            "the last one, the drain after wrk stopped included: the rate the receiver can "
            "sustain. max routing lag: the longest an event of the run waited between its 202 "
            "and its routing.",
            "",
            *(lag if paced else []),
            "## Machine",
            "",
            *[f"- {line}" for line in machine()],
            "",
            "## What ran",
            "",
            "- ceiling: bench/ceiling.py, Starlette endpoint on the receiver's uvicorn settings: "
            "read body, verify HMAC, json.loads, 202.",
            "- receiver: `python -m receiver serve`, fresh SQLite file per run (default "
            "RECEIVER_SYNCHRONOUS=full), bench/rules.yaml (10 rules), RECEIVER_LOG_LEVEL=warning; "
            "verify, validate, durable dedupe, routed.",
            "- webhook: adnanh/webhook with bench/webhook-hooks.json: payload-hmac-sha256 on "
            "X-Service-Signature, then forks and runs /bin/true for every delivery (its model: "
            "one command per hook call), answering without waiting for it.",
            "- latency is wrk's, with 32 connections kept busy: mostly queueing, so p50 is about "
            "connections / throughput; p99 shows stalls.",
            *[f"- {line}" for line in extra],
            *notes,
            "",
        ]
    )


def merge(old: str, new: str, *, head: bool) -> str:
    """old with each `## ` section of new in place of old's of the same heading (up to a
    colon), sections old lacks appended; old's text before its first section stays unless
    head (new has one: the throughput part ran). A run of some parts keeps the others'."""

    def split(text: str) -> tuple[str, dict[str, str]]:
        first, *rest = re.split(r"(?m)^(?=## )", text)
        return first, {part.split("\n", 1)[0].split(":")[0]: part for part in rest}

    old_head, old_parts = split(old)
    new_head, new_parts = split(new)
    merged = [new_head if head else old_head]
    merged += [new_parts.get(key, part) for key, part in old_parts.items()]
    merged += [part for key, part in new_parts.items() if key not in old_parts]
    return "\n\n".join(part.strip("\n") for part in merged if part.strip()) + "\n"


# -- main -----------------------------------------------------------------------------------


def write_figures(path: Path, results: list[Result], args: argparse.Namespace) -> None:
    """The throughput part's figures as JSON, per round: the ceiling's and the receiver's
    requests/s, the receiver's stored+routed/s and its ratio to the ceiling of the same
    round (what `make bench-check` compares)."""
    by_round: dict[int, dict[str, Result]] = {}
    for r in results:
        by_round.setdefault(r.round, {})[r.target] = r
    rounds = []
    for number, targets in sorted(by_round.items()):
        ceiling, receiver = targets.get("ceiling"), targets.get("receiver")
        if ceiling is None or receiver is None or receiver.routing is None or not ceiling.rps:
            continue
        rounds.append(
            {
                "round": number,
                "ceiling_rps": round(ceiling.rps),
                "accepted_rps": round(receiver.rps),
                "sustained_rps": round(receiver.routing.sustained),
                "ratio": round(receiver.routing.sustained / ceiling.rps, 3),
                "p99_ms": round(receiver.p99_ms, 2),
                "lag_max_s": round(receiver.routing.lag_max, 2),
                "load": receiver.load,
            }
        )
    ratios = [r["ratio"] for r in rounds]
    old = json.loads(path.read_text()) if path.exists() else {}
    figures = {
        "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "duration_s": args.duration,
        "events": args.events,
        "connections": args.connections,
        "ratio": round(sum(ratios) / len(ratios), 3) if ratios else None,
        "rounds": rounds,
    }
    if "streams" in old:  # the streams part's entry (bench/stream_part.py) stays
        figures["streams"] = old["streams"]
    path.write_text(json.dumps(figures, indent=2) + "\n")
