"""`receiver backtest` on two cores (each rules file replayed in a process of its own) reports
exactly what one process replaying both does, on a day of events that sets every lifecycle
option to work; and the process beside this one hands back its result or its error."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from receiver.backtest import parallel
from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.store import open_store
from tests.test_backtest import HEADER, START, at, ev, keep

CANDIDATE = """
heartbeat: {silent_for: 20m, notify: [chat]}
escalations:
  wake:
    steps:
      - notify: [hook]
      - after: 10m
        notify: [chat]
inhibit:
  - name: covered
    source: {type: intervention.fired}
    target: {type: score.drop, context: browse}
    equal: [sessionId]
rules:
  - name: deep
    match: {type: score.drop, score: {lt: 10}}
    notify: hook
    hold: 2m
    resolve: true
    repeat: 30m
    continue: true
  - name: checkout
    match: {type: score.drop, context: checkout}
    notify: chat
    throttle: {key: "{{ userId }}", every: 30m}
    continue: true
  - name: digest
    match: {type: score.drop}
    notify: chat
    group: {by: [context], wait: 10m, max: 20}
    continue: true
  - name: stuck
    match: {type: score.drop, context: search}
    escalate: wake
  - name: interventions
    match: {type: intervention.fired}
    notify: hook
    resolve: true
    active: {days: [mon], hours: "12:00-18:00", tz: UTC, defer: true}
  - name: stopped
    match: {type: session.stopped}
    notify: hook
    storm: {max: 3, per: 10m}
"""

CURRENT = """
rules:
  - name: drops
    match: {type: score.drop, score: {lt: 30}}
    notify: hook
    resolve: true
    throttle: {key: "{{ sessionId }}", every: 15m}
  - name: interventions
    match: {type: intervention.fired}
    notify: chat
"""


def day_of_events(count: int = 700, seed: int = 33) -> list[dict[str, Any]]:
    """Sessions dropping and recovering over a day, interventions fired and resolved, stops;
    some quiet hours (the heartbeat fires) and some deep drops sent an hour late (stale)."""
    rng = random.Random(seed)
    kinds = ["score.drop"] * 4 + ["score.recover"] * 3
    kinds += ["intervention.fired", "intervention.resolved", "session.stopped"]
    stream, minute = [], 0.0
    fired: dict[str, int] = {}
    for n in range(count):
        minute += rng.expovariate(1.5) + (90 if n % 200 == 199 else 0)
        session = f"s{rng.randrange(25)}"
        late = n % 37 == 36
        kind = "score.drop" if late else rng.choice(kinds)
        fields: dict[str, Any] = {}
        if kind == "score.drop":
            context = rng.choice(["checkout", "browse", "search"])
            fields = {"score": 5 if late else rng.randrange(0, 40), "context": context}
        if kind.startswith("intervention."):
            if kind == "intervention.fired":
                fired[session] = fired.get(session, 0) + 1
            fields = {"interventionId": f"iv{session}-{fired.get(session, 0)}"}
        event = ev(kind, f"e{n:05d}", minute - (60 if late else 0), session, **fields)
        event["userId"] = f"u{int(session[1:]) % 6}"
        event["_received"] = at(minute)
        stream.append(event)
    return stream


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """A SQLite store of the day's events and a silence, and the two rules files."""
    where = tmp_path_factory.mktemp("parallel")
    db = str(where / "receiver.db")
    clock = [START]

    async def build() -> None:
        store = open_store(db, clock=lambda: clock[0])
        await store.open()
        try:
            await keep(store, day_of_events(), clock)
            matchers = {"userId": "u2"}
            await store.transact(lambda tx: tx.silences.add(matchers, "test", at(60), at(240)))
        finally:
            await store.close()

    asyncio.run(build())
    candidate, current = where / "new.yaml", where / "now.yaml"
    candidate.write_text(HEADER + CANDIDATE)
    current.write_text(HEADER + CURRENT)
    return db, candidate, current


def backtest(day: tuple[str, Path, Path], *options: str) -> Result:
    done = CliRunner().invoke(cli, _args(day, *options))
    assert done.exit_code == 0, done.output
    return done


def _args(day: tuple[str, Path, Path], *options: str) -> list[str]:
    db, candidate, current = day
    args = ["backtest", str(candidate), "--against", str(current), "--db", db]
    return [*args, "--from", "2026-11-23T10:00Z", "--to", "2026-11-24T10:00Z", *options]


# `receiver backtest` in a process of its own, as an operator runs it: this test process may
# have other tests' threads running, and the command forks only from a process without any.
# It says on stderr how many replays it forked.
_COUNTED = """
import sys
from receiver.backtest import parallel
from receiver.cli import cli
forked = []
class Counted(parallel.Forked):
    def __init__(self, fn):
        forked.append(fn)
        super().__init__(fn)
parallel.Forked = Counted
try:
    cli.main(args=sys.argv[1:], standalone_mode=False)
finally:
    print(f"forked {len(forked)}", file=sys.stderr)
"""


def backtest_alone(day: tuple[str, Path, Path], *options: str) -> tuple[str, int]:
    """The command's output, run in a process of its own, and how many replays it forked."""
    done = subprocess.run(
        [sys.executable, "-c", _COUNTED, *_args(day, *options)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout, int(done.stderr.rsplit("forked ", 1)[1])


def test_two_processes_report_what_one_does(day: tuple[str, Path, Path]) -> None:
    output, forked = backtest_alone(day, "--json", "--jobs", "1")
    assert forked == 0
    one = json.loads(output)
    output, forked = backtest_alone(day, "--json", "--jobs", "2")
    assert forked == 1
    two = json.loads(output)
    assert one.pop("seconds") >= 0 and two.pop("seconds") >= 0
    assert two == one
    # The day sets every option to work, in both files.
    cand, cur = one["candidate"], one["current"]
    assert set(cand["rules"]) == {"deep", "checkout", "digest", "stuck", "interventions",
                                  "stopped", "(heartbeat)"}  # fmt: skip
    suppressed = {r for t in cand["rules"].values() for r in t["suppressed"]}
    assert {"throttled", "grouped", "inhibited", "storm", "silenced", "stale"} <= suppressed
    assert cand["escalations"] and cand["inhibited"] == {"covered": cand["inhibited"]["covered"]}
    assert cur["sent"] > 0 and one["missed_count"] > 0 and one["added_count"] > 0


def test_two_processes_print_the_same_tables(day: tuple[str, Path, Path]) -> None:
    def tables(output: str) -> list[str]:
        return [line for line in output.splitlines() if "replayed in" not in line]

    alone, forked = backtest_alone(day, "--jobs", "2")
    assert forked == 1
    assert tables(alone) == tables(backtest(day, "--jobs", "1").output)


def test_the_process_beside_hands_back_its_result_or_its_error() -> None:
    assert parallel.Forked(lambda: {"sent": 3}).result() == {"sent": 3}

    def refuse() -> None:
        raise ConfigError('undefined notifier "ops"')

    with pytest.raises(ConfigError, match='undefined notifier "ops"'):
        parallel.Forked(refuse).result()
    with pytest.raises(parallel.ReplayProcessError, match=r"died \(exit code 3\)"):
        parallel.Forked(lambda: os._exit(3)).result()


def test_the_process_beside_ends_with_the_one_that_forked_it(tmp_path: Path) -> None:
    # A parent killed outright runs no exit handler: its child must not replay on alone.
    code = (
        "import os, sys, time\n"
        "from receiver.backtest import parallel\n"
        "beside = parallel.Forked(lambda: time.sleep(60))\n"
        "print(beside._process.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        parent.kill()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie, ended but not yet reaped by init, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_no_replay_is_forked_beside_other_threads() -> None:
    """A fork copies the other threads' locks and none of them lives on to let go: with a
    thread beside, `receiver backtest` replays both files in its own process."""
    gate = threading.Event()
    beside = threading.Thread(target=gate.wait, daemon=True)
    beside.start()
    try:
        assert not parallel.can_fork()
    finally:
        gate.set()
        beside.join(5)
