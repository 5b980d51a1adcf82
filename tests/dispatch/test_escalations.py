"""Escalation chains on a clock the test drives (the real app under uvicorn, a real SQLite
file, an HTTP sink with one path a notifier): every step and round at its time and no
sooner, reack, ack and snooze, a reload beside a running chain, a silence in the middle of
one, schedules handing off between steps, and a step whose notifier a reload removed.

"Nothing came" is read twice: from the chain's row (its next_at says when it can fire at
all) and from the sink after a short settle (quiet())."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from receiver.cli import cli
from receiver.rules.schedules import who
from tests.dispatch.test_lifecycle import T0, event, quiet
from tests.harness import FakeClock, InProcessReceiver, eventually
from tests.servers import HTTPSink, Request

pytestmark = pytest.mark.e2e

START = T0.timestamp()  # a Monday, 10:00 UTC
WAIT = 30.0  # seconds a wait may take on a busy machine; each ends as soon as it holds

NOTIFIERS = """
notifiers:
  chat: "{url}/chat"
  lead: "{url}/lead"
  boss: "{url}/boss"
"""
THREE_STEPS = """
escalations:
  page:
    steps:
      - notify: [chat]
      - after: 5m
        notify: [lead]
      - after: 10m
        notify: [boss]
{extra}
rules:
  - name: drop
    match: {{type: score.drop}}
    escalate: page
    title: "paged {{{{ sessionId }}}}"
"""


def three_steps(sink: HTTPSink, extra: str = "") -> str:
    """chat at once, lead 5m later, boss 10m after that; extra: policy keys (repeat...)."""
    return NOTIFIERS.format(url=base(sink)) + THREE_STEPS.format(extra=extra)


def base(sink: HTTPSink) -> str:
    return sink.json_url("").rstrip("/")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


def chain(server: InProcessReceiver, alert: str = "session:s1") -> dict[str, Any]:
    """The alert's (first episode's) chain: step, round, next_at and its log."""
    [(step, round_, next_at, log)] = server_query(
        server, "SELECT step, round, next_at, log FROM escalations WHERE alert = ?", (alert,)
    )
    return {"step": step, "round": round_, "next_at": next_at, "log": json.loads(log)}


def server_query(server: InProcessReceiver, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    import sqlite3

    with sqlite3.connect(server.db) as conn:
        return conn.execute(sql, params).fetchall()


def logged(server: InProcessReceiver, alert: str = "session:s1") -> list[str]:
    return [entry["event"] for entry in chain(server, alert)["log"]]


def wait_logged(
    server: InProcessReceiver, what: str, count: int = 1, alert: str = "session:s1"
) -> dict[str, Any]:
    """The chain once its log holds count entries of event `what`."""
    eventually(lambda: logged(server, alert).count(what) >= count, f'{count} "{what}" in the log')
    return chain(server, alert)


def paged(server: InProcessReceiver, alert: str = "session:s1") -> list[tuple[Any, ...]]:
    """(seconds after START, step, round, to) of every "paged" entry of the chain's log."""
    return [
        (e["at"] - START, e["step"], e["round"], e["to"])
        for e in chain(server, alert)["log"]
        if e["event"] == "paged"
    ]


def pages(server: InProcessReceiver) -> list[tuple[str, str]]:
    """(notifier, state) of each of the chains' outbox rows, oldest first."""
    sql = "SELECT notifier, state FROM outbox WHERE kind = 'escalation' ORDER BY id"
    return [(str(n), str(s)) for n, s in server_query(server, sql)]


def to(sink: HTTPSink, count: int) -> list[str]:
    """The paths (the notifiers) of the sink's first count requests, once they arrived."""
    return [r.path.strip("/") for r in sink.wait_for(count, timeout=WAIT)]


def advance_to(clock: FakeClock, offset: float) -> None:
    """Move the fake clock to START + offset."""
    clock.advance(START + offset - clock.now)


def writer_key(server: InProcessReceiver) -> str:
    out = CliRunner().invoke(
        cli,
        ["keys", "create", "--db", str(server.db), "--name", "oncall", "--plan", "enterprise",
         "--role", "writer", "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    return str(json.loads(out.output)["key"])


def act(server: InProcessReceiver, action: str, body: dict[str, str] | None = None) -> str:
    """ack / snooze session:s1 through the API (its clock is the fake one); the message."""
    answer = httpx.post(
        f"{server.url}/v1/alerts/session:s1/{action}",
        headers={"Authorization": f"Bearer {writer_key(server)}"},
        json=body,
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == "done", answer.json()
    return str(answer.json()["message"])


def acked_by(server: InProcessReceiver) -> str | None:
    """Who `receiver alerts` says acknowledged session:s1 (None: nobody)."""
    out = CliRunner().invoke(cli, ["alerts", "--db", str(server.db), "--json"])
    assert out.exit_code == 0, out.output
    [alert] = [a for a in json.loads(out.output) if a["id"] == "session:s1"]
    return None if alert["acked"] is None else alert["acked"]["by"]  # type: ignore[no-any-return]


def reload(server: InProcessReceiver, rules: str) -> None:
    """Replace the rules file as an editor does, and wait for the watcher to load it."""
    holder = server.clock.apps[0].state.rules
    before = holder.current.digest
    fresh = server.rules.with_name("rules.yaml.new")
    fresh.write_text(rules)
    os.replace(fresh, server.rules)
    eventually(lambda: holder.current.digest != before, "the reload", timeout=60)
    assert holder.last_error is None, holder.last_error


def message(request: Request) -> str:
    return str(request.json["message"])


def test_three_steps_repeat_once_then_stop(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(three_steps(http_sink, "    repeat: 1"))
    server.send(event("score.drop", "e1", 0, session="s1"))
    assert to(http_sink, 1) == ["chat"]
    # Each step at its time and not a second before; a round starts the last step's after
    # (10m) after the last step.
    for offset, wanted in [(300, "lead"), (900, "boss"), (1500, "chat"), (1800, "lead"),
                           (2400, "boss")]:  # fmt: skip
        sent = len(http_sink.requests)
        advance_to(clock, offset - 1)
        quiet(http_sink, sent, 0.3)
        assert chain(server)["next_at"] == START + offset
        advance_to(clock, offset)
        assert to(http_sink, sent + 1)[-1] == wanted
    done = wait_logged(server, "done")
    assert done["next_at"] is None
    assert [e["event"] for e in done["log"]] == ["started"] + ["paged"] * 6 + ["done"]
    assert paged(server) == [
        (0, 1, 1, ["chat"]), (300, 2, 1, ["lead"]), (900, 3, 1, ["boss"]),
        (1500, 1, 2, ["chat"]), (1800, 2, 2, ["lead"]), (2400, 3, 2, ["boss"]),
    ]  # fmt: skip
    messages = [message(r) for r in http_sink.requests]
    assert "escalation page: step 2 of 3, round 1 of 2" in messages[1]
    assert "escalation page: step 3 of 3, round 2 of 2" in messages[5]
    advance_to(clock, 10 * 3600)
    quiet(http_sink, 6)


def test_reack_pages_the_current_step_again_then_goes_on(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(three_steps(http_sink, "    reack: 30m"))
    server.send(event("score.drop", "e1", 0, session="s1"))
    assert to(http_sink, 1) == ["chat"]
    advance_to(clock, 60)
    act(server, "ack")
    clock.advance(0)  # the timers look at once
    acked = wait_logged(server, "acked")
    assert acked["next_at"] == START + 60 + 1800  # the reack: not step 2's 300
    assert acked_by(server) == "oncall"
    advance_to(clock, 300)  # step 2's time: acknowledged, so nothing
    quiet(http_sink, 1)
    advance_to(clock, 60 + 1800 - 1)
    quiet(http_sink, 1, 0.3)
    assert acked_by(server) == "oncall"

    advance_to(clock, 60 + 1800)  # the ack is 30m old and the alert still open
    assert to(http_sink, 2) == ["chat", "chat"]
    again = message(http_sink.requests[1])
    assert "step 1 of 3; paged again: the acknowledgement ran out" in again
    assert acked_by(server) is None
    actions = server_query(server, "SELECT action, source, actor FROM alert_actions ORDER BY id")
    assert actions == [("ack", "api", "oncall"), ("unack", "escalation", "reack 30m")]
    assert chain(server)["next_at"] == START + 1860 + 300  # step 2, after from now

    advance_to(clock, 1860 + 300)
    assert to(http_sink, 3)[-1] == "lead"
    advance_to(clock, 1860 + 300 + 600)
    assert to(http_sink, 4)[-1] == "boss"
    done = wait_logged(server, "done")
    assert [e["event"] for e in done["log"]] == [
        "started", "paged", "acked", "reack", "paged", "paged", "paged", "done",
    ]  # fmt: skip
    assert paged(server) == [
        (0, 1, 1, ["chat"]), (1860, 1, 1, ["chat"]), (2160, 2, 1, ["lead"]),
        (2760, 3, 1, ["boss"]),
    ]  # fmt: skip
    advance_to(clock, 10 * 3600)
    quiet(http_sink, 4)


def test_an_ack_without_reack_stops_the_chain_for_good(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(three_steps(http_sink, "    repeat: 2"))
    server.send(event("score.drop", "e1", 0, session="s1"))
    assert to(http_sink, 1) == ["chat"]
    advance_to(clock, 60)
    act(server, "ack")
    clock.advance(0)
    acked = wait_logged(server, "acked")
    assert acked["next_at"] is None
    for hours in (1, 5, 24, 24 * 7):  # past every step of every round, and far beyond
        advance_to(clock, hours * 3600)
    quiet(http_sink, 1)
    assert logged(server) == ["started", "paged", "acked"]
    assert acked_by(server) == "oncall"


def test_a_snooze_puts_the_next_step_off_to_its_end(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(three_steps(http_sink))
    server.send(event("score.drop", "e1", 0, session="s1"))
    assert to(http_sink, 1) == ["chat"]
    wait_logged(server, "paged")
    advance_to(clock, 60)
    assert act(server, "snooze", {"for": "1h"}) == "session:s1 snoozed for 1h"
    assert chain(server)["next_at"] == START + 60 + 3600
    advance_to(clock, 300)  # step 2's time without the snooze
    quiet(http_sink, 1)
    advance_to(clock, 3660 - 1)
    quiet(http_sink, 1, 0.3)
    advance_to(clock, 3660)  # the snooze ends: the chain goes on where it was
    assert to(http_sink, 2) == ["chat", "lead"]
    assert "step 2 of 3" in message(http_sink.requests[1])
    advance_to(clock, 3660 + 600)
    assert to(http_sink, 3)[-1] == "boss"
    wait_logged(server, "done")
    assert paged(server) == [(0, 1, 1, ["chat"]), (3660, 2, 1, ["lead"]), (4260, 3, 1, ["boss"])]


TWO_STEPS_TO_BOSS = """
escalations:
  page:
    steps:
      - notify: [boss]
      - after: 2m
        notify: [chat]
rules:
  - name: drop
    match: {type: score.drop}
    escalate: page
    title: "paged {{ sessionId }}"
"""


def titled(sink: HTTPSink, session: str) -> list[str]:
    """The paths of the sink's requests about session, in order."""
    return [r.path.strip("/") for r in sink.requests if r.json["title"] == f"paged {session}"]


def test_a_reload_keeps_a_running_chain_on_its_frozen_policy(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(three_steps(http_sink))
    server.send(event("score.drop", "e1", 0, session="s1"))
    http_sink.wait_for(1, timeout=WAIT)
    # The same policy name, other targets and delays, and one step fewer.
    reload(server, NOTIFIERS.format(url=base(http_sink)) + TWO_STEPS_TO_BOSS)
    advance_to(clock, 60)
    server.send(event("score.drop", "e2", 1, session="s2"))
    http_sink.wait_for(2, timeout=WAIT)
    assert titled(http_sink, "s2") == ["boss"]  # a new alert: the new policy
    advance_to(clock, 180)
    http_sink.wait_for(3, timeout=WAIT)
    assert titled(http_sink, "s2") == ["boss", "chat"]
    assert titled(http_sink, "s1") == ["chat"]  # its step 2 is at 5m, as frozen
    advance_to(clock, 300)
    http_sink.wait_for(4, timeout=WAIT)
    assert titled(http_sink, "s1") == ["chat", "lead"]  # the frozen step 2, not the new one
    advance_to(clock, 900)
    http_sink.wait_for(5, timeout=WAIT)
    assert titled(http_sink, "s1") == ["chat", "lead", "boss"]
    assert wait_logged(server, "done")["log"][-2]["step"] == 3
    wait_logged(server, "done", alert="session:s2")
    assert paged(server) == [(0, 1, 1, ["chat"]), (300, 2, 1, ["lead"]), (900, 3, 1, ["boss"])]
    assert paged(server, "session:s2") == [(60, 1, 1, ["boss"]), (180, 2, 1, ["chat"])]
    s1 = [message(r) for r in http_sink.requests if r.json["title"] == "paged s1"]
    assert "step 3 of 3" in s1[-1]
    advance_to(clock, 10 * 3600)
    quiet(http_sink, 5)


def test_a_silence_mid_chain_skips_the_step_and_the_chain_starts_again_when_it_ends(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    clock.now = time.time()  # silences are written with the wall clock by the CLI
    began = clock.now
    server = start(three_steps(http_sink))
    server.send(event("score.drop", "e1", 0, session="s1"))
    assert to(http_sink, 1) == ["chat"]
    wait_logged(server, "paged")
    out = CliRunner().invoke(
        cli,
        ["silence", "add", "--db", str(server.db), "--match", "sessionId=s1", "--for", "1h",
         "--reason", "deploy"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    [(starts_at, ends_at)] = server_query(server, "SELECT starts_at, ends_at FROM silences")
    assert began < starts_at < began + 300  # it holds when step 2 falls due

    clock.advance(began + 300 - clock.now)  # step 2's time: silenced
    skipped = wait_logged(server, "skipped")
    assert skipped["log"][-1]["step"] == 2 and "silence #1: deploy" in skipped["log"][-1]["note"]
    assert skipped["next_at"] is None
    quiet(http_sink, 1)
    assert pages(server) == [("chat", "delivered"), ("lead", "silenced")]
    clock.advance(ends_at - 1 - clock.now)  # still silenced: still waiting
    quiet(http_sink, 1, 0.3)

    clock.advance(2)  # the silence expired: step 1 again, saying since when it waited
    assert to(http_sink, 2) == ["chat", "chat"]
    woke = message(http_sink.requests[1])
    assert "step 1 of 3" in woke and "was silenced since" in woke
    resumed = wait_logged(server, "paged", 2)
    assert [e["event"] for e in resumed["log"]] == [
        "started", "paged", "skipped", "resumed", "paged",
    ]  # fmt: skip
    assert resumed["next_at"] == resumed["log"][-1]["at"] + 300
    clock.advance(resumed["next_at"] - clock.now)  # and it goes on from there
    assert to(http_sink, 3)[-1] == "lead"
    assert "was silenced" not in message(http_sink.requests[2])


SCHEDULE = """
notifiers:
  alice: "{url}/alice"
  bob: "{url}/bob"
schedules:
  primary:
    timezone: UTC
    rotation: daily
    handoff: "10:03"
    start: 2026-11-23
    members: [alice, bob]
escalations:
  page:
    steps:
      - notify: [schedule:primary]
      - after: 5m
        notify: [schedule:primary]
rules:
  - name: drop
    match: {{type: score.drop}}
    escalate: page
    title: "paged {{{{ sessionId }}}}"
"""


def test_a_schedule_step_pages_who_is_on_call_at_the_step(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(SCHEDULE.format(url=base(http_sink)))
    primary = server.clock.apps[0].state.rules.current.schedules["primary"]
    # The handoff (10:03) falls between step 1 (10:00) and step 2 (10:05).
    assert (who(primary, START), who(primary, START + 300)) == ("bob", "alice")
    server.send(event("score.drop", "e1", 0, session="s1"))
    assert to(http_sink, 1) == ["bob"]
    advance_to(clock, 300)
    assert to(http_sink, 2) == ["bob", "alice"]
    wait_logged(server, "done")
    assert paged(server) == [(0, 1, 1, ["bob"]), (300, 2, 1, ["alice"])]
    quiet(http_sink, 2)


BOSS_IN_STEP_2 = """
escalations:
  page:
    steps:
      - notify: [chat]
      - after: 5m
        notify: [lead, {last}]
rules:
  - name: drop
    match: {{type: score.drop}}
    escalate: page
    title: "paged {{{{ sessionId }}}}"
"""


def test_a_step_whose_notifier_a_reload_removed_pages_the_others(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    url = base(http_sink)
    server = start(NOTIFIERS.format(url=url) + BOSS_IN_STEP_2.format(last="boss"))
    server.send(event("score.drop", "e1", 0, session="s1"))
    assert to(http_sink, 1) == ["chat"]
    wait_logged(server, "paged")
    without_boss = NOTIFIERS.format(url=url).replace(f'  boss: "{url}/boss"\n', "")
    assert "boss" not in without_boss
    reload(server, without_boss + BOSS_IN_STEP_2.format(last="chat"))
    advance_to(clock, 300)
    assert to(http_sink, 2) == ["chat", "lead"]  # the frozen step: lead, not chat
    done = wait_logged(server, "done")
    step2 = [e for e in done["log"] if e["event"] == "paged"][1]
    assert step2["to"] == ["lead"]
    assert step2["note"] == "no longer defined, not paged: boss"
    delivered = [("chat", "delivered"), ("lead", "delivered")]
    eventually(lambda: pages(server) == delivered, f"{delivered}, not {pages(server)}")
    quiet(http_sink, 2)


TWO_STEPS_REPEAT_REACK = """
escalations:
  page:
    steps:
      - notify: [chat]
      - after: 5m
        notify: [lead]
    repeat: 1
    reack: 30m
rules:
  - name: drop
    match: {type: score.drop}
    escalate: page
    title: "paged {{ sessionId }}"
"""


def test_reack_between_rounds_pages_the_last_step_again_then_the_next_round(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(NOTIFIERS.format(url=base(http_sink)) + TWO_STEPS_REPEAT_REACK)
    server.send(event("score.drop", "e1", 0, session="s1"))
    assert to(http_sink, 1) == ["chat"]
    advance_to(clock, 300)
    assert to(http_sink, 2) == ["chat", "lead"]
    advance_to(clock, 400)  # round 2 is due at 600: acked between rounds
    act(server, "ack")
    clock.advance(0)
    assert wait_logged(server, "acked")["next_at"] == START + 400 + 1800
    advance_to(clock, 600)
    quiet(http_sink, 2)

    advance_to(clock, 2200)  # the ack ran out: the step the chain is at (lead) again
    assert to(http_sink, 3)[-1] == "lead"
    again = message(http_sink.requests[2])
    assert "step 2 of 2, round 1 of 2; paged again: the acknowledgement ran out" in again
    assert chain(server)["next_at"] == START + 2200 + 300  # then round 2, its gap after
    advance_to(clock, 2500)
    assert to(http_sink, 4)[-1] == "chat"
    advance_to(clock, 2800)
    assert to(http_sink, 5)[-1] == "lead"
    wait_logged(server, "done")
    assert paged(server) == [
        (0, 1, 1, ["chat"]), (300, 2, 1, ["lead"]), (2200, 2, 1, ["lead"]),
        (2500, 1, 2, ["chat"]), (2800, 2, 2, ["lead"]),
    ]  # fmt: skip
    advance_to(clock, 10 * 3600)
    quiet(http_sink, 5)


SILENCED_THEN_ACKED = """
escalations:
  page:
    steps:
      - notify: [chat]
      - after: 5m
        notify: [lead]
rules:
  - name: drop
    match: {type: score.drop}
    escalate: page
"""


def test_an_ack_while_silenced_stops_the_chain_once_the_silence_ends(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    """Acked while it waited for a silence, without reack: when the silence ends the chain
    starts, sees the ack and stops, once (it used to resume and stop again every second,
    its log filling with resumed/acked pairs)."""
    clock.now = time.time()  # silences are written with the wall clock by the CLI
    server = start(NOTIFIERS.format(url=base(http_sink)) + SILENCED_THEN_ACKED)
    out = CliRunner().invoke(
        cli,
        ["silence", "add", "--db", str(server.db), "--match", "sessionId=s1", "--for", "10m",
         "--reason", "deploy"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    clock.now = time.time() + 1
    server.send(event("score.drop", "e1", 0, session="s1"))
    server.wait_routed(1)
    assert logged(server) == ["started"] and chain(server)["next_at"] is None
    act(server, "ack")
    clock.advance(11 * 60)  # the silence is over
    wait_logged(server, "acked")
    for _ in range(5):  # the timers look again and again: nothing more happens
        clock.advance(2)
        quiet(http_sink, 0, 0.2)
    assert logged(server) == ["started", "resumed", "acked"]
    [(next_at, since)] = server_query(server, "SELECT next_at, suppressed_since FROM escalations")
    assert next_at is None and since is None


def test_a_chain_that_fails_is_a_failed_attempt_and_the_others_page(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    """A chain row damaged by hand (its policy is no JSON) fails when its step falls due:
    it is logged, counted on /metrics and tried again later; the other chains page as usual,
    and the timers go on."""
    server = start(three_steps(http_sink))
    server.send(event("score.drop", "e1", 0, session="s1"))
    server.send(event("score.drop", "e2", 0, session="s2"))
    assert to(http_sink, 2) == ["chat", "chat"]
    wait_logged(server, "paged", alert="session:s2")
    server_query(server, "UPDATE escalations SET policy = 'not json' WHERE alert = 'session:s1'")
    advance_to(clock, 300)  # both chains' step 2
    assert to(http_sink, 3)[-1] == "lead"  # s2's
    failed = wait_logged(server, "failed")
    assert failed["next_at"] == failed["log"][-1]["at"] + 60  # tried again in a minute
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'receiver_notifications_total{outcome="escalation_failed"} 1.0' in metrics
    advance_to(clock, 900)  # s2's step 3 still comes: the timers did not stop
    assert to(http_sink, 4)[-1] == "boss"
