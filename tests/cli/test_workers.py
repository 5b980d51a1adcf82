"""`receiver serve --workers 2` on one SQLite file, end to end: the real server, a real HTTP
sink catching the notifications. Every accepted event is stored once (a duplicate is one
whichever worker takes it), routed once and notified once; the timers (escalation steps,
the heartbeat) fire once; each worker answers /readyz and its own /metrics; SIGHUP reaches
every worker; a worker that dies is replaced; SIGTERM stops them all within the grace;
workers that cannot start stop the server with status 1. The first test runs on PostgreSQL
too, where the workers are replicas on one host.

"Once" is read from the store at a point where nothing more can happen: every outbox row
delivered (a send comes only from a row), every escalation chain run out."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from receiver.events import sample
from tests.harness import Receiver, eventually, http_client
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

WORKERS = {"RECEIVER_WORKERS": "2", "RECEIVER_ADMIN": "off"}
EVENTS = 40
GRACE = 3.0
# A worker's name in its /metrics: its counters' creation time, which no two processes share.
CREATED = re.compile(r'^receiver_events_created\{result="accepted"\} (\S+)$', re.M)
EXIT_LIMIT = 20.0  # as tests/test_shutdown.py: the grace, teardown, and a busy machine


def workers_of(server: Receiver) -> list[int]:
    """The pids of the parent's worker processes (not multiprocessing's resource tracker)."""
    assert server.proc is not None
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == server.proc.pid and state != "Z" and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def clients_per_worker(server: Receiver) -> tuple[httpx.Client, httpx.Client]:
    """Two clients, each with a kept-alive connection to another worker (told apart by its
    counters' creation time in /metrics): new connections until both workers answered.
    Each found one is asked again on every round, which keeps it alive and proves it still
    reaches the same worker."""
    found: dict[float, httpx.Client] = {}

    def worker(client: httpx.Client) -> float:
        match = CREATED.search(client.get(f"{server.url}/metrics", timeout=10).text)
        assert match is not None
        return float(match.group(1))

    def both() -> bool:
        for key, client in list(found.items()):
            if worker(client) != key:  # its connection was closed and made again
                del found[key]
                client.close()
        client = httpx.Client()
        key = worker(client)
        if key in found:
            client.close()
        else:
            found[key] = client
        return len(found) == 2

    eventually(both, "a connection to each worker")
    first, second = found.values()
    return first, second


def per_worker(server: Receiver, metric: str) -> dict[float, float]:
    """metric's value in each worker's /metrics, by the worker (its counters' creation time,
    which no two processes share): scraped on a new connection each time, which the kernel
    hands to either worker, until two have answered."""
    seen: dict[float, float] = {}

    def scrape() -> bool:
        text = http_client.get(f"{server.url}/metrics", timeout=10).text
        value = re.search(rf"^{re.escape(metric)} (\S+)$", text, re.M)
        key = CREATED.search(text)
        assert key is not None and value is not None, text[:300]
        seen[float(key.group(1))] = float(value.group(1))
        return len(seen) == 2

    eventually(scrape, "both workers' /metrics")
    return seen


def start(tmp_path: Path, rules: str, db: str | None = None) -> Receiver:
    env = {**WORKERS, "RECEIVER_SHUTDOWN_GRACE": f"{GRACE:g}"}
    return Receiver(tmp_path, rules=rules, env=env, db=db).start()


def notify_rules(sink: HTTPSink) -> str:
    return (
        f'notifiers:\n  hook: "{sink.json_url()}"\n'
        "rules:\n  - name: drops\n    match: {type: score.drop}\n    notify: [hook]\n"
        '    title: "drop {{ id }}"\n    body: "{{ sessionId }}"\n'
    )


def test_each_event_is_stored_routed_and_notified_once_across_two_workers(
    tmp_path: Path, http_sink: HTTPSink, receiver_db: str | None
) -> None:
    """On the SQLite file, and on PostgreSQL (the workers are then replicas on one host)."""
    server = start(tmp_path, notify_rules(http_sink), receiver_db)
    try:
        assert len(workers_of(server)) == 2
        drops = [sample("score.drop", id=f"e{i}", sessionId=f"s{i}") for i in range(EVENTS)]

        # Each event twice at once, one copy through each worker: a kept-alive connection
        # to each (found by the worker's /metrics), one thread each. Which worker the kernel
        # hands a new connection is its choice (under load one worker took all 80 new
        # connections), so the test picks its connections rather than hoping for a spread.
        one, other = clients_per_worker(server)
        try:
            with ThreadPoolExecutor(2) as pool:
                firsts = pool.submit(lambda: [server.send(e, one) for e in drops])
                seconds = pool.submit(lambda: [server.send(e, other) for e in drops])
                answers = [*firsts.result(), *seconds.result()]
        finally:
            one.close()
            other.close()
        by_id: dict[str, list[int]] = {}
        for event, answer in zip([*drops, *drops], answers, strict=True):
            by_id.setdefault(str(event["id"]), []).append(answer.status_code)
        assert all(sorted(codes) == [200, 202] for codes in by_id.values()), by_id

        def all_delivered() -> bool:
            rows = server.query("SELECT state FROM outbox")
            return len(rows) >= EVENTS and all(state == "delivered" for (state,) in rows)

        eventually(all_delivered, "every notification delivered")
        assert server.query("SELECT count(*) FROM events WHERE routed_at IS NOT NULL") == [
            (EVENTS,)
        ]
        rows = server.query("SELECT event_id, attempts FROM outbox ORDER BY event_id")
        assert sorted(rows) == sorted((f"e{i}", 1) for i in range(EVENTS))
        titles = [r.json["title"] for r in http_sink.requests]
        assert sorted(titles) == sorted(f"drop e{i}" for i in range(EVENTS))

        # /readyz from each worker; /metrics per worker: their counts add up.
        for _ in range(4):
            assert server.get("/readyz").status_code == 200
        accepted = per_worker(server, 'receiver_events_total{result="accepted"}')
        duplicates = per_worker(server, 'receiver_events_total{result="duplicate"}')
        assert sum(accepted.values()) == EVENTS and sum(duplicates.values()) == EVENTS
        # Each worker saw each event once: the duplicates crossed between workers.
        for key, count in accepted.items():
            assert count + duplicates[key] == EVENTS, (accepted, duplicates)
    finally:
        server.stop()


TIMER_RULES = """
notifiers:
  chat: "{chat}"
  lead: "{lead}"
heartbeat: {{silent_for: 2s, notify: [chat]}}
escalations:
  wake-someone:
    steps:
      - notify: [chat]
      - after: 2s
        notify: [lead]
rules:
  - name: deep-drop
    match: {{type: score.drop}}
    escalate: wake-someone
    title: "drop {{{{ sessionId }}}}"
    body: "{{{{ score }}}}"
"""


def test_escalation_steps_and_the_heartbeat_fire_once_with_two_workers(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    rules = TIMER_RULES.format(chat=http_sink.json_url("/chat"), lead=http_sink.json_url("/lead"))
    server = start(tmp_path, rules)
    try:
        # Nothing arrives: the heartbeat fires (both workers' timers look, one fires it).
        eventually(
            lambda: any("No events for" in r.json["title"] for r in http_sink.requests),
            "the heartbeat",
        )
        sessions = [f"s{i}" for i in range(6)]
        with ThreadPoolExecutor(6) as pool:
            sent = pool.map(
                lambda s: server.send(sample("score.drop", id=f"e{s}", sessionId=s, score=5)),
                sessions,
            )
            assert all(answer.status_code == 202 for answer in sent)

        def chains_done() -> bool:
            logs = server.query("SELECT log FROM escalations")
            ended = [json.loads(log)[-1]["event"] == "done" for (log,) in logs]
            return len(ended) == len(sessions) and all(ended)

        eventually(chains_done, "every chain to run out")
        eventually(
            lambda: all(s == "delivered" for (s,) in server.query("SELECT state FROM outbox")),
            "every notification delivered",
        )
        steps = server.query(
            "SELECT notifier, count(*) FROM outbox WHERE kind = 'escalation'"
            " GROUP BY notifier ORDER BY notifier"
        )
        assert steps == [("chat", len(sessions)), ("lead", len(sessions))]
        for session in sessions:
            got = [r.path for r in http_sink.requests if r.json["title"] == f"drop {session}"]
            assert sorted(got) == ["/chat", "/lead"], session
        beats = server.query(
            "SELECT title, created_at FROM outbox WHERE event_id = '-' ORDER BY created_at"
        )
        # Fired, resolved by the events, maybe fired again once they stopped: never twice
        # in a row (two workers firing, or resolving, the same silence).
        kinds = ["back" if title == "Events are arriving again" else "fired" for title, _ in beats]
        assert kinds[:2] == ["fired", "back"], beats
        assert all(a != b for a, b in zip(kinds, kinds[1:], strict=False)), beats
    finally:
        server.stop()


def test_sighup_reaches_every_worker_one_that_dies_is_replaced_sigterm_stops_all(
    tmp_path: Path,
) -> None:
    server = start(tmp_path, "rules:\n  - name: all\n    notify: [console]\n")
    first = workers_of(server)
    assert len(first) == 2
    reloads = 'receiver_rules_reloads_total{result="ok"}'
    assert per_worker(server, reloads) and server.proc is not None  # both serve
    os.kill(server.proc.pid, signal.SIGHUP)  # forwarded: each worker reloads its rules
    eventually(lambda: min(per_worker(server, reloads).values()) >= 1, "both to reload")
    assert workers_of(server) == first  # and none died of it
    os.kill(first[0], signal.SIGKILL)
    eventually(lambda: "was killed by SIGKILL" in server.logs(), "the death logged")
    now = eventually(
        lambda: (found := workers_of(server)) and len(found) == 2 and first[0] not in found
        and found, "a replacement",
    )  # fmt: skip
    eventually(lambda: per_worker(server, "receiver_events_routed_total"), "both serving")
    assert server.send(sample("score.drop", id="after")).status_code == 202

    stopped_at = time.monotonic()
    assert server.stop(signal.SIGTERM, timeout=EXIT_LIMIT) == 0
    took = time.monotonic() - stopped_at
    stops = [float(s) for s in re.findall(r"stopped in ([0-9.]+)s; store closed", server.logs())]
    assert len(stops) == 2 and all(s <= GRACE + 1 for s in stops), stops
    [total] = re.findall(r"all workers stopped in ([0-9.]+)s", server.logs())
    assert float(total) <= GRACE + 2 and took < EXIT_LIMIT
    assert not [pid for pid in now if Path(f"/proc/{pid}").exists() and _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_workers_that_keep_failing_to_start_stop_the_server_with_status_1(
    tmp_path: Path,
) -> None:
    server = start(tmp_path, "rules:\n  - name: all\n    notify: [console]\n")
    server.rules.write_text("rules: [not a rule\n")  # a replacement cannot load it
    os.kill(workers_of(server)[0], signal.SIGKILL)
    eventually(lambda: server.proc is not None and server.proc.poll() is not None, "the exit")
    assert server.stop() == 1
    logs = server.logs()
    assert "3 of 3 starts failed in a row" in logs
    assert "workers keep failing to start; stopping" in logs
