"""rules.yaml `escalations:` and a rule's `escalate:`: each bad policy is refused with a
message naming the policy and the key; a policy's timeline, its frozen form, and what
`receiver check` says of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver import events, rules
from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.rules.escalations import Policy, Step
from receiver.rules.rule import ESCALATE_ONLY

HEAD = """\
notifiers:
  team-chat: json://127.0.0.1:9/chat
  lead-mail: json://127.0.0.1:9/mail
  alice-chat: json://127.0.0.1:9/alice
schedules:
  primary:
    timezone: Europe/Berlin
    rotation: weekly
    handoff: "Mon 09:00"
    start: 2026-11-30
    members: [alice-chat]
"""
# The issue's example.
GOOD = """\
escalations:
  wake-someone:
    steps:
      - notify: [team-chat]
      - after: 5m
        notify: [schedule:primary]
      - after: 15m
        notify: [schedule:primary, lead-mail]
    repeat: 2
    reack: 30m
"""
RULES = """\
rules:
  - {name: deep-drop, notify: team-chat, escalate: wake-someone}
  - {name: page-only, escalate: wake-someone}
"""
SLACK_BOT_TOKEN = "xoxb-1234-1234-4ddbc191d40ee098cbaae6f3523ada2d"
TWO_STEPS = "[{notify: team-chat}, {after: 5m, notify: lead-mail}]"


def policy(body: str) -> str:
    """A file with the policy "w" (body: its keys, one a line) and no rules."""
    lines = "".join(f"    {line}\n" for line in body.splitlines())
    return HEAD + "escalations:\n  w:\n" + lines


def problems(source: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        rules.load_text(source)
    return caught.value.problems


def test_the_issue_example_loads_with_its_policy() -> None:
    rs = rules.load_text(HEAD + GOOD + RULES)
    wake = rs.escalations["wake-someone"]
    assert wake == Policy(
        "wake-someone",
        (
            Step(0.0, ("team-chat",)),
            Step(300.0, ("schedule:primary",)),
            Step(900.0, ("schedule:primary", "lead-mail")),
        ),
        repeat=2,
        reack=1800.0,
    )
    assert rs.by_name["deep-drop"].escalate == wake and rs.by_name["deep-drop"].follows_alert


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            f"steps: {TWO_STEPS}\nrepeats: 2",
            'unknown key "repeats"; allowed: steps, repeat, reack',
            id="unknown-policy-key",
        ),
        pytest.param(
            "steps: [{notify: team-chat, wait: 5m}]",
            'steps[1]: unknown key "wait"; allowed: after, notify',
            id="unknown-step-key",
        ),
        pytest.param(
            "steps: []", "steps: expected a non-empty list of steps, got []", id="empty-steps"
        ),
        pytest.param(
            "repeat: 1", "steps: expected a non-empty list of steps, got null", id="no-steps"
        ),
        pytest.param(
            "steps:\n  - {notify: team-chat}\n" + "  - {after: 1m, notify: lead-mail}\n" * 10,
            "steps: 11 steps; at most 10 are allowed",
            id="eleven-steps",
        ),
        pytest.param(
            f"steps: {TWO_STEPS}\nrepeat: 10",
            "repeat: expected a whole number from 0 to 9, got 10",
            id="repeat-10",
        ),
        pytest.param(
            f"steps: {TWO_STEPS}\nrepeat: -1",
            "repeat: expected a whole number from 0 to 9, got -1",
            id="repeat-negative",
        ),
        pytest.param(
            f"steps: {TWO_STEPS}\nrepeat: '2'",
            'repeat: expected a whole number from 0 to 9, got "2"',
            id="repeat-string",
        ),
        pytest.param(
            f"steps: {TWO_STEPS}\nrepeat: 1.5",
            "repeat: expected a whole number from 0 to 9, got 1.5",
            id="repeat-float",
        ),
        pytest.param(
            f"steps: {TWO_STEPS}\nrepeat: true",
            "repeat: expected a whole number from 0 to 9, got true",
            id="repeat-bool",
        ),
        pytest.param(
            "steps: [{notify: team-chat}]\nreack: 0s",
            "reack: 0s; use at least 1s, or leave reack out",
            id="reack-zero",
        ),
        pytest.param(
            "steps: [{notify: team-chat}]\nreack: half an hour",
            'reack: invalid duration "half an hour"; expected whole numbers with units d, h, m, s'
            " in that order, e.g. 90s, 15m, 2h, 1d, 1h30m",
            id="reack-bad-duration",
        ),
        pytest.param(
            "steps: [{notify: team-chat}]\nreack: 30",
            "reack: expected a duration such as 2s, 5m, 1h30m, got 30",
            id="reack-number",
        ),
        pytest.param(
            "steps: [{notify: team-chat}, {notify: lead-mail}]",
            'steps[2]: missing required key "after" (how long after the step before)',
            id="second-step-without-after",
        ),
        pytest.param(
            "steps: [{notify: team-chat}, {after: 0s, notify: lead-mail}]",
            "steps[2].after: 0s; a step after the first comes at least 1s after the one before"
            " (or list its targets in that step)",
            id="second-step-after-zero",
        ),
        pytest.param(
            "steps: [{notify: team-chat}, {after: soon, notify: lead-mail}]",
            'steps[2].after: invalid duration "soon"; expected whole numbers with units d, h, m,'
            " s in that order, e.g. 90s, 15m, 2h, 1d, 1h30m",
            id="step-bad-duration",
        ),
        pytest.param(
            "steps: [{notify: [team-chat, ops]}]",
            'steps[1].notify: undefined notifier "ops"',
            id="undefined-notifier",
        ),
        pytest.param(
            "steps: [{notify: team-chat}, {after: 5m, notify: schedule:secondary}]",
            'steps[2].notify: undefined schedule "schedule:secondary"',
            id="undefined-schedule",
        ),
        pytest.param(
            "steps: [{notify: []}]",
            "steps[1].notify: expected a notifier name or a non-empty list of them",
            id="empty-notify",
        ),
        pytest.param(
            "steps: [{notify: [team-chat, lead-mail, team-chat]}]",
            'steps[1].notify: "team-chat" is listed twice',
            id="target-twice",
        ),
        pytest.param(
            "steps: [{notify: team-chat}]\nrepeat: 1",
            "repeat: the chain would start again at once; give the last step an after"
            " (a new round begins that long after it)",
            id="repeat-without-last-after",
        ),
    ],
)
def test_a_bad_policy_is_refused_naming_the_key(body: str, message: str) -> None:
    assert problems(policy(body)) == [f'escalation "w": {message}']


def test_an_apprise_url_in_a_step_is_refused_and_not_echoed() -> None:
    source = policy(f"steps: [{{notify: 'slack://{SLACK_BOT_TOKEN}/C0123'}}]")
    with pytest.raises(ConfigError) as caught:
        rules.load_text(source)
    assert caught.value.problems == [
        'escalation "w": steps[1].notify: an apprise url is not allowed here; define it under'
        " notifiers: and name that notifier"
    ]
    assert SLACK_BOT_TOKEN not in str(caught.value)


def test_a_first_step_may_come_at_once_or_later() -> None:
    rs = rules.load_text(policy("steps: [{after: 0s, notify: team-chat}]"))
    later = rules.load_text(policy("steps: [{after: 2m, notify: team-chat}]\nrepeat: 1"))
    assert rs.escalations["w"].steps == (Step(0.0, ("team-chat",)),)
    assert later.escalations["w"].steps == (Step(120.0, ("team-chat",)),)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        pytest.param(
            "{name: r}", 'rule "r": missing required key "notify" (or "escalate")', id="neither"
        ),
        pytest.param(
            "{name: r, escalate: sleep-in}",
            'rule "r": escalate: undefined escalation policy "sleep-in"; defined: w, v',
            id="undefined-policy",
        ),
        pytest.param(
            "{name: r, escalate: [w]}",
            'rule "r": escalate: expected an escalation policy\'s name, got ["w"]',
            id="escalate-not-a-name",
        ),
        pytest.param(
            "{name: r, notify: team-chat, escalate: w, group: {by: '{{ session_id }}', wait: 1m}}",
            'rule "r": escalate: a rule that groups events into digests cannot escalate;'
            " escalate from a rule of its own",
            id="escalate-with-group",
        ),
    ],
)
def test_a_bad_escalate_is_refused_naming_the_rule(rule: str, message: str) -> None:
    source = policy("steps: [{notify: team-chat}]") + (
        "  v:\n    steps: [{notify: lead-mail}]\n" + f"rules:\n  - {rule}\n"
    )
    assert problems(source) == [message]


def test_an_undefined_policy_with_none_defined_says_so() -> None:
    source = HEAD + "rules:\n  - {name: r, notify: team-chat, escalate: wake-someone}\n"
    assert problems(source) == [
        'rule "r": escalate: undefined escalation policy "wake-someone"; defined: (none)'
    ]


def test_a_rule_naming_a_broken_policy_is_not_wrong_too() -> None:
    source = policy("steps: [{notify: ops}]") + "rules:\n  - {name: r, escalate: w}\n"
    assert problems(source) == ['escalation "w": steps[1].notify: undefined notifier "ops"']


def test_an_escalate_only_rule_decides_once_and_sends_nothing_itself() -> None:
    rs = rules.load_text(HEAD + GOOD + RULES)
    only, both = rs.by_name["page-only"], rs.by_name["deep-drop"]
    payload = events.sample("score.drop")
    [decision] = only.decisions(only.render(payload), rs.notifiers)
    assert only.notify == () and only.escalate is rs.escalations["wake-someone"]
    assert (decision.rule, decision.notifier, decision.target) == ("page-only", ESCALATE_ONLY, 0)
    assert [d.notifier for d in both.decisions(both.render(payload), rs.notifiers)] == ["team-chat"]


def test_a_new_round_starts_the_last_steps_after_after_the_last_step() -> None:
    """As if the alert had opened again then: round 2's first step comes 15m after round 1's
    last, and its steps keep their spacing."""
    wake = rules.load_text(HEAD + GOOD).escalations["wake-someone"]
    assert [(at, round_, index) for at, round_, index, _ in wake.timeline()] == [
        (0.0, 0, 0),
        (300.0, 0, 1),
        (1200.0, 0, 2),
        (2100.0, 1, 0),
        (2400.0, 1, 1),
        (3300.0, 1, 2),
        (4200.0, 2, 0),
        (4500.0, 2, 1),
        (5400.0, 2, 2),
    ]
    late = Policy("late", (Step(120.0, ("a",)), Step(60.0, ("b",))), repeat=1)
    assert [at for at, *_ in late.timeline()] == [120.0, 180.0, 360.0, 420.0]


def test_a_policy_frozen_as_json_comes_back_the_same() -> None:
    wake = rules.load_text(HEAD + GOOD).escalations["wake-someone"]
    frozen = json.loads(json.dumps(wake.to_json()))
    assert frozen == {
        "name": "wake-someone",
        "steps": [
            {"after": 0.0, "notify": ["team-chat"]},
            {"after": 300.0, "notify": ["schedule:primary"]},
            {"after": 900.0, "notify": ["schedule:primary", "lead-mail"]},
        ],
        "repeat": 2,
        "reack": 1800.0,
    }
    assert Policy.from_json(frozen) == wake
    plain = Policy("plain", (Step(0.0, ("a",)),))
    assert Policy.from_json(json.loads(json.dumps(plain.to_json()))) == plain


def test_describe_lists_each_step_at_its_offset() -> None:
    wake = rules.load_text(HEAD + GOOD).escalations["wake-someone"]
    assert wake.describe() == (
        "wake-someone: +0s team-chat; +5m schedule:primary; +20m schedule:primary, lead-mail"
        " (repeat 2, reack 30m)"
    )
    plain = Policy("plain", (Step(60.0, ("a",)), Step(5400.0, ("b", "c"))))
    assert plain.describe() == "plain: +1m a; +1h31m b, c"


def test_check_shows_the_policy_and_escalate_only_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(HEAD + GOOD + RULES)
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert (
        "escalation wake-someone: +0s team-chat; +5m schedule:primary;"
        " +20m schedule:primary, lead-mail (repeat 2, reack 30m)"
    ) in lines
    assert "  deep-drop -> team-chat (escalate wake-someone)" in lines
    assert "  page-only -> (escalation only) (escalate wake-someone)" in lines


def test_check_reports_policy_problems_without_the_url(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        policy(f"steps: [{{notify: 'slack://{SLACK_BOT_TOKEN}/C0123'}}]\nrepeat: 12")
        + "rules:\n  - {name: r, escalate: w}\n"
    )
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 1
    assert 'escalation "w": steps[1].notify: an apprise url is not allowed here' in result.output
    assert 'escalation "w": repeat: expected a whole number from 0 to 9, got 12' in result.output
    assert SLACK_BOT_TOKEN not in result.output
