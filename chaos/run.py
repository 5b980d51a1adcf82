"""`make chaos`: the fault scenarios at full size; figures to docs/RELIABILITY-RESULTS.md.

    python -m chaos.run                       # 10 kills, 60s outage, the rest
    python -m chaos.run --kills 20 --outage 5m --only crash,outage
    python -m chaos.run --replicas 3          # only: 3 replicas on PostgreSQL, 10 kills, PG crash

The report is rewritten by a run without --replicas, keeping its replicas section; a run
with --replicas rewrites only that section.

Exits 1 if any scenario broke the promise. Bounded: load is `receiver simulate`
with a fixed seed; the machine is shared, so figures are indicative.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

from chaos import replicas, scenarios
from chaos.load import KINDS, Load
from chaos.promise import Outcome
from receiver.rules import parse_duration

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "RELIABILITY-RESULTS.md"
ALL = ("baseline", "crash", "sigterm", "outage", "slow-sink")
REPLICAS_HEADING = "## Replicas on PostgreSQL"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--stops", type=int, default=3, help="SIGTERMs under load")
    parser.add_argument("--outage", default="60s", help="how long the sink is down (90s, 5m)")
    parser.add_argument("--slow", type=float, default=10.0, help="seconds the slow sink takes")
    parser.add_argument("--duration", default="30s", help="load duration per scenario")
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", default=",".join(ALL))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--replicas", type=int, default=0, help="run only the replica scenario, with N replicas"
    )
    parser.add_argument("--pg-down", default="8s", help="how long PostgreSQL stays down")
    parser.add_argument(
        "--duplicates-per-crash",
        type=int,
        default=None,
        help="replicas: fail on more deliveries beyond the first than this a crash (default:"
        " at most what was in flight at the crash)",
    )
    args = parser.parse_args()
    if args.replicas:
        return _replicas(args)
    duration = parse_duration(args.duration)
    outage = parse_duration(args.outage)
    load = Load(sessions=args.sessions, duration=duration, tick=0.05, seed=args.seed, max_wait=90)
    wanted = args.only.split(",")
    results: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in wanted:
            folder = Path(tmp) / name
            folder.mkdir()
            print(f"chaos: {name} ...", flush=True)
            if name == "baseline":
                outcome = scenarios.baseline(folder, load=load)
            elif name == "crash":
                gap = (0.5, max(1.0, 2 * duration / max(1, args.kills) - 0.5))
                outcome = scenarios.crash(folder, kills=args.kills, load=load, gap=gap, settle=60)
            elif name == "sigterm":
                outcome = scenarios.sigterm(folder, stops=args.stops, load=load, settle=60)
            elif name == "outage":
                longer = Load(**{**load.__dict__, "duration": max(duration, outage + 5)})
                outcome = scenarios.outage(folder, down=outage, load=longer, settle=60)
            elif name == "slow-sink":
                outcome = scenarios.slow_sink(
                    folder, answer_after=args.slow, slow_for=min(duration, 15), load=load
                )
            else:
                parser.error(f"unknown scenario {name!r}; choose from {', '.join(ALL)}")
            print(f"  {'ok' if outcome.ok else 'BROKEN'}: {_line(outcome)}", flush=True)
            for problem in outcome.problems:
                print(f"  - {problem}")
            results.append(outcome)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    _, kept = _sections(args.out)
    args.out.write_text(_report(results, args) + kept)
    print(f"chaos: wrote {args.out}")
    return 0 if all(r.ok for r in results) else 1


def _replicas(args: argparse.Namespace) -> int:
    """The replica scenario alone; its section of the report, the rest kept."""
    pg_down = parse_duration(args.pg_down)
    # Long enough for every kill (a gap, then a restart of about 2s) and the PostgreSQL
    # crash to happen under load.
    duration = max(parse_duration(args.duration), 4.0 * args.kills + pg_down + 15)
    load = Load(
        sessions=args.sessions,
        duration=duration,
        tick=0.05,
        seed=args.seed,
        max_wait=90,
        timeout=10,  # a replica answers 503 within a few seconds while PostgreSQL is down
    )
    faults = replicas.Faults(
        replicas=args.replicas,
        kills=args.kills,
        pg_down=pg_down,
        duplicates_per_crash=args.duplicates_per_crash,
    )
    print(f"chaos: replicas x{args.replicas} ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        outcome = replicas.run(Path(tmp), faults=faults, load=load)
    print(f"  {'ok' if outcome.ok else 'BROKEN'}: {_line(outcome)}", flush=True)
    for problem in outcome.problems:
        print(f"  - {problem}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    head, _ = _sections(args.out)
    args.out.write_text(
        (head or "# Chaos results\n").rstrip("\n") + "\n\n" + _replicas_report(outcome, args, load)
    )
    print(f"chaos: wrote the replicas section of {args.out}")
    return 0 if outcome.ok else 1


def _sections(path: Path) -> tuple[str, str]:
    """The report as (everything before the replicas section, the replicas section)."""
    text = path.read_text() if path.exists() else ""
    at = text.find(REPLICAS_HEADING)
    if at < 0:
        return text, ""
    return text[:at], "\n" + text[at:]


def _line(o: Outcome) -> str:
    figures = ", ".join(f"{k} {v}" for k, v in o.figures.items())
    kinds = "; ".join(
        f"{key}: {c.sent} sent, {c.stale} stale, {c.other} other held back"
        for key, c in o.kinds.items()
    )
    return (
        f"{o.events} events, {o.acknowledged} acknowledged, {o.stored} stored, "
        f"{o.notified} notified, {o.notified_twice} notified twice; {kinds}; {figures};"
        f" {o.elapsed_s}s"
    )


def _replicas_report(o: Outcome, args: argparse.Namespace, load: Load) -> str:
    f = o.figures
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = [
        "| check | result |",
        "| --- | --- |",
        f"| outcome | {'ok' if o.ok else 'BROKEN: ' + '; '.join(o.problems)} |",
        f"| events sent / acknowledged / stored once | {o.events} / {o.acknowledged} /"
        f" {o.stored} |",
        f"| acknowledged but not stored (lost) | {o.lost} |",
        f"| events notified (every notification to send delivered) | {o.notified} of"
        f" {o.stored - o.not_sent} |",
        f"| requests answered per replica (balancer) | {f.get('requests_per_replica')} |",
        f"| kill -9 of a random replica | {f.get('kills')}, restart {f.get('restart_s_mean')} s"
        f" mean, {f.get('restart_s_max')} s max |",
        f"| deliveries beyond the first (same notification twice) | {f.get('extra_deliveries')}:"
        f" {f.get('extra_after_kills')} after the kills (at most {f.get('extra_per_kill_max')}"
        f" after one), {f.get('extra_after_pg_crash')} after the PostgreSQL crash,"
        f" {f.get('extra_after_retried_sends')} after sends that timed out"
        f" ({f.get('sends_retried')} sends failed and were retried) |",
        f"| throttle, one per user per {replicas.Faults.throttle_every:g}s | "
        f"{f.get('throttle_users')} users, {f.get('throttle_sent')} sent,"
        f" {f.get('throttle_held')} throttled; users notified twice within a window:"
        f" {f.get('throttle_users_twice_in_a_window')}, throttled outside one:"
        f" {f.get('throttle_users_held_outside_a_window')}; burst:"
        f" {f.get('burst_users_notified_once')} users notified exactly once |",
        f"| PostgreSQL down (pg_ctl -m immediate) | {f.get('pg_down_s')} s |",
        f"| 503 storage_unavailable while down | {f.get('pg_503_probes')} to probes,"
        f" {f.get('pg_503_via_balancer')} to the sender through the balancer; slowest answer"
        f" {f.get('pg_answer_s_max')} s; /readyz 503 x{f.get('pg_readyz_503')} |",
        f"| recovery, same processes (202 and /readyz 200 from every replica) |"
        f" {f.get('pg_recovery_s')} s after PostgreSQL was up |",
        f"| sender errors (retried on its schedule) | {f.get('sender_errors')} |",
    ]
    kinds = [
        "| notifications of | recorded | sent | stale | other held back | twice |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, c in o.kinds.items():
        kinds.append(
            f"| {KINDS[key]} | {c.notifications} | {c.sent} | {c.stale} | {c.other} | {c.twice} |"
        )
    return (
        f"{REPLICAS_HEADING}\n\n"
        f"Written by `make chaos REPLICAS={args.replicas}` ({when}; {platform.platform()},"
        f" {platform.python_version()}), {o.elapsed_s} s. {args.replicas} receivers on one"
        " PostgreSQL (fsync and synchronous commit on) behind a round-robin balancer; load"
        f" {load.sessions} sessions for {load.duration:g}s at 20 ticks/s, seed {load.seed}."
        " Other replicas keep taking the load while one is down; the PostgreSQL crash comes"
        ' halfway through the kills. See RELIABILITY.md, "Replicas on PostgreSQL".\n\n'
        + "\n".join(rows)
        + "\n\n"
        + "\n".join(kinds)
        + "\n"
    )


def _report(results: list[Outcome], args: argparse.Namespace) -> str:
    rows = [
        "| scenario | result | events | acked | stored once | notified | twice | figures |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in results:
        figures = "; ".join(f"{k} {v}" for k, v in o.figures.items())
        rows.append(
            f"| {o.name} | {'ok' if o.ok else 'BROKEN: ' + '; '.join(o.problems)} | {o.events} |"
            f" {o.acknowledged} | {o.stored} | {o.notified} | {o.notified_twice} | {figures} |"
        )
    kinds = [
        "| scenario | notifications of | recorded | sent | stale | other held back | twice |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in results:
        for key, c in o.kinds.items():
            kinds.append(
                f"| {o.name} | {KINDS[key]} | {c.notifications} | {c.sent} |"
                f" {c.stale} | {c.other} | {c.twice} |"
            )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (
        "# Chaos results\n\n"
        f"Written by `make chaos` ({when}; {platform.platform()}, "
        f"{platform.python_version()}). Arguments: kills {args.kills}, SIGTERMs {args.stops},"
        f" outage {args.outage}, slow sink {args.slow}s, load {args.sessions} sessions for"
        f" {args.duration} at 20 ticks/s, seed {args.seed}. See RELIABILITY.md for what each"
        " scenario checks.\n\n" + "\n".join(rows) + "\n\n"
        "Notifications by rule kind. The plain rule forwards every event exactly once, in"
        " whatever order the sender's retries bring them, so it never has a stale one. The"
        " lifecycle rule (`resolve: true`, on drops and interventions) notifies about the"
        " alert: a drop older than its alert's newest event is stale for it and sends"
        " nothing. Sent counts notifications delivered at least once; twice, those delivered"
        " more than once.\n\n" + "\n".join(kinds) + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
