"""`make bench`'s streams part: the receiver on every stream shape of bench/streams.py,
each against the ceiling of the same round; its section of bench/RESULTS.md and the
"streams" entry of bench/figures.json (what `make bench-check` compares).

    .venv/bin/python -m bench.run --parts streams
    .venv/bin/python -m bench.run --parts streams --rounds 1 --duration 5 --events 60000

Each round: the ceiling, every shape's receiver run (the order turned by one each round,
so no shape always runs first or last), the ceiling again; the ratio is a shape's
stored+routed/s over the mean of the round's two ceiling runs. bench/run.py hands in its
server and measurement functions (make_server, measure), as it does to bench/pg.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import streams
from receiver import rules

WARMUP_EVENTS = 20_000


def prepare(
    count: int, work: Path, secret: str, current: tuple[Path, Path, list[dict[str, Any]]]
) -> dict[str, tuple[Path, Path, str]]:
    """Each shape's measured file, warm-up file (other ids) and what its stream holds; the
    current shape's files (and events) are bench/run.py's, already written."""
    files = {}
    for shape in streams.SHAPES:
        started = time.monotonic()
        if shape.name == "current":
            stream, warmup, sent = current
        else:
            sent = shape.deliveries(count, 1, shape.name.replace("-", ""))
            stream, warmup = work / f"{shape.name}.tsv", work / f"{shape.name}-warmup.tsv"
            streams.write(stream, sent, secret)
            warm = shape.deliveries(WARMUP_EVENTS, 2, f"warm{shape.name.replace('-', '')}")
            streams.write(warmup, warm, secret)
        files[shape.name] = (stream, warmup, facts(sent, shape.rules))
        print(
            f"streams: {shape.name}: {len(sent)} deliveries written in "
            f"{time.monotonic() - started:.1f}s",
            file=sys.stderr,
            flush=True,
        )
    return files


def facts(sent: list[dict[str, Any]], rules_file: Path) -> str:
    """What a stream holds, measured: deliveries, duplicates, sessions, users, types, the
    events' age and the share the receiver's own matcher routes to a notifier."""
    unique = list({event["id"]: event for event in sent}.values())
    ruleset = rules.load_file(rules_file)
    matching = sum(1 for event in unique if ruleset.route(event))
    kinds = Counter(event["type"] for event in unique)
    now = datetime.now(UTC)
    ages = [now - datetime.fromisoformat(unique[i]["timestamp"]) for i in (0, -1)]
    dupes = len(sent) - len(unique)
    return (
        f"{len(sent):,} deliveries, {len(unique):,} distinct events ({dupes:,} duplicates, "
        f"{dupes / len(sent):.1%}); {len({e['sessionId'] for e in unique}):,} sessions, "
        f"{len({e.get('userId') for e in unique}):,} users; "
        + ", ".join(f"{k} {v / len(unique):.0%}" for k, v in sorted(kinds.items()))
        + f"; dated {_age(ages[0])} to {_age(ages[1])} before the files were written; "
        f"{matching:,} ({matching / len(unique):.2%}) match a rule of {rules_file.name} "
        f"({len(ruleset.rules)} rules)"
    )


def _age(delta: Any) -> str:
    seconds = delta.total_seconds()
    return f"{seconds / 86400:.1f} days" if seconds >= 86400 else f"{seconds / 60:.0f} min"


def run_part(
    args: argparse.Namespace,
    work: Path,
    sink_port: int,
    pin: bool,
    *,
    current: tuple[Path, Path, list[dict[str, Any]]],
    secret: str,
    make_server: Callable[..., Any],
    measure: Callable[..., Any],
) -> list[str]:
    """Every shape, args.rounds times, against the ceiling of its round; the section."""
    ran = code()  # as the runs start: the working tree is shared and may change meanwhile
    files = prepare(args.events, work, secret, current)
    runner = _Runner(args, work, sink_port, pin, make_server, measure)
    rows: list[dict[str, Any]] = []
    for round_no in range(1, args.rounds + 1):
        turn = (round_no - 1) % len(streams.SHAPES)
        order = streams.SHAPES[turn:] + streams.SHAPES[:turn]
        ceilings = [runner.ceiling(round_no, current[0], current[1])]
        runs = [
            (shape.name, *runner.shape(round_no, shape, *files[shape.name][:2])) for shape in order
        ]
        ceilings.append(runner.ceiling(round_no, current[0], current[1]))
        rows += [_row(name, round_no, r, paced, ceilings) for name, r, paced in runs]
    summary = summarize(rows)
    write_figures(args.figures, args, rows, summary)
    held = {name: f[2] for name, f in files.items()}
    return section(args, rows, summary, held, ran)


class _Runner:
    """bench/run.py's make_server and measure with this run's settings."""

    def __init__(
        self,
        args: argparse.Namespace,
        work: Path,
        sink_port: int,
        pin: bool,
        make_server: Callable[..., Any],
        measure: Callable[..., Any],
    ) -> None:
        self.args, self.work, self.sink_port, self.pin = args, work, sink_port, pin
        self.make_server, self.measure = make_server, measure

    def ceiling(self, round_no: int, stream: Path, warmup: Path) -> float:
        print(f"streams {round_no}: ceiling ...", file=sys.stderr, flush=True)
        server = self.make_server("ceiling", self.work, self.sink_port)
        r = self.measure(server, round_no, self.args, stream, warmup, self.pin)
        print(f"  {describe(r)}", file=sys.stderr, flush=True)
        return float(r.rps)

    def shape(self, round_no: int, shape: streams.Shape, stream: Path, warmup: Path) -> Any:
        """The receiver on shape flat out, then paced (args.paced of the flat-out rate, or
        args.paced_rate; None when both are 0)."""
        rate = None
        results = []
        for label in ("flat out", "paced"):
            if label == "paced":
                rate = self.args.paced_rate or self.args.paced * results[0].rps
                if not rate:
                    return results[0], None
                label = f"paced to {rate:,.0f}/s"
            server = self.make_server(
                "receiver",
                self.work,
                self.sink_port,
                env_extra={"RECEIVER_RULES": str(shape.rules)},
            )
            print(f"streams {round_no}: {shape.name}, {label} ...", file=sys.stderr, flush=True)
            r = self.measure(server, round_no, self.args, stream, warmup, self.pin, rate=rate)
            print(f"  {describe(r)}; {'; '.join(r.notes)}", file=sys.stderr, flush=True)
            results.append(r)
        return results[0], results[1]


def describe(r: Any) -> str:
    line = f"{r.rps:,.0f} accepted/s, p99 {r.p99_ms:.2f} ms"
    if r.routing is not None:
        line += f"; stored+routed {r.routing.sustained:,.0f}/s, lag max {r.routing.lag_max:.2f} s"
    return line


def _round(value: float | None, digits: int = 0) -> Any:
    if value is None:
        return None
    return round(value, digits) if digits else round(value)


def _row(name: str, round_no: int, r: Any, paced: Any, ceilings: list[float]) -> dict[str, Any]:
    """One shape's run of a round (and its paced run, if any) as figures.json keeps it."""
    ceiling = sum(ceilings) / len(ceilings)
    routing, late = r.routing, paced.routing if paced is not None else None
    sustained = routing.sustained if routing is not None else None
    return {
        "shape": name,
        "round": round_no,
        "ceiling_rps": round(ceiling),
        "ceiling_runs": [round(c) for c in ceilings],
        "accepted_rps": round(r.rps),
        "sustained_rps": _round(sustained),
        "ratio": round(sustained / ceiling, 3) if sustained is not None and ceiling else None,
        "p99_ms": round(r.p99_ms, 2),
        "lag_max_s": _round(routing and routing.lag_max, 2),
        "lag_p99_s": _round(routing and routing.lag_p99, 2),
        "cpu_us": _round(r.cpu_us),
        "hold_ms": list(r.hold_ms) if r.hold_ms is not None else None,
        "errors": ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-",
        "load": r.load,
        "paced": None
        if paced is None
        else {
            "offered_rps": round(paced.offered),
            "accepted_rps": round(paced.rps),
            "sustained_rps": _round(late and late.sustained),
            "p99_ms": round(paced.p99_ms, 2),
            "lag_max_s": _round(late and late.lag_max, 2),
            "lag_p99_s": _round(late and late.lag_p99, 2),
            "load": paced.load,
        },
        "notes": "; ".join(r.notes)
        + (f" | paced: {'; '.join(paced.notes)}" if paced is not None else ""),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape: the mean ratio over the rounds (None if a run was never all routed), the
    mean stored+routed/s and CPU an event, the worst p99 and lag, flat out and paced; and
    the worst shape by ratio."""
    shapes: dict[str, Any] = {}
    for name in streams.NAMES:
        mine = [row for row in rows if row["shape"] == name]
        if not mine:
            continue
        ratios = [row["ratio"] for row in mine]
        complete = all(ratio is not None for ratio in ratios)
        paced = [row["paced"] for row in mine if row["paced"] is not None]
        cpu = [row["cpu_us"] for row in mine if row["cpu_us"] is not None]
        holds = [row["hold_ms"] for row in mine if row.get("hold_ms")]
        shapes[name] = {
            "ratio": round(sum(ratios) / len(ratios), 3) if complete else None,
            "sustained_rps": _mean([row["sustained_rps"] for row in mine]) if complete else None,
            "p99_ms": max(row["p99_ms"] for row in mine),
            "lag_max_s": max((row["lag_max_s"] or 0.0) for row in mine),
            "cpu_us": _mean(cpu) if cpu else None,
            # The worst of the rounds: the 99th percentile's and the longest's buckets, ms.
            "hold_ms": [max(h[0] for h in holds), max(h[1] for h in holds)] if holds else None,
            "paced_lag_max_s": max((p["lag_max_s"] or 0.0) for p in paced) if paced else None,
            "paced_p99_ms": max(p["p99_ms"] for p in paced) if paced else None,
        }
    # A shape whose events were not all routed is the worst there is: ratio 0.
    worst = min(shapes, key=lambda name: shapes[name]["ratio"] or 0.0, default=None)
    return {
        "shapes": shapes,
        "worst": {"shape": worst, "ratio": shapes[worst]["ratio"] or 0.0} if worst else None,
    }


def _mean(values: list[float]) -> int:
    return round(sum(values) / len(values))


def write_figures(
    path: Path, args: argparse.Namespace, rows: list[dict[str, Any]], summary: dict[str, Any]
) -> None:
    """The "streams" entry of figures.json; the file's other entries (the throughput
    part's) stay as they are."""
    figures = json.loads(path.read_text()) if path.exists() else {}
    figures["streams"] = {
        "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "duration_s": args.duration,
        "events": args.events,
        "connections": args.connections,
        "rounds": args.rounds,
        "worst": summary["worst"],
        "shapes": summary["shapes"],
        "runs": [{k: v for k, v in row.items() if k != "notes"} for row in rows],
    }
    path.write_text(json.dumps(figures, indent=2) + "\n")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def section(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    summary: dict[str, Any],
    held: dict[str, str],
    ran: str = "",
) -> list[str]:
    """The report's "Stream shapes" section."""
    lines = [*_intro(args, rows, ran), *_summary_table(summary), *_runs_table(rows)]
    if any(row["paced"] for row in rows):
        lines += _paced_table(args, rows)
    lines += ["", "The shapes (bench/streams.py), each stream as written for this run:", ""]
    for shape in streams.SHAPES:
        lines.append(f"- {shape.name}: {shape.about}. {held.get(shape.name, '')}.")
    lines += ["", "Per run:", ""]
    lines += [f"- {row['shape']} run {row['round']}: {row['notes']}" for row in rows]
    return [*lines, ""]


def _intro(args: argparse.Namespace, rows: list[dict[str, Any]], ran: str) -> list[str]:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    loads = [float(row["load"].split()[1]) for row in rows if row["load"]]
    loads += [float(row["paced"]["load"].split()[1]) for row in rows if row["paced"]]
    return [
        "## Stream shapes",
        "",
        f'Run on {when} (`make bench BENCH_ARGS="--parts streams"`), {args.rounds} round(s). '
        "Each round: the ceiling (bench/ceiling.py, the current stream), the receiver on "
        "every shape (the order turned by one each round), the ceiling again; "
        f"{args.duration}s of wrk -t1 -c{args.connections} flat out a run, after {args.warmup}s"
        " of warm-up on a separate file of the same shape (other ids), a fresh SQLite file "
        "each run, the server on core 0, wrk on core 1. stored+routed/s: the events a run "
        "stored over the time from its first accept to the routing of its last (the drain "
        "after wrk stops included), as in the throughput part; ratio: that over the mean of "
        "the round's two ceiling runs. p99: wrk's, at full load. Routing lag: routed_at - "
        "received_at of the run's events. CPU: the server's CPU time over the events it "
        "stored and routed, steadier than the rates where other work shares the machine."
        + (
            f" The 1-minute load average was {min(loads):.2f} to {max(loads):.2f} as the runs "
            "started (2 cores; the load column)."
            if loads
            else ""
        )
        + (f" {ran}" if ran else ""),
        "",
    ]


def code() -> str:
    """Which code ran: the commit, and the receiver's files that differed from it."""
    root = Path(__file__).resolve().parent.parent
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", "receiver"], cwd=root, capture_output=True, text=True
    ).stdout.split("\n")
    files = [line[3:] for line in changed if line.strip()]
    if not head:
        return "Code: not a git checkout."
    if not files:
        return f"Code: commit {head}, the receiver as committed."
    return f"Code: commit {head}, with uncommitted changes to {', '.join(files)}."


def _summary_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| shape | ratio (mean) | stored+routed/s | p99 ms (worst) | routing lag max s | "
        "CPU µs an event | paced: routing lag max s | paced: p99 ms | loop held ms: p99, "
        "longest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in summary["shapes"].items():
        hold = s.get("hold_ms")
        lines.append(
            f"| {name} | {_fmt(s['ratio'], '.2f')}x | {_fmt(s['sustained_rps'], ',')} | "
            f"{s['p99_ms']:.2f} | {s['lag_max_s']:.2f} | {_fmt(s['cpu_us'], ',')} | "
            f"{_fmt(s['paced_lag_max_s'], '.2f')} | {_fmt(s['paced_p99_ms'], '.2f')} | "
            + (f"≤ {hold[0]:g}, ≤ {hold[1]:g} |" if hold else "- |")
        )
    worst = summary["worst"]
    if worst:
        lines += ["", f"Worst shape: **{worst['shape']}**, {worst['ratio']:.2f}x of the ceiling."]
    return [*lines, ""]


def _runs_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| shape | round | ceiling/s (before, after) | accepted/s | stored+routed/s | ratio | "
        "p99 ms | lag max s | lag p99 s | CPU µs an event | errors | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        before_after = ", ".join(f"{c:,}" for c in row["ceiling_runs"])
        lines.append(
            f"| {row['shape']} | {row['round']} | {row['ceiling_rps']:,} ({before_after}) | "
            f"{row['accepted_rps']:,} | {_fmt(row['sustained_rps'], ',')} | "
            f"{_fmt(row['ratio'], '.2f')} | {row['p99_ms']:.2f} | {_fmt(row['lag_max_s'], '.2f')}"
            f" | {_fmt(row['lag_p99_s'], '.2f')} | {_fmt(row['cpu_us'], ',')} | {row['errors']} |"
            f" {row['load']} |"
        )
    return lines


def _paced_table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> list[str]:
    offered = (
        f"{args.paced_rate:,.0f}/s (--paced-rate)"
        if args.paced_rate
        else f"{args.paced:.0%} of the rate it accepted flat out just before"
    )
    lines = [
        "",
        f"Paced: each shape again, right after its flat-out run, offered {offered} (wrk's "
        "delay() hook over the same connections), for the routing lag below saturation.",
        "",
        "| shape | round | offered/s | accepted/s | stored+routed/s | p99 ms | lag max s | "
        "lag p99 s | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        p = row["paced"]
        if p is None:
            continue
        lines.append(
            f"| {row['shape']} | {row['round']} | {p['offered_rps']:,} | {p['accepted_rps']:,} | "
            f"{_fmt(p['sustained_rps'], ',')} | {p['p99_ms']:.2f} | {_fmt(p['lag_max_s'], '.2f')}"
            f" | {_fmt(p['lag_p99_s'], '.2f')} | {p['load']} |"
        )
    return lines
