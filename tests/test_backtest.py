"""`receiver backtest` on a virtual clock: each lifecycle option replayed over events kept in a
real SQLite file (each received at a time the test sets), and what the backtest says would
have been sent or suppressed. The real store is only read."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from receiver import events, rules
from receiver.backtest import period
from receiver.backtest import replay as backtest
from receiver.cli import cli
from receiver.store import Notification, Store, StoredEvent, open_store

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)  # a Monday, 10:00 UTC
START = T0.timestamp()
HEADER = """
notifiers:
  hook: "json://127.0.0.1:9/hook"
  chat: "json://127.0.0.1:9/chat"
"""


def ev(kind: str, event_id: str, minute: float, session: str = "s1", **fields: Any) -> dict:
    """An event sent `minute` minutes after T0 (its timestamp; received then too)."""
    stamp = (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return events.sample(
        kind, id=event_id, sessionId=session, userId=f"u_{session}", timestamp=stamp, **fields
    )


def at(minute: float) -> float:
    return START + minute * 60


async def keep(store: Store, stream: list[dict], clock: list[float]) -> None:
    """Accept each event at the time its timestamp says (or the received_at it names)."""
    for payload in stream:
        received = payload.pop("_received", None)
        stamp = datetime.fromisoformat(payload["timestamp"])
        clock[0] = received if received is not None else stamp.timestamp()
        e = events.validate(payload)
        await store.events.accept(e, json.dumps(payload).encode())


def replay(
    tmp_path: Path,
    rule_text: str,
    stream: list[dict],
    *,
    minutes: float = 24 * 60,
    against: str | None = None,
    silence: tuple[dict, float, float] | None = None,
) -> list[backtest.Result]:
    """Keep the stream in a real SQLite file, then backtest the rules (and `against`) over
    [T0, T0 + minutes)."""
    clock = [START]
    db = str(tmp_path / "receiver.db")
    rulesets = [rules.load_text(HEADER + t) for t in (rule_text, against) if t is not None]

    async def main() -> list[backtest.Result]:
        store = open_store(db, clock=lambda: clock[0])
        await store.open()
        try:
            await keep(store, stream, clock)
            if silence is not None:
                matchers, since, until = silence
                await store.transact(lambda tx: tx.silences.add(matchers, "test", since, until))
            results, _ = await period.run(store, rulesets, start=START, end=at(minutes))
            untouched = await store.transact(lambda tx: len(tx.events.unrouted(10_000)))
            assert untouched == len(stream)  # the real store: nothing routed
            assert await store.outbox.deliveries() == []  # and nothing queued
            return results
        finally:
            await store.close()

    return asyncio.run(main())


def sent(result: backtest.Result, rule: str) -> int:
    return result.rules[rule].sent if rule in result.rules else 0


def suppressed(result: backtest.Result, rule: str) -> dict[str, int]:
    return dict(result.rules[rule].suppressed) if rule in result.rules else {}


def rule(options: str = "", match: str = "type: score.drop", name: str = "drop") -> str:
    return f"""
rules:
  - name: {name}
    match: {{{match}}}
    notify: hook
{options}"""


def test_a_plain_rule_counts_each_match_and_nothing_else(tmp_path: Path) -> None:
    [r] = replay(
        tmp_path,
        rule(),
        [ev("score.drop", "e1", 0), ev("score.recover", "e2", 5), ev("score.drop", "e3", 61)],
    )
    assert sent(r, "drop") == 2 and suppressed(r, "drop") == {}
    assert r.events == 3 and r.alerts_opened == 2
    hour, count = r.rules["drop"].busiest() or (0, 0)
    assert (hour, count) == (START, 1)  # 10:00 and 11:00 have one each: the earlier wins


def test_hold_cancels_what_resolves_inside_it_and_sends_the_rest(tmp_path: Path) -> None:
    hold = rule("    hold: 10m\n    resolve: true\n")
    stream = [
        ev("score.drop", "e1", 0, "s1"),
        ev("score.recover", "e2", 5, "s1"),  # inside the hold: cancelled, no resolved message
        ev("score.drop", "e3", 0, "s2"),
        ev("score.recover", "e4", 30, "s2"),  # after the hold: sent, then resolved
    ]
    [r] = replay(tmp_path, hold, sorted(stream, key=lambda p: p["timestamp"]))
    assert sent(r, "drop") == 2  # s2's drop and its resolved message
    assert suppressed(r, "drop") == {"cancelled": 1}
    assert [(p.alert, p.session, p.user, p.at) for p in map(r.page, r.paged)] == [
        ("session:s2", "s2", "u_s2", at(10))  # sent when the hold ran out
    ]


def test_a_hold_still_running_at_the_end_is_counted_held(tmp_path: Path) -> None:
    [r] = replay(tmp_path, rule("    hold: 10m\n"), [ev("score.drop", "e1", 55)], minutes=60)
    assert sent(r, "drop") == 0 and r.rules["drop"].held == 1


def test_repeat_fires_on_the_virtual_clock_until_resolved(tmp_path: Path) -> None:
    stream = [ev("score.drop", "e1", 0), ev("score.recover", "e2", 4 * 60 + 30)]
    [r] = replay(tmp_path, rule("    repeat: 1h\n"), stream)
    assert sent(r, "drop") == 1 + 4  # the drop, then at 1h, 2h, 3h and 4h; none after


def test_digests_group_members_and_release_when_full(tmp_path: Path) -> None:
    grouped = rule("    group: {by: [type], wait: 30m, max: 5}\n")
    stream = [ev("score.drop", f"e{i}", i, f"s{i}") for i in range(7)]
    stream += [ev("score.drop", "late", 120, "s9")]
    [r] = replay(tmp_path, grouped, stream)
    # 5 fill one digest (sent at once), 2 wait for theirs (30m), the late one its own.
    assert sent(r, "drop") == 3
    assert suppressed(r, "drop") == {"grouped": 8}
    assert len(r.paged) == 8  # every member's alert was in a digest that went out


def test_outside_the_active_window_muted_or_deferred(tmp_path: Path) -> None:
    window = '    active: {{days: [mon], hours: "12:00-18:00", tz: UTC{defer}}}\n'
    stream = [ev("score.drop", "e1", 0, "s1"), ev("score.drop", "e2", 180, "s2")]
    [muted] = replay(tmp_path / "a", rule(window.format(defer="")), list(stream))
    assert sent(muted, "drop") == 1 and suppressed(muted, "drop") == {"muted": 1}
    [deferred] = replay(tmp_path / "b", rule(window.format(defer=", defer: true")), stream)
    assert sent(deferred, "drop") == 2
    assert deferred.paged[("session:s1", 1)] == at(120)  # when the window opened


def test_throttle_and_stale_are_suppressions_with_their_reason(tmp_path: Path) -> None:
    throttled = rule('    throttle: {key: "{{ userId }}", every: 1h}\n')
    stream = [ev("score.drop", f"e{i}", i * 10, "s1") for i in range(8)]  # 0..70 min
    [r] = replay(tmp_path / "a", throttled, stream)
    assert sent(r, "drop") == 2 and suppressed(r, "drop") == {"throttled": 6}
    late = ev("score.drop", "old", 1, "s1")
    late["_received"] = at(20)  # arrives after the recover below: stale
    stale = [ev("score.drop", "e1", 0), ev("score.recover", "e2", 10), late]
    [r] = replay(tmp_path / "b", rule("    resolve: true\n"), stale)
    assert suppressed(r, "drop") == {"stale": 1} and sent(r, "drop") == 2


def test_the_stores_silences_apply_over_their_span(tmp_path: Path) -> None:
    stream = [ev("score.drop", "e1", 0, "s1"), ev("score.drop", "e2", 30, "s2")]
    silence = ({"userId": "u_s1"}, START - 60, at(60))
    [r] = replay(tmp_path, rule(), stream, silence=silence)
    assert sent(r, "drop") == 1 and suppressed(r, "drop") == {"silenced": 1}


def test_the_heartbeat_fires_after_silence_and_resolves_once(tmp_path: Path) -> None:
    beat = (
        rule(match="type: session.stopped", name="stopped")
        + "heartbeat: {silent_for: 15m, notify: [chat]}\n"
    )
    stream = [ev("score.drop", "e1", 0), ev("score.drop", "e2", 60), ev("score.drop", "e3", 70)]
    [r] = replay(tmp_path, beat, stream, minutes=80)
    # fired at 0:15 (since the first event), resolved at 1:00; fired again never (80 < 85).
    assert r.rules["(heartbeat)"].sent == r.notifiers["chat"].sent == 2


def test_two_rulesets_side_by_side_list_the_alerts_missed_and_added(tmp_path: Path) -> None:
    current = rule("", "type: score.drop")
    candidate = rule("", "type: score.drop, score: {lt: 20}")
    stream = [
        ev("score.drop", "e1", 0, "s1", score=10),
        ev("score.drop", "e2", 5, "s2", score=30),
    ]
    cand, cur = replay(tmp_path, candidate, stream, against=current)
    diff = backtest.compare(cand, cur)
    assert (cand.sent, cur.sent) == (1, 2)
    assert [(p.alert, p.session, p.user, p.at) for p in diff.missed] == [
        ("session:s2", "s2", "u_s2", at(5))
    ]
    assert diff.added == [] and (diff.missed_count, diff.added_count) == (1, 0)


def test_the_scratch_store_forgets_what_can_no_longer_change(tmp_path: Path) -> None:
    """Memory is bounded by what is open: a long run keeps no sent rows, nor the bodies of
    events no alert needs."""
    stream = [ev("score.drop", f"e{i}", i, f"s{i % 3}") for i in range(50)]
    ruleset = rules.load_text(HEADER + rule("    resolve: true\n"))
    run = backtest.Backtest(ruleset, start=START, end=at(60))
    for i, payload in enumerate(stream):
        stored = StoredEvent(payload["id"], payload["type"], json.dumps(payload), at(i))
        run.route(stored)
    result = run.finish()
    assert sent(result, "drop") == 50
    assert run.tx.scratch.rows() == []
    kept = [e for e in (run.tx.events.body(p["id"]) for p in stream) if e is not None]
    assert len(kept) == 3  # the opener of each of the three open alerts


def test_decide_matches_as_route_does_without_the_texts() -> None:
    """The backtest's routing without titles and bodies is route(): the same rules, in
    the same order (first match, or on with continue), and the same throttle keys."""
    ruleset = rules.load_text(
        HEADER
        + """
rules:
  - name: vip
    match: {userId: u_vip}
    notify: [hook, chat]
    throttle: {key: "{{ sessionId }}-{{ type }}", every: 10m}
    continue: true
  - name: drops
    match: {type: score.drop, score: {lt: 30}}
    notify: hook
    throttle: {every: 5m}
  - name: rest
    match: {type: "score.*"}
    notify: chat
"""
    )
    payloads = [
        ev("score.drop", "a", 0, user="u_vip", score=10),
        ev("score.drop", "b", 0, score=10),
        ev("score.drop", "c", 0, score=35),
        ev("score.recover", "d", 0, user="u_vip"),
        ev("session.stopped", "e", 0),
    ]
    for payload in payloads:
        payload.update({"userId": payload.pop("user")} if "user" in payload else {})
        want = [
            (d.rule, d.notifier, d.target, d.throttle_key, d.throttle_seconds)
            for d in ruleset.route(payload)
        ]
        got = [
            (d.rule, d.notifier, d.target, d.throttle_key, d.throttle_seconds)
            for d in backtest.untitled_decisions(ruleset, payload)
        ]
        assert got == want
    first = backtest.untitled_decisions(ruleset, payloads[0])
    assert [d.rule for d in first] == ["vip", "vip", "drops"]


def test_rendering_the_texts_changes_no_count(tmp_path: Path) -> None:
    # A digest, and resolved messages (of a rule of their own: a grouping rule resolves
    # nothing, and `receiver check` refuses resolve beside group).
    grouped = rule("    group: {by: [type], wait: 5m, max: 3}\n    continue: true\n") + (
        "  - name: page\n    match: {type: score.drop}\n    notify: chat\n    resolve: true\n"
    )
    stream = [ev("score.drop", f"e{i}", i, f"s{i % 4}") for i in range(12)]
    stream += [ev("score.recover", "r1", 20, "s1")]
    clock = [START]
    db = str(tmp_path / "receiver.db")
    ruleset = rules.load_text(HEADER + grouped)

    async def main() -> list[backtest.Result]:
        store = open_store(db, clock=lambda: clock[0])
        await store.open()
        try:
            await keep(store, stream, clock)
            plain, _ = await period.run(store, [ruleset], start=START, end=at(60))
            rendered, _ = await period.run(store, [ruleset], start=START, end=at(60), texts=True)
            return [plain[0], rendered[0]]
        finally:
            await store.close()

    plain, rendered = asyncio.run(main())
    assert (plain.rules, plain.notifiers) == (rendered.rules, rendered.notifiers)
    assert plain.paged == rendered.paged
    assert sent(plain, "drop") > 0


# -- the commands ---------------------------------------------------------------------------


def stored(tmp_path: Path, stream: list[dict]) -> str:
    """A real SQLite file holding the stream, with the current rules' notifications of
    its first event delivered (for the report)."""
    clock = [START]
    db = str(tmp_path / "receiver.db")

    async def main() -> None:
        store = open_store(db, clock=lambda: clock[0])
        await store.open()
        try:
            await keep(store, stream, clock)
            note = Notification(rule="drop", notifier="hook", target=0, title="t", body="b")
            row = await store.transact(
                lambda tx: tx.outbox.add(stream[0]["id"], note, state="pending", now=START + 1)
            )
            await store.outbox.mark_delivered(row, now=START + 3)
        finally:
            await store.close()

    asyncio.run(main())
    return db


def test_receiver_backtest_prints_both_files_side_by_side(tmp_path: Path) -> None:
    db = stored(
        tmp_path, [ev("score.drop", "e1", 0, "s1", score=10), ev("score.drop", "e2", 5, "s2")]
    )
    new, now = tmp_path / "new.yaml", tmp_path / "now.yaml"
    new.write_text(HEADER + rule("", "type: score.drop, score: {lt: 20}"))
    now.write_text(HEADER + rule())
    args = ["backtest", str(new), "--against", str(now), "--db", db, "--from", "2026-11-23T10:00Z"]
    done = CliRunner().invoke(cli, [*args, "--to", "2026-11-23T11:00Z"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == f"backtest of {new} (new) against {now} (now)"
    assert "2 events" in lines[1]
    assert "notifications sent: new 1, now 2 (-1)" in lines[2]
    [drop] = [line for line in lines if line.startswith("drop ")]
    assert drop.split()[:4] == ["drop", "1", "2", "-1"]
    assert "alerts the new rules would have missed: 1" in done.output
    assert "replaying" not in done.output  # no progress bar off a terminal
    as_json = CliRunner().invoke(cli, [*args, "--to", "2026-11-23T11:00Z", "--json"])
    report = json.loads(as_json.output)
    assert report["candidate"]["rules"]["drop"]["sent"] == 1
    assert [m["session"] for m in report["missed"]] == ["s2"] and report["added"] == []


def test_receiver_backtest_shows_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal the bar runs on stderr (its length counted beside the replay) and
    ends at 100%; the report still goes to stdout."""
    db = stored(tmp_path, [ev("score.drop", f"e{i}", i, f"s{i}") for i in range(5)])
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(HEADER + rule())
    command = [sys.executable, "-m", "receiver", "backtest", str(rules_file)]
    command += ["--against", str(rules_file), "--db", db, "--from", "2026-11-23T10:00Z"]
    command += ["--to", "2026-11-23T11:00Z"]
    primary, secondary = pty.openpty()
    try:
        done = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=secondary, timeout=60, text=True
        )
        os.close(secondary)
        secondary = -1
        shown = b""
        while chunk := _read_pty(primary):
            shown += chunk
    finally:
        os.close(primary)
        if secondary != -1:
            os.close(secondary)
    assert done.returncode == 0, shown.decode(errors="replace")
    assert "5 events" in done.stdout and "replaying" not in done.stdout
    assert b"replaying events" in shown and b"100%" in shown


def _read_pty(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the other end is closed and all was read
        return b""


def test_receiver_backtest_refuses_a_bad_period_or_a_missing_database(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(HEADER + rule())
    db = stored(tmp_path, [ev("score.drop", "e1", 0)])
    base = ["backtest", str(rules_file), "--against", str(rules_file)]
    backwards = CliRunner().invoke(
        cli, [*base, "--db", db, "--from", "2026-11-23", "--to", "2026-11-22"]
    )
    assert backwards.exit_code == 2 and "the period is empty" in backwards.output
    bad = CliRunner().invoke(cli, [*base, "--db", db, "--from", "tuesday"])
    assert bad.exit_code == 2 and "'tuesday' is not a time" in bad.output
    since = CliRunner().invoke(cli, [*base, "--db", db, "--since", "a week"])
    assert since.exit_code == 2 and "invalid duration" in since.output
    missing = CliRunner().invoke(cli, [*base, "--db", str(tmp_path / "none.db")])
    assert missing.exit_code == 1 and "no database at" in missing.output
    unread = CliRunner().invoke(cli, ["backtest", str(tmp_path / "none.yaml"), "--db", db])
    assert unread.exit_code == 1 and "cannot read rules file" in unread.output


def test_the_scratch_store_forgets_an_alerts_ended_episodes() -> None:
    ruleset = rules.load_text(HEADER + rule("    resolve: true\n    repeat: 1h\n"))
    run = backtest.Backtest(ruleset, start=START, end=at(60))
    for i, kind in enumerate(["score.drop", "score.recover"] * 3):
        payload = ev(kind, f"e{i}", i)
        run.route(StoredEvent(payload["id"], kind, json.dumps(payload), at(i)))
    run.route(StoredEvent("e9", "score.drop", json.dumps(ev("score.drop", "e9", 9)), at(9)))
    result = run.finish()
    assert result.alerts_opened == 4 and result.rules["drop"].alerts == 4
    alert = "session:s1"
    assert [run.tx.notices.of(alert, n) != [] for n in (1, 2, 3, 4)] == [False] * 3 + [True]
    assert [run.tx.outbox.sent(alert, n, "drop") for n in (1, 2, 3, 4)] == [False] * 3 + [True]


def test_a_page_that_fails_to_route_leaves_no_read_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next page is read while this one is routed: when routing raised, that read was
    left running, and its end (or its error) was never looked at."""
    import asyncio

    from receiver.backtest import period as bt

    reads: list[asyncio.Task[Any]] = []

    class Pages:
        async def between(self, *args: Any, **kwargs: Any) -> list[Any]:
            reads.append(asyncio.current_task())  # type: ignore[arg-type]
            await asyncio.sleep(0.05)
            return [type("E", (), {"received_at": 1.0, "id": "e", "body": b"{}"})()]

    class Store:
        history = Pages()

    def broken(*args: Any) -> None:
        raise RuntimeError("a rule failed")

    monkeypatch.setattr(bt, "route_all", broken)
    period = type("R", (), {"start": 0.0, "end": 2.0})()
    backtests = [type("B", (), {"result": period})()]

    async def go() -> set[asyncio.Task[Any]]:
        with pytest.raises(RuntimeError, match="a rule failed"):
            await bt.replay_period(Store(), backtests)  # type: ignore[arg-type]
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    assert asyncio.run(go()) == set()  # the next page's read is not left running
    assert len(reads) == 1


def test_a_schedule_target_is_tallied_as_the_member_on_call_at_each_event(tmp_path: Path) -> None:
    schedules = """
schedules:
  primary: {timezone: UTC, rotation: daily, handoff: "11:00", start: 2026-11-23,
            members: [hook, chat]}
"""
    text = schedules + rule().replace("notify: hook", "notify: schedule:primary")
    # 10:00 is before the first shift (11:00, hook's): the rotation runs backwards, chat's.
    [r] = replay(tmp_path, text, [ev("score.drop", "e1", 0), ev("score.drop", "e2", 61)])
    assert sent(r, "drop") == 2
    assert {name: t.sent for name, t in r.notifiers.items()} == {"chat": 1, "hook": 1}
