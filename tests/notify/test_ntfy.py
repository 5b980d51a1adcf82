"""The ntfy channel (receiver.notify.ntfy): apprise's URL syntax and its problems, the JSON
it publishes, and its sends to the ntfy stand-in (tests/ntfy_server.py, a real local
server following ntfy's publish docs): auth, sequence ids and the clear, retries with
Retry-After, answers capped, secrets never in an error or a shown URL."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from receiver.links import Links
from receiver.notify import ntfy, registry
from receiver.notify.backoff import Backoff
from receiver.notify.episodes import Episode, key_of
from receiver.notify.ntfy import NtfyChannel, NtfyURLError, Target, message, parse
from receiver.rules.notifiers import Notifier
from receiver.store import OutboxRow, Store
from receiver.store.base import Tx
from receiver.store.records import Alert
from tests.ntfy_server import NtfyStandIn
from tests.servers import EndlessAnswer
from tests.store.contract.common import event, note, run

LINKS = Links("k" * 32, base="https://alerts.example.com", ttl=3600, clock=lambda: 1000.0)
SECRET = "s3cr3t-pa55word"
TOKEN = "tk_0123456789abcdefghijklmnopqr"


# -- the URL --------------------------------------------------------------------------------


def test_apprise_url_forms_parse_to_a_server_a_topic_and_auth() -> None:
    basic = "Basic " + base64.b64encode(f"bob:{SECRET}".encode()).decode()
    assert parse("ntfy://h.example/alerts") == Target("http://h.example", "alerts")
    assert parse("ntfys://h.example:8443/alerts?priority=high&tags=db,eu") == Target(
        "https://h.example:8443", "alerts", None, 4, ("db", "eu")
    )
    assert parse(f"ntfys://bob:{SECRET}@h.example/alerts").auth == basic
    assert parse(f"ntfy://h.example/alerts?token={TOKEN}").auth == f"Bearer {TOKEN}"
    assert parse(f"ntfy://{TOKEN}@h.example/alerts").auth == f"Bearer {TOKEN}"
    assert parse("ntfy://alerts") == Target("https://ntfy.sh", "alerts")  # apprise's cloud form
    assert parse("ntfy://h.example/alerts?priority=1").priority == 1


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ntfy://h.example:80", "no topic"),
        (f"ntfy://bob:{SECRET}@h.example", "no topic"),
        ("ntfy://h.example/a/b", "one topic a url"),
        ("ntfy://h.example/bad.topic", "1 to 64 letters"),
        ("ntfy://h.example/" + "t" * 65, "1 to 64 letters"),
        ("ntfy://h.example/a?priority=9", "?priority= is 1 to 5"),
        ("ntfy://bob@h.example/a", "needs its password"),
        ("ntfy://h.example/a?token=", "?token= is empty"),
        ("ntfy://h.example:port/a", "not a valid url"),
    ],
)
def test_receiver_check_names_what_is_wrong_never_the_secret(url: str, said: str) -> None:
    with pytest.raises(NtfyURLError, match=said.replace("?", r"\?")):
        parse(url)
    problem = registry.problem(url, "ntfy")
    assert problem is not None and said in problem
    assert SECRET not in problem and "h.example" not in problem


def test_the_registry_sends_ntfy_urls_here_and_shows_them_without_secrets() -> None:
    for url in ("ntfy://h/a", "NTFYS://h/a", "ntfys://ntfy.sh/alerts"):
        assert registry.channel_of(url) == "ntfy"
    assert registry.channel_of("json://h/a") == "notify"
    assert registry.problem(f"ntfys://bob:{SECRET}@h.example/alerts?token={TOKEN}", "x") is None
    shown = registry.shown(f"ntfys://bob:{SECRET}@h.example/alerts?token={TOKEN}&priority=5")
    assert SECRET not in shown and TOKEN not in shown and "alerts" not in shown
    assert "priority=5" in shown and "h.example" in shown


# -- the JSON -------------------------------------------------------------------------------


def _row(row_id: int = 1, kind: str = "event") -> OutboxRow:
    return OutboxRow(
        row_id, "evt_1", "r", "phone", 0, "Drop", "score 12", "sending", 1, 0, 0, 0, kind=kind
    )


def _episode(**kw: Any) -> Episode:
    values: dict[str, Any] = {
        "alert": "session:s1",
        "episode": 2,
        "state": "open",
        "links": dict(LINKS.for_alert("session:s1", 2)),
    }
    return Episode(**{**values, **kw})


def test_an_open_episode_pages_with_three_buttons_and_its_sequence_id() -> None:
    episode = _episode()
    got = message(
        Target("http://h", "alerts"), _row(), episode, title="Drop", body="score 12",
        sequence=True, now=0.0,
    )  # fmt: skip
    assert got == {
        "topic": "alerts",
        "title": "Drop",
        "message": "score 12",
        "priority": 5,
        "tags": ["rotating_light"],
        "click": episode.links["alert"],
        "actions": [
            {"action": "http", "label": "Ack", "url": episode.links["ack"], "method": "POST",
             "clear": True},
            {"action": "http", "label": "Snooze 1h", "url": episode.links["snooze"],
             "method": "POST", "clear": True},
            {"action": "view", "label": "Open", "url": episode.links["alert"]},
        ],
        "sequence_id": key_of("session:s1", 2),
    }  # fmt: skip


def test_acked_snoozed_resolved_and_plain_messages() -> None:
    target = Target("http://h", "alerts", priority=None, tags=("db",))

    def build(episode: Episode | None, kind: str = "event", **kw: Any) -> dict[str, Any]:
        return message(target, _row(kind=kind), episode, title="T", body="B", now=1000.0, **kw)

    acked = build(_episode(acked_by="alice", acked_at=3600.0), kind="escalation", sequence=True)
    assert acked["message"] == "B\n\nAcknowledged by alice at 01:00 UTC."
    assert acked["priority"] == 3  # someone has it: no longer a page
    assert [a["label"] for a in acked["actions"]] == ["Open"]  # nothing left to press
    snoozed = build(_episode(snoozed_until=4600.0), sequence=True)
    assert snoozed["message"] == "B\n\nSnoozed until 01:16 UTC."
    assert build(_episode(snoozed_until=900.0), sequence=True)["message"] == "B"  # over
    resolved = build(_episode(state="resolved"), kind="resolved", sequence=True)
    assert (resolved["priority"], resolved["tags"], "actions" in resolved) == (
        3, ["white_check_mark", "db"], False
    )  # fmt: skip
    assert resolved["message"] == "B\n\nResolved." and "sequence_id" in resolved
    plain = build(None, sequence=True)  # a digest, a plain rule's message: no episode
    assert plain == {"topic": "alerts", "title": "T", "message": "B", "priority": 3,
                     "tags": ["db"]}  # fmt: skip
    assert "sequence_id" not in build(_episode(), sequence=False)
    no_links = build(_episode(links={}), sequence=True)
    assert "actions" not in no_links and "click" not in no_links
    overridden = message(
        Target("http://h", "a", priority=2), _row(), _episode(), title="T", body="B",
        sequence=True, now=0,
    )  # fmt: skip
    assert overridden["priority"] == 2


# -- sending to the stand-in ----------------------------------------------------------------


@dataclass
class Rules:
    notifiers: dict[str, Notifier]


def _rules(url: str) -> Rules:
    return Rules({"phone": Notifier("phone", (url,), channels=("ntfy",))})


async def _rows(store: Store, state: str = "open") -> dict[str, int]:
    """Alert session:s1, episode 1, in state, with its opener, its resolved message and a
    digest's row."""
    await store.events.accept(*event(1))

    def work(tx: Tx) -> dict[str, int]:
        tx.alerts.save(Alert("session:s1", state, 1, "2026-01-01T00:00:00Z"), 1.0)
        n = note("r", "phone", 0)
        return {
            "opener": tx.outbox.add("evt_1", n, state="pending", now=1.0, alert="session:s1",
                                    episode=1),
            "resolved": tx.outbox.add("evt_1", n, state="pending", now=1.0, kind="resolved",
                                      alert="session:s1", episode=1),
            "digest": tx.outbox.add("evt_1", n, state="pending", now=1.0, kind="digest"),
        }  # fmt: skip

    return await store.transact(work)


def _send(
    tmp: Path, url: str, which: str, state: str = "open", *, sequence: bool = True
) -> tuple[Any, dict[str, int]]:
    async def go(store: Store) -> tuple[Any, dict[str, int]]:
        rows = await _rows(store, state)
        channel = NtfyChannel(
            store, lambda: _rules(url), schedule=Backoff(), sequence=sequence, timeout=5
        )
        kind = {"resolved": "resolved", "digest": "digest"}.get(which, "event")
        return await channel.send(_row(rows[which], kind)), rows

    return run(str(tmp / "r.db"), go)


def test_a_send_publishes_json_to_the_root_with_bearer_auth(tmp_path: Path) -> None:
    with NtfyStandIn(token=TOKEN) as server:
        result, _ = _send(tmp_path, server.url("alerts", query=f"token={TOKEN}"), "opener")
        assert (result.outcome, result.status) == ("delivered", 200)
        [got] = server.published
        assert got.headers["Authorization"] == f"Bearer {TOKEN}"
        assert got.headers["Content-Type"] == "application/json"
        assert got.json["topic"] == "alerts" and got.json["priority"] == 5
        assert got.sequence_id == key_of("session:s1", 1)
        assert [(m, p) for m, p, _ in server.requests] == [("POST", "/")]


def test_basic_auth_and_a_refused_password_gives_up_without_showing_it(tmp_path: Path) -> None:
    with NtfyStandIn(user=("bob", SECRET)) as server:
        ok, _ = _send(tmp_path, server.url("alerts", auth=f"bob:{SECRET}@"), "digest")
        assert ok.outcome == "delivered"
        assert "sequence_id" not in server.published[0].json  # a digest: no episode
        (tmp_path / "r.db").unlink()
        wrong, _ = _send(tmp_path, server.url("alerts", auth="bob:nope-wrong@"), "digest")
    assert (wrong.outcome, wrong.status) == ("give_up", 401)
    assert "HTTP 401" in wrong.error and "nope-wrong" not in wrong.error


def test_the_resolve_replaces_and_then_clears_the_episode(tmp_path: Path) -> None:
    with NtfyStandIn() as server:
        result, _ = _send(tmp_path, server.url("alerts"), "resolved", state="resolved")
        assert result.outcome == "delivered"
        key = key_of("session:s1", 1)
        assert [(m, p) for m, p, _ in server.requests] == [
            ("POST", "/"), ("PUT", f"/alerts/{key}/clear")
        ]  # fmt: skip
        assert server.cleared == [("alerts", key)]
        assert server.phone() == [] and len(server.phone(cleared=True)) == 1


def test_an_older_server_without_clear_still_counts_the_resolve_sent(tmp_path: Path) -> None:
    with NtfyStandIn(version="2.15") as server:
        result, _ = _send(tmp_path, server.url("alerts"), "resolved", state="resolved")
    assert (result.outcome, result.status) == ("delivered", 200)
    assert result.excerpt is not None and "before 2.16" in result.excerpt


def test_sequence_off_publishes_no_sequence_id_and_clears_nothing(tmp_path: Path) -> None:
    with NtfyStandIn() as server:
        result, _ = _send(tmp_path, server.url("a"), "resolved", "resolved", sequence=False)
        assert result.outcome == "delivered"
        assert "sequence_id" not in server.published[0].json
        assert [m for m, _, _ in server.requests] == ["POST"]


@pytest.mark.parametrize(("status", "after"), [(429, "7"), (503, None), (500, None)])
def test_busy_or_failing_servers_are_retried_with_their_retry_after(
    tmp_path: Path, status: int, after: str | None
) -> None:
    with NtfyStandIn() as server:
        server.fail_with(status, after)
        result, _ = _send(tmp_path, server.url("alerts"), "opener")
    assert (result.outcome, result.status) == ("retry", status)
    assert result.retry_after == (7.0 if after else None)


def test_an_unreachable_server_is_retried_and_a_huge_answer_is_capped(tmp_path: Path) -> None:
    with NtfyStandIn() as server:
        url = server.url("alerts", auth=f"bob:{SECRET}@")
    down, _ = _send(tmp_path, url, "opener")  # stopped: nothing listens there now
    assert down.outcome == "retry" and SECRET not in (down.error or "")
    (tmp_path / "r.db").unlink()
    with EndlessAnswer(status=400) as endless:
        url = endless.url.replace("http://", "ntfy://") + "/alerts"
        huge, _ = _send(tmp_path, url, "opener")
        assert endless.written < 50 * 2**20  # hung up long before the 300 MB
    assert (huge.outcome, huge.status) == ("give_up", 400)
    assert len(huge.error or "") < 400


def test_the_kind_builds_its_channel_from_the_settings() -> None:
    @dataclass
    class Settings:
        ntfy_sequence: str = "off"
        notify_timeout: float = 3.0

    source = object()
    parts: Any = type("P", (), {})()
    parts.store, parts.rules, parts.backoff, parts.enrich = None, lambda: None, Backoff(), None
    parts.settings, parts.links = Settings(), source
    built = ntfy.KIND.build(parts)
    assert isinstance(built, NtfyChannel)
    assert (built.sequence, built.timeout, built.links) == (False, 3.0, source)
    parts.settings = None
    assert ntfy.KIND.build(parts).sequence is True  # type: ignore[union-attr]


def test_the_starters_commented_ntfy_notifiers_are_valid_ntfy_urls() -> None:
    import re

    from receiver.rules import starter_text

    urls = re.findall(r'^  # ntfy: "(\S+)"$', starter_text(), re.MULTILINE)
    assert len(urls) == 2
    for url in urls:
        url = url.replace("${NTFY_TOPIC}", "attention").replace("${NTFY_TOKEN}", TOKEN)
        assert registry.channel_of(url) == "ntfy" and registry.problem(url, "ntfys") is None
