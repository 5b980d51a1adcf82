"""Escalation end to end, with the real server, an HTTP sink (the team chat) and a real SMTP
server (the lead's mail): a drop pages step one, nobody acks, step two comes after its
delay; a second drop is acked through the link in its first message (GET shows a page and
changes nothing, POST acks) and its step two never comes; a resolve reaches everyone paged;
on two PostgreSQL replicas each step fires once; a kill -9 between steps loses none.

"Never comes" is read from the store, not from a wait: once the chain's log says it was
acknowledged and its next_at is NULL, no step of it can fire any more."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver.events import sample
from tests.harness import Receiver, eventually
from tests.servers import HTTPSink, SMTPSink

pytestmark = pytest.mark.e2e

STEP = 2  # seconds between steps: the "after: 2s must work"

RULES = """
notifiers:
  team-chat: "{chat}"
  lead-mail: "{mail}"
escalations:
  wake-someone:
    steps:
      - notify: [team-chat]
      - after: {step}s
        notify: [lead-mail]
  patient:  # the same, with time to follow a link first (however busy the machine)
    steps:
      - notify: [team-chat]
      - after: 10m
        notify: [lead-mail]
rules:
  - name: deep-drop
    match: {{type: score.drop, score: {{lt: 10}}}}
    escalate: wake-someone
    title: &title "drop {{{{ sessionId }}}}"
    body: &body |
      score {{{{ score }}}}
      {{% if links.ack %}}Ack: {{{{ links.ack }}}}{{% endif %}}
  - name: drop
    match: {{type: score.drop, score: {{lt: 20}}}}
    escalate: patient
    title: *title
    body: *body
"""


def rules(http_sink: HTTPSink, smtp_sink: SMTPSink, step: int = STEP) -> str:
    return RULES.format(chat=http_sink.json_url(), mail=smtp_sink.mailto_url(), step=step)


def chain(server: Receiver, alert: str) -> tuple[Any, list[dict[str, Any]]]:
    [(next_at, log)] = server.query(
        "SELECT next_at, log FROM escalations WHERE alert = ?", (alert,)
    )
    return next_at, json.loads(log)


def events(server: Receiver, alert: str) -> list[str]:
    """The chain's log, by event; none while its drop is not routed yet (the replicas
    route as they come, so a wait may look before the chain exists)."""
    if not server.query("SELECT 1 FROM escalations WHERE alert = ?", (alert,)):
        return []
    return [entry["event"] for entry in chain(server, alert)[1]]


def chat_for(http_sink: HTTPSink, session: str) -> list[str]:
    return [r.json["message"] for r in http_sink.requests if f"drop {session}" in r.json["title"]]


def mail_for(smtp_sink: SMTPSink, session: str) -> list[Any]:
    return [m for m in smtp_sink.messages if session in m.subject]


def test_unacked_pages_the_next_step_acked_does_not_and_resolve_reaches_everyone(
    tmp_path: Path, http_sink: HTTPSink, smtp_sink: SMTPSink
) -> None:
    server = Receiver(tmp_path, rules=rules(http_sink, smtp_sink))
    server.env["RECEIVER_PUBLIC_URL"] = server.url
    server.start()
    try:
        server.send(sample("score.drop", id="e1", sessionId="s1", score=8))
        server.send(sample("score.drop", id="e2", sessionId="s2", score=15))
        eventually(lambda: chat_for(http_sink, "s1") and chat_for(http_sink, "s2"), "step 1")

        # s2 (its step 2 due in 10 minutes): the ack link in its first message. GET (a mail
        # scanner) changes nothing.
        [message] = chat_for(http_sink, "s2")
        found = re.search(r"Ack: (\S+)", message)
        assert found is not None, message
        shown = httpx.get(found.group(1))
        assert shown.status_code == 200 and 'method="post"' in shown.text
        assert "acked" not in events(server, "session:s2")
        assert httpx.post(found.group(1)).status_code == 200
        eventually(lambda: "acked" in events(server, "session:s2"), "the chain to see the ack")
        next_at, log = chain(server, "session:s2")
        assert next_at is None  # stopped: step 2 can no longer fire

        # s1: nobody acks; its step 2 mails the lead.
        [mail] = eventually(lambda: mail_for(smtp_sink, "s1"), "step 2 of s1")
        assert "step 2 of 2" in mail.body
        _, log = chain(server, "session:s1")
        paged = [e for e in log if e["event"] == "paged"]
        assert [(e["step"], e["to"]) for e in paged] == [(1, ["team-chat"]), (2, ["lead-mail"])]
        assert paged[1]["at"] - paged[0]["at"] >= STEP
        assert not mail_for(smtp_sink, "s2")  # s2's step 2 never came

        # Resolve s1: the chat and the lead (everyone paged) get the resolved message.
        server.send(sample("score.recover", id="e3", sessionId="s1", score=70))
        eventually(
            lambda: any("resolved" in r.json["title"].lower() for r in http_sink.requests),
            "the resolved message in the chat",
        )
        eventually(
            lambda: any("resolved" in m.subject.lower() for m in mail_for(smtp_sink, "s1")),
            "the resolved mail",
        )
        assert events(server, "session:s1")[-1] == "ended"
        sources = server.query("SELECT action, source FROM alert_actions")
        assert sources == [("ack", "link")]

        # The API tells the same: who was paged at each step, and where each chain is.
        key = server.make_key("ops")
        [done] = server.get("/v1/alerts/session:s1", key).json()["escalations"]
        assert (done["policy"], done["status"], done["steps"]) == ("wake-someone", "ended", 2)
        pages = [(e["step"], e["to"]) for e in done["log"] if e["event"] == "paged"]
        assert pages == [(1, ["team-chat"]), (2, ["lead-mail"])]
        [stopped] = server.get("/v1/alerts/session:s2", key).json()["escalations"]
        assert (stopped["policy"], stopped["status"], stopped["nextAt"]) == (
            "patient",
            "acked",
            None,
        )
    finally:
        server.stop()


def test_a_kill_between_steps_loses_none(
    tmp_path: Path, http_sink: HTTPSink, smtp_sink: SMTPSink
) -> None:
    # Step 2 comes 8 s after step 1: room for a busy machine to stall this test between
    # seeing step 1 and the kill (3 s was not, under a full suite beside it).
    server = Receiver(tmp_path, rules=rules(http_sink, smtp_sink, step=8)).start()
    server.send(sample("score.drop", id="e1", sessionId="s1", score=8))
    eventually(lambda: chat_for(http_sink, "s1"), "step 1")
    eventually(lambda: "paged" in events(server, "session:s1"), "step 1 in the log")
    # Step 1's send recorded too: killed between the sink's answer and that record, the
    # server rightly sends step 1 again once its lease runs out (at least once), and the
    # count below saw two (once in two full-suite runs here). test_faults.py covers that.
    step1 = "SELECT state FROM outbox WHERE kind = 'escalation' AND notifier = 'team-chat'"
    eventually(lambda: server.query(step1) == [("delivered",)], "step 1's send recorded")
    server.kill()  # kill -9 before step 2 is due
    [(due,)] = server.query("SELECT next_at FROM escalations")
    assert due is not None and not mail_for(smtp_sink, "s1"), "step 2 fired before the kill"
    while time.time() < due + 0.5:  # step 2 falls due while nothing runs
        time.sleep(0.1)
    server.start()
    try:
        [mail] = eventually(lambda: mail_for(smtp_sink, "s1"), "step 2 after the restart")
        assert "step 2 of 2" in mail.body
        eventually(lambda: "done" in events(server, "session:s1"), "the chain to run out")
        assert len(chat_for(http_sink, "s1")) == 1 and len(mail_for(smtp_sink, "s1")) == 1
    finally:
        server.stop()


def test_two_postgres_replicas_fire_each_step_once(
    tmp_path: Path, http_sink: HTTPSink, smtp_sink: SMTPSink, pg_url: str
) -> None:
    text = rules(http_sink, smtp_sink)
    replicas = [
        Receiver(tmp_path / name, rules=text, db=pg_url)
        for name in ("a", "b")
        if (tmp_path / name).mkdir() is None
    ]
    for replica in replicas:
        replica.start()
    try:
        sessions = [f"s{i}" for i in range(6)]
        for i, session in enumerate(sessions):  # senders reach either replica
            replicas[i % 2].send(sample("score.drop", id=f"e{i}", sessionId=session, score=5))
        for session in sessions:
            eventually(
                lambda s=session: "done" in events(replicas[0], f"session:{s}"),
                f"the chain of {session} to run out",
                timeout=60,
            )
        eventually(lambda: len(smtp_sink.messages) >= len(sessions), "every step 2")
        for session in sessions:
            assert len(chat_for(http_sink, session)) == 1, session
            assert len(mail_for(smtp_sink, session)) == 1, session
        rows = replicas[0].query(
            "SELECT notifier, count(*) FROM outbox WHERE kind = 'escalation'"
            " GROUP BY notifier ORDER BY notifier"
        )
        assert rows == [("lead-mail", len(sessions)), ("team-chat", len(sessions))]
    finally:
        for replica in replicas:
            replica.stop()
