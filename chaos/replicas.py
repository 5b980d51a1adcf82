"""Replicas under faults: receivers on one PostgreSQL, kill -9 of a random one, a crash of
PostgreSQL itself.

    outcome = replicas.run(tmp, faults=Faults(replicas=3, kills=10), load=Load(...))

Starts a throwaway PostgreSQL with fsync and synchronous commit on (tests.pg,
durable=True), `faults.replicas` receivers on one database, and a load balancer
(chaos.balancer) spreading `receiver simulate` over them. Then, under that load:

1. kill -9 a random replica, restart it, again, `faults.kills` times in all;
   halfway through (or after `faults.pg_after` of them),
2. crash PostgreSQL (pg_ctl -m immediate) for `faults.pg_down` seconds while
   probes post fresh events to every replica directly: each must answer 503
   storage_unavailable within a bound, /readyz 503, and stay up; then start it
   again and time how long until every replica (the same processes) answers 202
   and /readyz 200 again; the probes refused meanwhile are sent again, as the
   service would;
3. a burst: several drops of each of a few users, sent at once, each user's
   spread over the replicas.

The checks are scenarios.check's (every acknowledged id stored once, every
notification to send delivered, nothing dead), plus:

- the throttled rule (one notification per user per `faults.throttle_every`) held
  across replicas: notifications sent for one user are at least a window apart,
  and each throttled one falls within a window of a sent one; the burst's users
  got exactly one each;
- deliveries beyond the first (same notification twice) are no more than the
  kills, counting the PostgreSQL crash as one.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from chaos.balancer import Balancer, error_code
from chaos.load import (
    ENV,
    RULES,
    Load,
    finish_simulator,
    start_simulator,
    wait_for_load,
)
from chaos.promise import Outcome, check
from chaos.replica_checks import Crash, Faults, duplicates, throttle_check
from tests.harness import Receiver
from tests.pg import ThrowawayPostgres
from tests.servers import HTTPSink

# scenarios.RULES with a throttled rule before the lifecycle rule: at most one notification
# per user and window, whichever replica routes the user's drops.
PER_USER = """  - name: per-user
    match: {{type: [score.drop]}}
    notify: [sink]
    title: "throttle {{{{ id }}}}"
    body: "{{{{ userId }}}}"
    throttle: {{key: "{{{{ userId }}}}", every: {every}}}
    continue: true
"""
RULES_REPLICAS = RULES.replace("  - name: alerts\n", PER_USER + "  - name: alerts\n")
assert RULES_REPLICAS != RULES

ANSWER_BOUND = 15.0  # seconds: a replica slower than this to answer during the outage hangs


@dataclass
class _Sent:
    """Events the scenario posts itself (probes, burst): id -> body, and its best outcome."""

    outcomes: dict[str, str] = field(default_factory=dict)
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0

    def new_drop(self, user: str) -> dict[str, Any]:
        with self.lock:
            self.count += 1
            n = self.count
        event = {
            "id": f"evt_chaos_{n:05d}",
            "type": "score.drop",
            "sessionId": f"sess_chaos_{n:05d}",
            "userId": user,
            "score": 20,
            "threshold": 40,
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        self.events[event["id"]] = event
        return event

    def send(self, server: Receiver, event: dict[str, Any], timeout: float = 30) -> Any:
        """(status, error code, seconds); status None when no answer came."""
        began = time.monotonic()
        status, code = None, "no answer"
        try:
            response = server.send(event)
            status = response.status_code
            code = error_code(response)
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        took = time.monotonic() - began
        outcome = {202: "accepted", 200: "duplicate"}.get(status or 0, "failed")
        with self.lock:
            if self.outcomes.get(event["id"]) in (None, "failed"):
                self.outcomes[event["id"]] = outcome
        return status, code, took


def run(tmp: Path, *, faults: Faults, load: Load) -> Outcome:
    """The replica scenario (see the module's docstring)."""
    started = time.monotonic()
    outcome = Outcome("replicas")
    record = tmp / "record.tsv"
    rng = random.Random(load.seed)
    postgres = ThrowawayPostgres(durable=True, own=True)
    sink = HTTPSink()
    servers: list[Receiver] = []
    balancer: Balancer | None = None
    sim = None
    sent = _Sent()
    figures: dict[str, Any] = {"replicas": faults.replicas, "kills": faults.kills}
    restarts: list[float] = []
    crashes: list[Crash] = []
    try:
        postgres.start()
        url = postgres.create_database()
        sink.start()
        rules = RULES_REPLICAS.format(url=sink.json_url("/n"), every=f"{faults.throttle_every:g}s")
        for i in range(faults.replicas):
            folder = tmp / f"replica{i}"
            folder.mkdir()
            timeout = f"{faults.notify_timeout:g}"
            env = {**ENV, "RECEIVER_NOTIFY_TIMEOUT": timeout, "RECEIVER_WEBHOOK_TIMEOUT": timeout}
            servers.append(Receiver(folder, rules=rules, env=env, db=url))
        for server in servers:
            server.start()
        balancer = Balancer([s.url for s in servers]).start()
        sim = start_simulator(balancer.url, load, record)
        wait_for_load(servers[0], sim)  # the replicas share one database
        first = faults.kills // 2 if faults.pg_after is None else faults.pg_after
        restarts += _kill_random(servers, first, rng, faults.gap, crashes)
        if faults.pg_down > 0:
            figures.update(_pg_crash(postgres, servers, balancer, sent, faults, outcome, crashes))
        restarts += _kill_random(servers, faults.kills - first, rng, faults.gap, crashes)
        burst = _burst(servers, sent, faults, outcome)
        summary = finish_simulator(sim, timeout=load.duration + load.max_wait + 120)
        sim = None
        check(outcome, servers[0], sink, summary, record, settle=faults.settle, extra=sent.outcomes)
        figures.update(throttle_check(servers[0], sink, faults, burst, outcome))
        # Sends that failed and were retried (a timeout: the sink may have had it already).
        figures["sends_retried"] = sum(s.logs().count("failed (attempt") for s in servers)
        figures.update(duplicates(sink, crashes, figures["sends_retried"], faults, outcome))
        figures["requests_per_replica"] = "/".join(
            str(balancer.per_replica()[i]) for i in range(faults.replicas)
        )
        figures["sender_errors"] = dict(summary.get("errors") or {})
        dead = [i for i, s in enumerate(servers) if s.proc is None or s.proc.poll() is not None]
        if dead:
            outcome.problems.append(f"replicas {dead} were not running at the end")
    finally:
        if sim is not None:
            sim.kill()
            sim.communicate()
        if balancer is not None:
            balancer.stop()
        for server in servers:
            if server.proc is not None:
                try:
                    server.stop()
                except AssertionError as exc:
                    outcome.problems.append(str(exc).splitlines()[0])
        sink.stop()
        with contextlib.suppress(RuntimeError):
            postgres.stop()
    figures["restart_s_max"] = round(max(restarts, default=0), 2)
    figures["restart_s_mean"] = round(sum(restarts) / max(1, len(restarts)), 2)
    outcome.figures = figures
    outcome.elapsed_s = round(time.monotonic() - started, 1)
    return outcome


def _kill_random(
    servers: list[Receiver],
    kills: int,
    rng: random.Random,
    gap: tuple[float, float],
    crashes: list[Crash],
) -> list[float]:
    """kill -9 a random replica and start it again, kills times; the restart times."""
    times = []
    for _ in range(kills):
        time.sleep(rng.uniform(*gap))
        victim = rng.choice(servers)
        crashes.append(Crash(time.monotonic(), time.monotonic(), f"replica {victim.port}"))
        victim.kill()
        began = time.monotonic()
        victim.start()
        times.append(time.monotonic() - began)
    return times


def _pg_crash(
    postgres: ThrowawayPostgres,
    servers: list[Receiver],
    balancer: Balancer,
    sent: _Sent,
    faults: Faults,
    outcome: Outcome,
    crashes: list[Crash],
) -> dict[str, Any]:
    """Crash PostgreSQL under load for faults.pg_down seconds, then start it again."""
    pids = [s.proc.pid if s.proc else None for s in servers]
    answers: list[tuple[int, Any]] = []  # (replica, (status, code, seconds)) of the probes
    ready: list[tuple[int, int | None, float]] = []  # (replica, /readyz status, seconds)
    postgres.kill()
    down_at = time.monotonic()
    until = down_at + faults.pg_down

    def probe(i: int) -> None:
        while time.monotonic() < until:
            answers.append((i, sent.send(servers[i], sent.new_drop(f"user_probe_{i}"))))

    def readyz(i: int) -> None:
        while time.monotonic() < until:
            began = time.monotonic()
            try:
                status: int | None = servers[i].get("/readyz").status_code
            except httpx.HTTPError:
                status = None
            ready.append((i, status, time.monotonic() - began))
            time.sleep(0.5)

    threads = [
        threading.Thread(target=f, args=(i,)) for i in range(len(servers)) for f in (probe, readyz)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    postgres.restart()
    up_at = time.monotonic()
    crashes.append(Crash(down_at, up_at, "postgresql"))
    through_balancer = balancer.statuses(down_at, up_at)
    refused = Counter(f"{status} {code}" for _, (status, code, _) in answers)
    slowest = max((took for _, (_, _, took) in answers), default=0.0)
    probes_503 = refused.pop("503 storage_unavailable", 0)
    if not probes_503:
        outcome.problems.append("no probe was answered 503 storage_unavailable while down")
    if refused:
        outcome.problems.append(f"answers other than 503 storage_unavailable while down: {refused}")
    if slowest > ANSWER_BOUND:
        outcome.problems.append(
            f"a replica took {slowest:.1f}s to answer while PostgreSQL was down"
        )
    not_ready = Counter(status for _, status, _ in ready)
    if set(not_ready) != {503}:
        outcome.problems.append(f"/readyz while PostgreSQL was down: {dict(not_ready)}")
    recovered = _recovered(servers, sent, faults, outcome, up_at, pids)
    return {
        "pg_down_s": round(up_at - down_at, 1),
        "pg_503_probes": probes_503,
        "pg_503_via_balancer": through_balancer.get("503 storage_unavailable", 0),
        "pg_answer_s_max": round(slowest, 1),
        "pg_readyz_503": not_ready.get(503, 0),
        "pg_recovery_s": round(max(recovered.values(), default=float("nan")), 2),
    }


def _recovered(
    servers: list[Receiver],
    sent: _Sent,
    faults: Faults,
    outcome: Outcome,
    up_at: float,
    pids: list[int | None],
) -> dict[int, float]:
    """PostgreSQL back: the same processes take events again, each by itself (replica ->
    seconds it took); then the service sends what was refused again."""
    recovered: dict[int, float] = {}
    deadline = up_at + faults.recover_within
    while len(recovered) < len(servers) and time.monotonic() < deadline:
        for i, server in enumerate(servers):
            if i in recovered:
                continue
            status, _, _ = sent.send(server, sent.new_drop(f"user_probe_{i}"))
            with contextlib.suppress(httpx.HTTPError):
                if status == 202 and server.get("/readyz").status_code == 200:
                    recovered[i] = time.monotonic() - up_at
        time.sleep(0.1)
    missing = [i for i in range(len(servers)) if i not in recovered]
    if missing:
        outcome.problems.append(
            f"replicas {missing} did not take events again within {faults.recover_within:g}s"
        )
    restarted = [i for i, s in enumerate(servers) if s.proc is None or s.proc.pid != pids[i]]
    crashed = [i for i, s in enumerate(servers) if s.proc is not None and s.proc.poll() is not None]
    if restarted or crashed:
        outcome.problems.append(
            f"replicas restarted {restarted} or exited {crashed}: not recovered"
        )
    # The service sends what was refused again, later.
    for event_id, result in list(sent.outcomes.items()):
        if result == "failed":
            for i in range(len(servers)):
                if sent.send(servers[i], sent.events[event_id])[0] in (200, 202):
                    break
    return recovered


def _burst(
    servers: list[Receiver], sent: _Sent, faults: Faults, outcome: Outcome
) -> dict[str, list[str]]:
    """faults.burst_drops drops of each of faults.burst_users users at once, one user's
    spread over every replica; user -> event ids."""
    jobs = []
    for u in range(faults.burst_users):
        user = f"user_burst_{u}"
        for d in range(faults.burst_drops):
            jobs.append((user, (u + d) % len(servers), sent.new_drop(user)))

    def deliver(job: tuple[str, int, dict[str, Any]]) -> bool:
        _, first, event = job
        for n in range(len(servers)):  # another replica if this one is not there
            status, _, _ = sent.send(servers[(first + n) % len(servers)], event)
            if status in (200, 202):
                return True
        return False

    with ThreadPoolExecutor(max_workers=min(64, len(jobs))) as pool:
        delivered = list(pool.map(deliver, jobs))
    if not all(delivered):
        outcome.problems.append(f"{delivered.count(False)} burst drops never acknowledged")
    users: dict[str, list[str]] = defaultdict(list)
    for user, _, event in jobs:
        users[user].append(event["id"])
    return users
