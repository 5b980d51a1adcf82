"""python -m tests.sim [--seeds N] [--seed N] [--replay FILE] [--out DIR]: the simulation.

Runs seeds 0..N-1 (or one seed, or a scenario written by a shrink), each a random rules
file and stream through the real pipeline (tests.sim.run) with the invariants checked
after every step (tests.sim.invariants). A violation prints the seed, the invariant and a
minimized case written under --out; the last line is `sim: N seeds, K violations`, and
the exit status is 1 when K > 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.sim import agree, backtest, pgtier
from tests.sim.generate import Scenario, scenario
from tests.sim.invariants import Violation, check
from tests.sim.run import Run, run_scenario
from tests.sim.shrink import shrink, write


def violation(s: Scenario, *, through: bool = False) -> Violation | None:
    """The invariant the scenario breaks first (None: none); one seed in agree.EVERY is
    also run on the memory store (stores agree), and two in backtest.EVERY replayed by
    `receiver backtest`'s code (backtest is the server). through: run to the end whatever breaks
    (what a clean run costs: --through)."""
    states: list[tuple[list[Any], list[Any]]] = []
    first: list[Violation] = []

    async def checker(run: Run, final: bool, routed: list[str]) -> None:
        try:
            await check(run, final, routed)
        except Violation as found:
            if not through:
                raise
            first.append(found)
        if final:
            states.append(agree.final_state(run))

    try:
        run = run_scenario(s, checker)
        if s.seed % agree.EVERY == 0 or pgtier.SERVER:
            agree.stores_agree(s, (run, states[0]))
        if pgtier.SERVER:
            pgtier.postgres_agrees(s, states[0])
        if s.seed % backtest.EVERY in backtest.ON:
            backtest.backtest_is_the_server(s)
    except Violation as found:
        return found
    return first[0] if first else None


# The order failures are reported and minimized in: a lost alert before a wrong word.
RANK = {
    name: i
    for i, name in enumerate(
        [
            "nothing vanishes", "every open alert is accounted for", "once",
            "resolved reaches who was paged", "wake exactly what was held",
            "nothing is sent while silenced", "pages are filed under their chain's starter",
            "backtest is the server", "stores agree", "explain is true",
        ]
    )
}  # fmt: skip


def _seed(seed: int, through: bool = False) -> tuple[int, Violation | None]:
    logging.disable(logging.WARNING)
    return seed, violation(scenario(seed), through=through)


def _seed_through(seed: int) -> tuple[int, Violation | None]:
    return _seed(seed, True)


def seeds(
    first: int, count: int, jobs: int, through: bool = False
) -> Iterator[tuple[int, Violation | None]]:
    """Each seed's first violation (or None), in seed order; jobs processes at once."""
    one = _seed_through if through else _seed
    if jobs <= 1 or count < 2:
        yield from map(one, range(first, first + count))
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap(one, range(first, first + count), chunksize=4)


def report(s: Scenario, found: Violation, out: Path, minimize: bool) -> None:
    print(f"seed {s.seed}: {found.invariant}: {found.detail}")
    if not minimize:
        return
    kind = found.kind

    def fails(candidate: Scenario) -> bool:
        again = violation(candidate)
        return again is not None and again.kind == kind

    small = shrink(s, fails)
    last = violation(small) or found
    files = write(small, out, found.invariant, last.detail)
    print(f"  minimized to {len(small.ops)} operations: {last.detail}")
    print(f"  replay: make sim SEED={s.seed}  (or python -m tests.sim --replay {files[-1]})")
    for path in files[:-1]:
        print(f"  {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=300, help="run seeds 0..N-1")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--replay", type=Path, help="a scenario file a shrink wrote")
    parser.add_argument("--out", type=Path, default=Path("sim-failures"))
    parser.add_argument("--no-shrink", action="store_true", help="report without minimizing")
    parser.add_argument("--trace", action="store_true", help="print the run's trace")
    parser.add_argument(
        "--through", action="store_true", help="run every seed to its end (to time it)"
    )
    parser.add_argument(
        "--minimize", type=int, default=8, help="kinds of failure to minimize (default 8)"
    )
    parser.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)"
    )
    parser.add_argument(
        "--pg", action="store_true", help="also on PostgreSQL (a server of its own; make sim PG=1)"
    )
    args = parser.parse_args(argv)
    if args.pg:
        pgtier.start()
        try:
            return _main(args)
        finally:
            pgtier.stop()
    return _main(args)


def _main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)  # the receiver's own warnings (template fallbacks)
    started, broken = time.perf_counter(), 0
    if args.replay is not None or args.seed is not None:
        if args.replay is not None:
            one = Scenario.load(json.loads(args.replay.read_text()))
        else:
            one = scenario(args.seed)
        if args.trace:
            print("\n".join(run_scenario(one).trace))
        count, found = 1, violation(one)
        if found is not None:
            broken = 1
            report(one, found, args.out, minimize=not args.no_shrink)
    else:
        count = args.seeds
        drawn = seeds(args.first, count, args.jobs, args.through)
        failed = [(s, f) for s, f in drawn if f is not None]
        failed.sort(key=lambda found: (RANK.get(found[1].invariant, len(RANK)), found[0]))
        print(f"{count} seeds run in {time.perf_counter() - started:.1f}s")
        kinds: set[str] = set()
        for seed, found in failed:
            broken += 1
            # The first seed of each kind of failure is minimized (up to --minimize); the
            # others are listed: `make sim SEED=N` minimizes any one of them.
            new = found.kind not in kinds and len(kinds) < args.minimize
            kinds.add(found.kind)
            report(scenario(seed), found, args.out, minimize=new and not args.no_shrink)
    took = time.perf_counter() - started
    print(f"{took:.1f}s, {took / max(count, 1) * 1000:.0f} ms a seed")
    print(f"sim: {count} seeds, {broken} violations")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
