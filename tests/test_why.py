"""What explain says of a stored event (receiver/why.py) is what happened to it: the decision
routing took, each state a notification went through since with its time, the resolved
messages of the event that closed an alert, the digest `receiver check` prints for the same
file, and reasons that do not say the decision (or the rule's name) again. In process: the
real Router on a real SQLite file, on a clock the test drives (tests/dispatch/routed.py)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from receiver import why
from receiver.app import _announce
from receiver.cli import cli
from receiver.events import sample
from receiver.reloader import RulesHolder
from receiver.settings import Settings
from tests.dispatch.key_pairs import HEAD, T0, at
from tests.dispatch.routed import Routed

ESCALATE_ONLY = """
inhibit:
  - name: covers
    source: {type: intervention.fired}
    target: {type: score.drop}
    equal: [sessionId]
rules:
  - name: quiet-page
    match: {type: score.drop, userId: u_quiet}
    escalate: page
    active: {hours: "20:00-21:00", tz: UTC}
  - name: deep
    match: {type: score.drop}
    escalate: page
    storm: {max: 2, per: 30m}
"""


@pytest.fixture
def routed(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Routed]:
    found = Routed(tmp_path, HEAD + request.param, T0.timestamp())
    yield found
    found.close()


def drop(routed: Routed, event_id: str, session: str, **fields: Any) -> dict[str, Any]:
    stamp = at(routed.now - T0.timestamp())
    return sample("score.drop", id=event_id, sessionId=session, timestamp=stamp, **fields)


def event(routed: Routed, kind: str, event_id: str, session: str, **more: Any) -> dict[str, Any]:
    stamp = at(routed.now - T0.timestamp())
    return sample(kind, id=event_id, sessionId=session, timestamp=stamp, **more)


def matched(found: dict[str, Any], rule: str) -> dict[str, Any]:
    [entry] = [r for r in found["rules"] if r["rule"] == rule]
    return entry


@pytest.mark.parametrize("routed", [ESCALATE_ONLY], indirect=True)
def test_a_rule_that_only_escalates_is_explained_as_what_stopped_its_chain(
    routed: Routed,
) -> None:
    routed.silence({"sessionId": "s_silenced"}, 3600, "deploy")
    routed.send(event(routed, "intervention.fired", "i1", "s_inhibited", interventionId="iv"))
    routed.send(drop(routed, "d_silenced", "s_silenced"))
    routed.send(drop(routed, "d_inhibited", "s_inhibited"))
    routed.send(drop(routed, "d_quiet", "s_quiet", userId="u_quiet"))
    routed.send(drop(routed, "d_sent", "s_sent"))  # the storm's first two (max 2) page
    routed.send(drop(routed, "d_sent2", "s_sent2"))
    routed.send(drop(routed, "d_storm", "s_storm"))
    routed.send(drop(routed, "d_again", "s_sent"))  # its chain runs: no alert new, no count
    expected = {
        "d_silenced": ("deep", "silenced", "silence #1: deploy; escalation page waits"),
        "d_inhibited": ("deep", "inhibited", "by covers (i1, open since "),
        "d_quiet": ("quiet-page", "quiet", "muted outside the active window (mon,tue"),
        "d_sent": ("deep", "sent", "escalation page started: its steps page (see the alert)"),
        "d_again": ("deep", "deduplicated", "escalation page was already running for its"),
        "d_storm": ("deep", "storm", "over 2 in 30m; in storm message #1; escalation page not"),
    }
    for event_id, (rule, decision, reason) in expected.items():
        entry = matched(routed.explain(event_id), rule)
        assert (entry["decision"], entry["reason"][: len(reason)]) == (decision, reason), entry
        kept = [(n["kind"], n["notifier"], n["state"]) for n in entry["notifications"]]
        paged = [("escalation", "pager", "pending")]  # its chain's first step, at once
        state = {"quiet": "muted"}.get(decision, decision)
        if decision == "deduplicated":  # the chain d_sent started pages
            paged = []
        elif decision == "storm":  # the first held back carries the storm message, held
            paged = [("storm", "pager", "held"), ("escalation", "pager", "storm")]
        elif decision != "sent":  # the first step's page, kept with what stopped it
            paged = [("escalation", "pager", state)]
        assert kept == paged, entry
    # The storm message goes to whom the chain pages first, and counts alerts not paged.
    [message] = [r for r in routed.rows() if r.kind == "storm"]
    assert (message.notifier, message.title) == (
        "pager",
        "[deep] storm: 1 more alert held back, not paged",
    )


@pytest.mark.parametrize("routed", [ESCALATE_ONLY], indirect=True)
def test_a_silenced_escalation_step_is_kept_as_a_silenced_row(routed: Routed) -> None:
    """docs/alert-lifecycle.md: a silence skips a step and keeps its notifications as
    `silenced`; when the silence ends the chain starts from its first step."""
    silence = routed.silence({"sessionId": "s1"}, 3600, "deploy")
    routed.send(drop(routed, "d1", "s1"))
    rows = [(r.kind, r.notifier, r.state, r.reason) for r in routed.rows()]
    assert rows == [
        ("escalation", "pager", "silenced", "silence #1: deploy; escalation page waits")
    ]
    routed.advance(60)
    routed.expire(silence)
    routed.advance(60, step=1)
    paged = routed.rows()[-1]
    assert (paged.kind, paged.notifier, paged.state) == ("escalation", "pager", "pending")
    assert "was silenced since" in paged.body


RESOLVE = """
inhibit:
  - name: covers
    source: {type: intervention.fired}
    target: {type: score.drop}
    equal: [sessionId]
rules:
  - name: page
    match: {type: score.drop}
    notify: [chat]
    resolve: true
"""


@pytest.mark.parametrize("routed", [RESOLVE], indirect=True)
def test_a_closing_event_is_explained_by_the_alert_it_resolved(routed: Routed) -> None:
    routed.send(drop(routed, "d1", "s1"))
    routed.advance(60)
    routed.send(event(routed, "score.recover", "r1", "s1"))
    entry = matched(routed.explain("r1"), "page")
    assert entry["decision"] == "sent" and not entry["matched"]
    assert entry["reason"].startswith("resolved alert session:s1: 1 resolved message (the rule")
    assert [(n["kind"], n["state"]) for n in entry["notifications"]] == [("resolved", "pending")]


@pytest.mark.parametrize("routed", [RESOLVE], indirect=True)
def test_a_notification_inhibited_then_sent_shows_each_state_with_its_time(
    routed: Routed,
) -> None:
    routed.send(event(routed, "intervention.fired", "i1", "s1", interventionId="iv"))
    routed.send(drop(routed, "d1", "s1"))
    routed.advance(300)
    routed.send(event(routed, "intervention.resolved", "i2", "s1", interventionId="iv"))
    routed.advance(5, step=1)
    entry = matched(routed.explain("d1"), "page")
    assert entry["decision"] == "inhibited" and entry["reason"].startswith("by covers (i1, ")
    [(first, at0), (then, at1)] = [(s["decision"], s["at"]) for s in entry["states"]]
    assert (first, then) == ("inhibited", "sent") and at0 < at1
    assert entry["states"][1]["reason"].startswith("was inhibited by covers since ")
    lines = why.lines(routed.explain("d1"))
    assert any(line.strip().startswith(f"then sent at {at1}") for line in lines), lines


@pytest.mark.parametrize("routed", [RESOLVE], indirect=True)
def test_explain_gives_the_digest_check_prints_for_the_same_file(
    routed: Routed, tmp_path: Path
) -> None:
    routed.send(drop(routed, "d1", "s1"))
    path = tmp_path / "rules.yaml"
    path.write_text(routed.ruleset.text)
    checked = CliRunner().invoke(cli, ["check", str(path)])
    assert checked.exit_code == 0, checked.output
    [digest] = re.findall(r"\(digest (\w+)\)", checked.output)
    found = routed.explain("d1")
    assert (found["rulesAsOf"], found["rulesFile"]["digest"]) == ("routing", digest)


NAMED_LIKE_DECISIONS = """
rules:
  - name: storm
    match: {type: score.drop, userId: u_storm}
    notify: [chat]
    storm: {max: 1, per: 1h}
  - name: throttled
    match: {type: score.drop, userId: u_throttled}
    notify: [chat]
    throttle: {every: 1h}
  - name: stale
    match: {type: score.drop, userId: u_stale}
    notify: [chat]
    resolve: true
  - name: sent
    match: {type: score.drop, userId: u_sent}
    notify: [chat]
"""


@pytest.mark.parametrize("routed", [NAMED_LIKE_DECISIONS], indirect=True)
@pytest.mark.parametrize("name", ["storm", "throttled", "stale", "sent"])
def test_a_rule_named_like_its_decision_says_it_once(routed: Routed, name: str) -> None:
    routed.send(drop(routed, "new", "s1", userId=f"u_{name}"))
    routed.now -= 30  # the second is older than the first: stale for the rule stale
    routed.send(drop(routed, "second", "s1" if name == "stale" else "s2", userId=f"u_{name}"))
    found = routed.explain("second")
    entry = matched(found, name)
    assert entry["decision"] == name
    assert entry["reason"] != name  # the why, not the decision again
    assert not entry["reason"].startswith((f"{name}:", f"{name} ")), entry["reason"]
    [line] = [line for line in why.lines(found) if re.match(rf"\d+\. {name}: ", line)]
    rest = line.split(f"{name}: {name} — ", 1)[1]  # the rule, its decision, then why
    assert not rest.startswith((f"{name}:", f"{name} ")), line


def test_the_start_line_counts_one_rule_as_one_rule(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    routed = Routed(tmp_path, HEAD + "rules:\n  - name: a\n    notify: chat\n", T0.timestamp())
    routed.close()
    with caplog.at_level(logging.INFO, logger="receiver"):
        _announce(Settings(), RulesHolder(Path("rules.yaml"), routed.ruleset))
    assert "; 1 rule from rules.yaml" in caplog.text


HOLD = """
rules:
  - name: page
    match: {type: score.drop}
    notify: [chat]
    hold: 5m
"""


@pytest.mark.parametrize("routed", [HOLD], indirect=True)
def test_a_held_notification_a_resolve_cancelled_shows_both_states(routed: Routed) -> None:
    routed.send(drop(routed, "d1", "s1"))
    routed.advance(60)
    routed.send(event(routed, "score.recover", "r1", "s1"))
    entry = matched(routed.explain("d1"), "page")
    assert (entry["decision"], entry["reason"]) == ("held", "hold 5m")
    held, cancelled = entry["states"]
    assert cancelled["decision"] == "cancelled" and held["at"] < cancelled["at"]
    assert cancelled["reason"] == "cancelled: resolved before it was sent"


def test_explain_now_says_a_storm_holds_chains_back(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(HEAD + ESCALATE_ONLY)
    args = ["explain", "--rules", str(rules), "--db", str(tmp_path / "none.db")]
    out = CliRunner().invoke(cli, [*args, "--type", "score.drop", "--user", "u_deep"])
    assert out.exit_code == 0, out.output
    assert (
        "deep: storm guard: past 2 in 30m the rest are held back and not paged (no chain"
        " starts), counted in one storm message" in " ".join(out.output.split())
    )
