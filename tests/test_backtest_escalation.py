"""`receiver backtest` with escalation policies: which steps would have fired on the virtual
clock and whom each paged, skipped steps under a silence, the chain restarting when the
silence ended, and the report's text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from receiver.cli import cli
from tests.test_backtest import HEADER, START, at, ev, replay, sent, stored

POLICY = """
escalations:
  wake:
    steps:
      - notify: [hook]
      - after: 5m
        notify: [chat]
      - after: 15m
        notify: [hook]
rules:
  - name: drop
    match: {type: score.drop}
    escalate: wake
"""


def test_steps_fire_on_the_virtual_clock_until_the_alert_resolves(tmp_path: Path) -> None:
    stream = [
        ev("score.drop", "e1", 0, "s1"),  # never resolves: steps 1, 2 and 3
        ev("score.drop", "e2", 30, "s2"),
        ev("score.recover", "e3", 33, "s2"),  # before step 2 (35): step 1 only
        ev("score.drop", "e4", 60, "s3"),
        ev("score.recover", "e5", 70, "s3"),  # after step 2 (65), before step 3 (80)
    ]
    [r] = replay(tmp_path, POLICY, stream, minutes=6 * 60)
    assert r.steps == {
        ("wake", 1): {"hook": 3},
        ("wake", 2): {"chat": 2},
        ("wake", 3): {"hook": 1},
    }
    # 6 pages, and the resolved messages: s2 to hook, s3 to hook and chat.
    assert sent(r, "drop") == 6 + 3
    assert len(r.paged) == 3


def test_a_silence_holds_the_chain_and_its_end_starts_it(tmp_path: Path) -> None:
    stream = [ev("score.drop", "e1", 0, "s1"), ev("score.drop", "e2", 0, "s2")]
    silence = ({"userId": "u_s1"}, START - 60, at(60))
    [r] = replay(tmp_path, POLICY, stream, minutes=3 * 60, silence=silence)
    assert r.steps == {("wake", 1): {"hook": 2}, ("wake", 2): {"chat": 2}, ("wake", 3): {"hook": 2}}
    # s2 paged from 10:00 on; s1 only once the silence ended at 11:00.
    hours = r.rules["drop"].hours
    assert hours == {START: 3, START + 3600: 3}


def test_the_report_lists_each_step_and_whom_it_paged(tmp_path: Path) -> None:
    db = stored(tmp_path, [ev("score.drop", "e1", 0, "s1"), ev("score.drop", "e2", 1, "s2")])
    new, now = tmp_path / "new.yaml", tmp_path / "now.yaml"
    new.write_text(HEADER + POLICY)
    now.write_text(HEADER + POLICY.replace("after: 5m", "after: 1h"))
    args = ["backtest", str(new), "--against", str(now), "--db", db, "--from", "2026-11-23T10:00Z"]
    done = CliRunner().invoke(cli, [*args, "--to", "2026-11-23T10:30Z"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    start = lines.index("escalation steps of the new rules (pages, by whom):")
    assert lines[start + 1 : start + 4] == [
        "  wake step 1: 2 (hook 2)",
        "  wake step 2: 2 (chat 2)",
        "  wake step 3: 2 (hook 2)",
    ]
    report = json.loads(
        CliRunner().invoke(cli, [*args, "--to", "2026-11-23T10:30Z", "--json"]).output
    )
    assert report["candidate"]["escalations"][1] == {
        "policy": "wake",
        "step": 2,
        "pages": {"chat": 2},
    }
    assert [e["step"] for e in report["current"]["escalations"]] == [1]  # 1h: not yet


INHIBIT = """
inhibit:
  - name: covers
    source: {type: intervention.fired}
    target: {type: score.drop}
    equal: [sessionId]
rules:
  - name: drop
    match: {type: score.drop}
    notify: hook
    resolve: true
"""


def test_the_backtest_counts_what_each_inhibition_muted_and_wakes_it_at_the_end(
    tmp_path: Path,
) -> None:
    fired = ev("intervention.fired", "i1", 0, "s1", interventionId="iv1")
    ended = ev("intervention.resolved", "i2", 5, "s1", interventionId="iv1")
    stream = [
        fired,
        ev("score.drop", "e1", 1, "s1"),  # muted until the intervention ends at 5
        ended,
        ev("score.drop", "e2", 2, "s2"),  # another session: sent
        ev("score.recover", "e3", 60, "s1"),
    ]
    [r] = replay(tmp_path, INHIBIT, stream, minutes=120)
    assert r.inhibited == {"covers": 1}
    assert r.rules["drop"].suppressed == {"inhibited": 1}
    # s2's drop; s1's "was inhibited" message at 5; then s1's resolved message at 60.
    assert sent(r, "drop") == 3
