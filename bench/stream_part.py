"""`make bench`'s streams part: the receiver on every stream shape of bench/streams.py,
each against the ceiling of the same round; its section of bench/RESULTS.md and the
"streams" entry of bench/figures.json (what `make bench-check` compares).

    .venv/bin/python bench/run.py --parts streams
    .venv/bin/python bench/run.py --parts streams --rounds 1 --duration 5 --events 60000

Each round: the ceiling, every shape's receiver run (the order turned by one each round,
so no shape always runs first or last), the ceiling again; the ratio is a shape's
stored+routed/s over the mean of the round's two ceiling runs. bench/run.py hands in its
server and measurement functions (make_server, measure), as it does to bench/pg.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import streams

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
    files = prepare(args.events, work, secret, current)
    measured = current[:2]
    rows: list[dict[str, Any]] = []
    for round_no in range(1, args.rounds + 1):
        turn = (round_no - 1) % len(streams.SHAPES)
        order = streams.SHAPES[turn:] + streams.SHAPES[:turn]
        ceilings = [_ceiling(args, work, sink_port, pin, measured, round_no, make_server, measure)]
        runs = []
        for shape in order:
            stream, warmup, _ = files[shape.name]
            server = make_server(
                "receiver", work, sink_port, env_extra={"RECEIVER_RULES": str(shape.rules)}
            )
            print(f"streams {round_no}: {shape.name} ...", file=sys.stderr, flush=True)
            r = measure(server, round_no, args, stream, warmup, pin)
            print(f"  {_describe(r)}; {'; '.join(r.notes)}", file=sys.stderr, flush=True)
            runs.append((shape.name, r))
        ceilings.append(
            _ceiling(args, work, sink_port, pin, measured, round_no, make_server, measure)
        )
        ceiling = sum(ceilings) / len(ceilings)
        rows += [_row(name, round_no, r, ceilings, ceiling) for name, r in runs]
    summary = summarize(rows)
    write_figures(args.figures, args, rows, summary)
    return section(args, rows, summary, {name: f[2] for name, f in files.items()})


def _ceiling(
    args: argparse.Namespace,
    work: Path,
    sink_port: int,
    pin: bool,
    current: tuple[Path, Path],
    round_no: int,
    make_server: Callable[..., Any],
    measure: Callable[..., Any],
) -> float:
    print(f"streams {round_no}: ceiling ...", file=sys.stderr, flush=True)
    r = measure(make_server("ceiling", work, sink_port), round_no, args, *current, pin)
    print(f"  {_describe(r)}", file=sys.stderr, flush=True)
    return float(r.rps)


def _describe(r: Any) -> str:
    line = f"{r.rps:,.0f} accepted/s, p99 {r.p99_ms:.2f} ms"
    if r.routing is not None:
        line += f"; stored+routed {r.routing.sustained:,.0f}/s, lag max {r.routing.lag_max:.2f} s"
    return line


def _row(name: str, round_no: int, r: Any, ceilings: list[float], ceiling: float) -> dict[str, Any]:
    routing = r.routing
    sustained = routing.sustained if routing is not None else None
    return {
        "shape": name,
        "round": round_no,
        "ceiling_rps": round(ceiling),
        "ceiling_runs": [round(c) for c in ceilings],
        "accepted_rps": round(r.rps),
        "sustained_rps": round(sustained) if sustained is not None else None,
        "ratio": round(sustained / ceiling, 3) if sustained is not None and ceiling else None,
        "p99_ms": round(r.p99_ms, 2),
        "lag_max_s": round(routing.lag_max, 2) if routing is not None else None,
        "lag_p99_s": round(routing.lag_p99, 2) if routing is not None else None,
        "errors": ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-",
        "notes": "; ".join(r.notes),
        "load": r.load,
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape: the mean ratio over the rounds (None if a run was never all routed), the
    mean stored+routed/s, the worst p99 and lag; and the worst shape by ratio."""
    shapes: dict[str, Any] = {}
    for name in streams.NAMES:
        mine = [row for row in rows if row["shape"] == name]
        if not mine:
            continue
        ratios = [row["ratio"] for row in mine]
        complete = all(ratio is not None for ratio in ratios)
        shapes[name] = {
            "ratio": round(sum(ratios) / len(ratios), 3) if complete else None,
            "sustained_rps": round(sum(row["sustained_rps"] for row in mine) / len(mine))
            if complete
            else None,
            "p99_ms": max(row["p99_ms"] for row in mine),
            "lag_max_s": max((row["lag_max_s"] or 0.0) for row in mine),
        }
    # A shape whose events were not all routed is the worst there is: ratio 0.
    worst = min(shapes, key=lambda name: shapes[name]["ratio"] or 0.0, default=None)
    return {
        "shapes": shapes,
        "worst": {"shape": worst, "ratio": shapes[worst]["ratio"] or 0.0} if worst else None,
    }


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
) -> list[str]:
    """The report's "Stream shapes" section."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    loads = [float(row["load"].split()[1]) for row in rows if row["load"]]
    lines = [
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
        "received_at of the run's events."
        + (
            f" The 1-minute load average was {min(loads):.2f} to {max(loads):.2f} as the runs "
            "started (2 cores; the load column)."
            if loads
            else ""
        ),
        "",
        "| shape | ratio (mean) | stored+routed/s | p99 ms (worst) | routing lag max s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in summary["shapes"].items():
        lines.append(
            f"| {name} | {_fmt(s['ratio'], '.2f')}x | {_fmt(s['sustained_rps'], ',')} | "
            f"{s['p99_ms']:.2f} | {s['lag_max_s']:.2f} |"
        )
    worst = summary["worst"]
    if worst:
        lines += ["", f"Worst shape: **{worst['shape']}**, {worst['ratio']:.2f}x of the ceiling."]
    lines += [
        "",
        "| shape | round | ceiling/s (before, after) | accepted/s | stored+routed/s | ratio | "
        "p99 ms | lag max s | lag p99 s | errors | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        before_after = ", ".join(f"{c:,}" for c in row["ceiling_runs"])
        lines.append(
            f"| {row['shape']} | {row['round']} | {row['ceiling_rps']:,} ({before_after}) | "
            f"{row['accepted_rps']:,} | {_fmt(row['sustained_rps'], ',')} | "
            f"{_fmt(row['ratio'], '.2f')} | {row['p99_ms']:.2f} | {_fmt(row['lag_max_s'], '.2f')}"
            f" | {_fmt(row['lag_p99_s'], '.2f')} | {row['errors']} | {row['load']} |"
        )
    lines += ["", "The shapes (bench/streams.py), each stream as written for this run:", ""]
    for shape in streams.SHAPES:
        lines.append(f"- {shape.name}: {shape.about}. {held.get(shape.name, '')}.")
    lines += ["", "Per run:", ""]
    lines += [f"- {row['shape']} run {row['round']}: {row['notes']}" for row in rows]
    return [*lines, ""]
