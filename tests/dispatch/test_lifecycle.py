"""The alert lifecycle end to end: the real app under uvicorn, a real SQLite file, a real HTTP
sink receiving notifications, and a clock the tests drive instead of sleeping."""

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.cli import cli
from tests.harness import FakeClock, InProcessReceiver, eventually
from tests.servers import HTTPSink, Request

pytestmark = pytest.mark.e2e

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)  # a Monday


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event(
    kind: str, event_id: str, minute: float, session: str = "sess_1", **fields: object
) -> dict[str, object]:
    base: dict[str, object] = {
        "id": event_id,
        "type": kind,
        "sessionId": session,
        "userId": "user_42",
        "timestamp": at(minute),
    }
    if kind.startswith("score."):
        base.update(score=12 if kind == "score.drop" else 55, threshold=40)
    return {**base, **fields}


def quiet(sink: HTTPSink, count: int, seconds: float = 0.6) -> list[Request]:
    """Wait a little and check that exactly count notifications arrived, no more."""
    time.sleep(seconds)
    got = sink.requests
    assert len(got) == count, [r.json.get("title") for r in got]
    return got


def until(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """tests.harness.eventually(), its looks further apart as the wait goes on."""
    eventually(check, what, timeout)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0.timestamp())


def rules(sink: HTTPSink, options: str, match: str = "type: score.drop") -> str:
    return f"""
notifiers:
  hook: "{sink.json_url()}"
rules:
  - name: drop
    match: {{{match}}}
    notify: hook
    title: "dropped {{{{ sessionId }}}}"
{options}
"""


HOLD = "    hold: 60s\n    resolve: true\n"


def test_a_recover_inside_hold_sends_nothing(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, HOLD))
    assert server.send(event("score.drop", "e1", 0)).status_code == 202
    server.wait_routed(1)
    clock.advance(30)
    assert server.send(event("score.recover", "e2", 0.5)).status_code == 202
    server.wait_routed(2)
    clock.advance(120)
    quiet(http_sink, 0)
    assert server.outbox() == [("e1", "drop", "event", "cancelled")]


def test_outside_hold_the_drop_then_the_resolved_message_are_sent(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, HOLD))
    server.send(event("score.drop", "e1", 0))
    server.wait_routed(1)
    quiet(http_sink, 0, 0.3)  # held
    clock.advance(61)
    [drop] = http_sink.wait_for(1)
    assert drop.json["title"] == "dropped sess_1"
    server.send(event("score.recover", "e2", 5))
    resolved = http_sink.wait_for(2)[1]
    assert resolved.json["title"] == "[drop] resolved: sess_1"
    assert "ended by score.recover" in resolved.json["message"]
    assert "after 5m" in resolved.json["message"]
    quiet(http_sink, 2)


def test_a_late_out_of_order_drop_after_a_recover_sends_nothing(
    start: Callable[[str], InProcessReceiver], http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    resolve: true\n"))
    server.send(event("score.drop", "e1", 0))
    http_sink.wait_for(1)
    server.send(event("score.recover", "e2", 10))
    http_sink.wait_for(2)
    # The sender retried an older drop for hours: it arrives after the recover.
    assert server.send(event("score.drop", "e0", 5)).status_code == 202
    quiet(http_sink, 2)
    assert server.outbox()[-1] == ("e0", "drop", "event", "stale")
    # And a recover from before the drop cannot resolve a newer drop.
    server.send(event("score.drop", "e3", 20))
    http_sink.wait_for(3)
    server.send(event("score.recover", "e_old", 15))
    quiet(http_sink, 3)


def test_a_recover_that_arrives_before_its_drop_makes_the_drop_stale(
    start: Callable[[str], InProcessReceiver], http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    resolve: true\n"))
    server.send(event("score.recover", "e2", 10))
    server.send(event("score.drop", "e1", 0))
    quiet(http_sink, 0)
    assert server.outbox() == [("e1", "drop", "event", "stale")]
    assert CliRunner().invoke(cli, ["alerts", "--db", str(server.db)]).output == (
        "no open alerts\n"
    )


BOTH_KINDS = """
notifiers:
  hook: "{url}"
rules:
  - name: forward
    match: {{type: [score.drop, score.recover]}}
    notify: hook
    title: "forward {{{{ id }}}}"
    continue: true
  - name: page
    match: {{type: score.drop}}
    notify: hook
    title: "page {{{{ id }}}}"
    resolve: true
    resolved_title: "resolved {{{{ id }}}}"
"""


def titles(sink: HTTPSink) -> list[str]:
    return sorted(str(r.json["title"]) for r in sink.requests)


def test_a_plain_rule_forwards_late_events_exactly_once_each(
    start: Callable[[str], InProcessReceiver], http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "", match="type: [score.drop, score.recover]"))
    assert server.send(event("score.recover", "e2", 20)).status_code == 202
    assert server.send(event("score.drop", "e1", 10)).status_code == 202  # before its recover
    http_sink.wait_for(2)
    # The sender retried an older drop for hours, and delivered e1 once more.
    assert server.send(event("score.drop", "e0", 5)).status_code == 202
    assert server.send(event("score.drop", "e1", 10)).status_code == 200  # a duplicate
    http_sink.wait_for(3)
    quiet(http_sink, 3)
    assert [row[3] for row in server.outbox()] == ["delivered"] * 3
    assert [row[0] for row in server.outbox()] == ["e2", "e1", "e0"]


def test_a_late_drop_is_forwarded_by_a_plain_rule_and_stale_for_a_lifecycle_rule(
    start: Callable[[str], InProcessReceiver], http_sink: HTTPSink
) -> None:
    server = start(BOTH_KINDS.format(url=http_sink.json_url()))
    server.send(event("score.drop", "e1", 0))
    http_sink.wait_for(2)
    server.send(event("score.recover", "e2", 10))
    http_sink.wait_for(4)
    server.send(event("score.drop", "e0", 5))  # older than the recover
    http_sink.wait_for(5)
    quiet(http_sink, 5)
    assert titles(http_sink) == [
        "forward e0",
        "forward e1",
        "forward e2",
        "page e1",
        "resolved e2",
    ]
    assert ("e0", "page", "event", "stale") in server.outbox()
    # The alert stays resolved: the late drop did not reopen it...
    out = CliRunner().invoke(cli, ["alerts", "--db", str(server.db)]).output
    assert out == "no open alerts\n"
    # ...so a recover after it resolves nothing, and a new drop opens the next episode.
    server.send(event("score.recover", "e3", 12))
    http_sink.wait_for(6)
    server.send(event("score.drop", "e4", 15))
    http_sink.wait_for(8)
    quiet(http_sink, 8)
    assert titles(http_sink)[-3:] == ["page e1", "page e4", "resolved e2"]


def test_many_drops_go_out_as_one_digest(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    group: {by: [type], wait: 30s, max: 50}\n"))
    for i in range(12):
        server.send(event("score.drop", f"e{i}", 0, session=f"s{i}", score=10 + i))
    server.wait_routed(12)
    quiet(http_sink, 0, 0.3)
    clock.advance(31)
    [digest] = http_sink.wait_for(1)
    assert digest.json["title"] == "[drop] 12 × score.drop (type=score.drop)"
    assert "worst scores: user_42 10, user_42 11" in digest.json["message"]
    assert "sessions: s0, s1" in digest.json["message"] and "(+2 more)" in digest.json["message"]
    quiet(http_sink, 1)
    states = [row[3] for row in server.outbox()]
    assert states.count("grouped") == 12 and states.count("delivered") == 1


def test_a_full_digest_goes_out_at_once(
    start: Callable[[str], InProcessReceiver], http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    group: {wait: 10m, max: 3}\n"))
    for i in range(4):
        server.send(event("score.drop", f"e{i}", 0, session=f"s{i}"))
    [digest] = http_sink.wait_for(1)  # no clock moved: max reached
    assert digest.json["title"].startswith("[drop] 3 × score.drop")
    quiet(http_sink, 1)


def test_repeat_renotifies_while_open_and_stops_when_resolved(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    repeat: 4h\n"))
    server.send(event("score.drop", "e1", 0))
    http_sink.wait_for(1)
    clock.advance(3600 * 4 + 1)
    second = http_sink.wait_for(2)[1]
    assert second.json["title"] == "[still open] dropped sess_1"
    assert "repeat 1" in second.json["message"]
    clock.advance(3600 * 4 + 1)
    http_sink.wait_for(3)
    server.send(event("score.recover", "e2", 480))  # 8h in, as the clock is now
    server.wait_routed(2)
    clock.advance(3600 * 5)
    quiet(http_sink, 3)


ACTIVE = '    active: {{days: [mon, tue, wed, thu, fri], hours: "12:00-18:00", tz: UTC{defer}}}\n'


def test_outside_the_active_window_it_is_muted(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, ACTIVE.format(defer="")))
    server.send(event("score.drop", "e1", 0))  # 10:00 Monday: before 12:00
    server.wait_routed(1)
    clock.advance(3 * 3600)
    quiet(http_sink, 0)
    assert server.outbox() == [("e1", "drop", "event", "muted")]
    server.send(event("score.drop", "e2", 180, session="s2"))  # 13:00: inside
    http_sink.wait_for(1)


def test_deferred_notifications_go_out_when_the_window_opens(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, ACTIVE.format(defer=", defer: true")))
    server.send(event("score.drop", "e1", 0))
    server.wait_routed(1)
    clock.advance(3600)  # 11:00: still closed
    quiet(http_sink, 0)
    clock.advance(3600)  # 12:00: open
    [sent] = http_sink.wait_for(1)
    assert sent.json["title"] == "dropped sess_1"


def test_a_silence_matches_and_expires(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    clock.now = time.time()  # silences are written with the wall clock by the CLI
    server = start(rules(http_sink, ""))
    db = str(server.db)
    out = CliRunner().invoke(
        cli,
        [
            "silence",
            "add",
            "--db",
            db,
            "--match",
            "userId=user_4*",
            "--for",
            "2h",
            "--reason",
            "load test",
        ],
    )
    assert out.exit_code == 0 and out.output.startswith("silence #1 until")
    listed = CliRunner().invoke(cli, ["silence", "list", "--db", db]).output
    assert "#1  userId=user_4*" in listed and "(load test)" in listed
    # The silence began at the wall clock's now, which has moved on by however long the
    # server took to start (over a second under load): the events come after it.
    clock.now = time.time() + 1
    server.send(event("score.drop", "e1", 0))
    server.send(event("score.drop", "e2", 0, session="s2", userId="user_7"))
    http_sink.wait_for(1)
    quiet(http_sink, 1)
    assert ("e1", "drop", "event", "silenced") in server.outbox()
    server.wait_routed(2)
    clock.advance(2 * 3600 + 1)  # past its end
    server.send(event("score.drop", "e3", 1, session="s3"))
    http_sink.wait_for(2)
    out = CliRunner().invoke(
        cli,
        ["silence", "add", "--db", db, "--match", "sessionId=s4", "--for", "1h", "--reason", "x"],
    )
    clock.now = time.time() + 1
    assert CliRunner().invoke(cli, ["silence", "expire", "--db", db, "2"]).exit_code == 0
    assert (
        "no active silence #2"
        in CliRunner().invoke(cli, ["silence", "expire", "--db", db, "2"]).output
    )
    server.send(event("score.drop", "e4", 2, session="s4", userId="user_7"))
    http_sink.wait_for(3)


HEARTBEAT = """
notifiers:
  hook: "{url}"
heartbeat: {{silent_for: 15m, notify: [hook]}}
rules:
  - name: all
    match: {{type: session.stopped}}
    notify: hook
"""


def test_the_heartbeat_fires_once_and_resolves_once(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(HEARTBEAT.format(url=http_sink.json_url()))
    clock.advance(10 * 60)
    quiet(http_sink, 0, 0.3)
    clock.advance(6 * 60)
    [fired] = http_sink.wait_for(1)
    assert fired.json["title"] == "No events for 15m"
    clock.advance(30 * 60)
    quiet(http_sink, 1)
    server.send(event("score.drop", "e1", 0))
    resolved = http_sink.wait_for(2)[1]
    assert resolved.json["title"] == "Events are arriving again"
    clock.advance(5 * 60)
    quiet(http_sink, 2)


def test_held_notifications_survive_a_restart(
    start: Callable[[str], InProcessReceiver], clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, HOLD))
    server.send(event("score.drop", "e1", 0))
    server.wait_routed(1)
    server.stop()
    server = start(rules(http_sink, HOLD))  # same database file
    quiet(http_sink, 0, 0.3)
    clock.advance(61)
    http_sink.wait_for(1)
    server.stop()
    server = start(rules(http_sink, HOLD))
    server.send(event("score.recover", "e2", 3))
    assert http_sink.wait_for(2)[1].json["title"] == "[drop] resolved: sess_1"
    out = CliRunner().invoke(cli, ["alerts", "--db", str(server.db)]).output
    assert out == "no open alerts\n"


def test_alerts_lists_what_is_open(
    start: Callable[[str], InProcessReceiver], http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    resolve: true\n"))
    server.send(event("score.drop", "e1", 0))
    http_sink.wait_for(1)
    until(lambda: server.outbox()[-1][3] == "delivered", "delivery")
    out = CliRunner().invoke(cli, ["alerts", "--db", str(server.db)]).output
    assert out.startswith("session:sess_1  open since 2026-11-23T10:00:00.000000Z (event e1")
    assert out.rstrip().endswith("drop")


def test_explain_shows_what_the_lifecycle_would_do_now(tmp_path: Path) -> None:
    import asyncio

    from receiver.store import SQLiteStore
    from receiver.store.sqlite.tx import Alert, SQLiteTx

    db = tmp_path / "r.db"
    now = time.time()

    def seed(tx: SQLiteTx) -> None:
        tx.silences.add({"userId": "user_4*"}, "maintenance", now - 1, now + 3600)
        tx.alerts.save(Alert("session:sess_1", "resolved", 1, at(30)), now)

    async def setup() -> None:
        store = SQLiteStore(db)
        await store.open()
        await store.transact(seed)
        await store.close()

    asyncio.run(setup())
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(
        "rules:\n  - name: drop\n    notify: console\n    hold: 60s\n"
        "    resolve: true\n    continue: true\n"
        "  - name: digest\n    notify: console\n    group: {by: [type], wait: 30s}\n"
    )

    def explain_now(timestamp: str) -> str:
        args = ["explain", "--rules", str(rules_file), "--db", str(db), "--session", "sess_1"]
        out = CliRunner().invoke(cli, [*args, "--timestamp", timestamp]).output
        return out.split("now:\n", 1)[1]

    now_part = explain_now(at(0))
    assert "alert session:sess_1: resolved, newest event 2026-11-23T10:30:00.000000Z" in now_part
    assert "stale: older than the alert's newest event, so rules with hold" in now_part
    assert "drop: stale, nothing sent" in now_part
    assert "silenced by #1 until" in now_part and "(maintenance)" in now_part
    assert "drop: held" not in now_part  # stale comes first
    assert "digest: grouped into a digest by type" in now_part  # a plain rule: never stale
    now_part = explain_now(at(45))
    assert "stale" not in now_part
    assert "drop: held 1m; cancelled if the alert resolves first; a resolved" in now_part
    assert "digest: grouped into a digest by type for 30s (at most 50)" in now_part


def test_a_silence_regex_that_needs_backtracking_is_refused(tmp_path: Path) -> None:
    args = ["silence", "add", "--db", str(tmp_path / "r.db"), "--match", "userId=~(a)\\1"]
    out = CliRunner().invoke(cli, [*args, "--for", "1h", "--reason", "x"])
    assert out.exit_code == 2
    assert 'match.userId: invalid regex "(a)\\\\1": \\1: backreferences are not supported' in (
        " ".join(out.output.split())  # click wraps the line
    )


def test_a_stored_silence_that_no_longer_compiles_silences_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Made before regexes ran on RE2: dropping the bad condition would leave one that
    # silences every event.
    from receiver.dispatch.silences import active_silences
    from receiver.store.records import Silence

    old = Silence(7, {"userId": "~^(a)\\1", "type": "score.drop"}, "old", 0.0, 2e9)
    ok = Silence(8, {"userId": "~^user_4"}, "ok", 0.0, 2e9)
    with caplog.at_level("WARNING", logger="receiver.lifecycle"):
        active = active_silences([old, ok])
        active_silences([old, ok])  # the warning is once per silence, not once per batch
    assert [silence.id for silence, _ in active] == [8]
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("silence #7 is ignored: match.userId: invalid regex")


def test_explain_names_a_silence_that_ends_after_the_year_9999() -> None:
    """A silence stored before durations were capped (or by hand) ends past any date:
    `receiver explain` said nothing then, it failed on formatting the end."""
    from receiver import events
    from receiver.dispatch.explain import explain_now
    from receiver.rules import load_text
    from receiver.store.records import Silence

    ruleset = load_text("rules:\n  - name: drop\n    notify: console\n", env={})
    payload = events.sample("score.drop")
    forever = Silence(3, {"type": "score.drop"}, "for ever", 0.0, 1e20)
    lines = explain_now(ruleset, payload, 1000.0, silences=[forever])
    assert "silenced by #3 until after 9999 (for ever)" in lines
