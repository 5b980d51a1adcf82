"""`make chaos`: the fault scenarios at full size; figures to docs/RELIABILITY-RESULTS.md.

    python chaos/run.py                       # 10 kills, 60s outage, the rest
    python chaos/run.py --kills 20 --outage 5m --only crash,outage

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaos import scenarios  # noqa: E402
from chaos.scenarios import Load, Outcome  # noqa: E402
from receiver.rules import parse_duration  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "RELIABILITY-RESULTS.md"
ALL = ("baseline", "crash", "sigterm", "outage", "slow-sink")


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
    args = parser.parse_args()
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
    args.out.write_text(_report(results, args))
    print(f"chaos: wrote {args.out}")
    return 0 if all(r.ok for r in results) else 1


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
                f"| {o.name} | {scenarios.KINDS[key]} | {c.notifications} | {c.sent} |"
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
