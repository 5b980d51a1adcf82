"""The rules engine end to end: the issue's example, the shipped file, routing, explain, secrets."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receiver import rules
from receiver.errors import ConfigError
from receiver.rules import Ruleset, ruleset
from tests.samples import sample

ROOT = Path(__file__).resolve().parents[2]
TESTDATA = Path(__file__).resolve().parents[1] / "testdata"
ISSUE_EXAMPLE = TESTDATA / "rules.issue-example.yaml"

SLACK_BOT_TOKEN = "xoxb-1234-1234-4ddbc191d40ee098cbaae6f3523ada2d"
SLACK_WEBHOOK_TOKEN = "T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ"
ENV = {"SLACK_TOKEN": SLACK_BOT_TOKEN, "SMTP_USER": "alerts", "SMTP_PASS": "s3cret-Pa55word"}


def event(**fields: Any) -> dict[str, Any]:
    return sample(**fields)


def with_rule(rule_yaml: str) -> str:
    """The issue's example with one more rule after deep-drop."""
    return ISSUE_EXAMPLE.read_text() + rule_yaml


ALL_DROPS = "  - name: all-drops\n    match: {type: score.drop}\n    notify: product\n"


# --- the issue's example ------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(SLACK_BOT_TOKEN, id="slack-bot-token"),
        pytest.param(SLACK_WEBHOOK_TOKEN, id="slack-webhook-token"),
    ],
)
def test_issue_example_loads_with_its_environment(token: str) -> None:
    rs = rules.load_file(ISSUE_EXAMPLE, env=ENV | {"SLACK_TOKEN": token})
    assert list(rs.notifiers) == ["oncall", "product", "console"]
    assert rs.notifiers["oncall"].urls == (f"slack://{token}/#oncall",)
    assert rs.notifiers["product"].urls == (
        "mailto://alerts:s3cret-Pa55word@smtp.example.com?to=team@example.com",
    )
    [rule] = rs.rules
    assert (rule.name, rule.notify, rule.throttle_every, rule.continue_) == (
        "deep-drop",
        ("oncall",),
        900.0,
        True,
    )


def test_issue_example_routes_a_deep_drop_of_user_42() -> None:
    rs = rules.load_file(ISSUE_EXAMPLE, env=ENV)
    assert rs.route(event()) == [
        rules.Decision(
            rule="deep-drop",
            notifier="oncall",
            target=0,
            title="Attention dropped: user_42",
            body="Session sess_1 at 20 (threshold 40)",
            throttle_key="sess_1",
            throttle_seconds=900.0,
            fallback=False,
        )
    ]


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(event(userId="user_13"), id="user-13-is-not-matched"),
        pytest.param(event(score=35), id="score-35-is-not-below-30"),
        pytest.param(event(score=30), id="score-30-is-not-below-30"),
        pytest.param(event(type="score.recover"), id="other-type"),
        pytest.param({k: v for k, v in event().items() if k != "userId"}, id="no-user"),
    ],
)
def test_issue_example_leaves_other_events_alone(payload: dict[str, Any]) -> None:
    assert rules.load_file(ISSUE_EXAMPLE, env=ENV).route(payload) == []


def test_continue_lets_later_rules_match_too() -> None:
    rs = rules.load_text(with_rule(ALL_DROPS), env=ENV)
    routed = [(d.rule, d.notifier) for d in rs.route(event())]
    assert routed == [("deep-drop", "oncall"), ("all-drops", "product")]


def test_first_match_wins_without_continue() -> None:
    text = with_rule(ALL_DROPS).replace("continue: true", "continue: false")
    rs = rules.load_text(text, env=ENV)
    assert [d.rule for d in rs.route(event())] == ["deep-drop"]
    # ... and a later rule still catches what the first one does not match.
    assert [d.rule for d in rs.route(event(score=35))] == ["all-drops"]


def test_continue_defaults_to_false() -> None:
    text = "rules:\n  - {name: a, notify: console}\n  - {name: b, notify: console}\n"
    assert [d.rule for d in rules.load_text(text, env={}).route(event())] == ["a"]


def test_one_decision_per_rule_notifier_and_url() -> None:
    text = (
        "notifiers:\n  two: ['console://', 'json://localhost:8080/hook']\n  one: console://\n"
        "rules:\n  - name: r\n    notify: [two, one]\n"
    )
    decisions = rules.load_text(text, env={}).route(event())
    assert [(d.notifier, d.target) for d in decisions] == [("two", 0), ("two", 1), ("one", 0)]
    assert len({(d.title, d.body) for d in decisions}) == 1


def test_console_notifier_is_built_in_unless_the_file_defines_one() -> None:
    rs = rules.load_text("rules: []\n", env={})
    assert rs.notifiers == {"console": rules.Notifier("console", ("console://",))}
    own = rules.load_text("notifiers:\n  console: 'json://localhost/log'\nrules: []\n", env={})
    assert own.notifiers["console"].urls == ("json://localhost/log",)


def test_notify_accepts_one_name_or_a_list() -> None:
    text = (
        "rules:\n  - {name: a, notify: console, continue: true}\n  - {name: b, notify: [console]}\n"
    )
    assert [r.notify for r in rules.load_text(text, env={}).rules] == [("console",), ("console",)]


# --- the shipped rules.yaml ---------------------------------------------------------


def test_default_rules_file_loads_with_an_empty_environment() -> None:
    rs = rules.load_file(ROOT / "rules.yaml", env={})
    assert list(rs.notifiers) == ["console"]
    assert all(r.notify == ("console",) for r in rs.rules)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(event(), id="score-drop"),
        pytest.param(event(type="score.recover", score=60), id="score-recover"),
        pytest.param(
            {
                "id": "e",
                "type": "session.stopped",
                "sessionId": "s",
                "timestamp": "2026-11-21T10:00:00Z",
            },
            id="session-stopped",
        ),
        pytest.param(
            {
                "id": "e",
                "type": "intervention.fired",
                "sessionId": "s",
                "timestamp": "2026-11-21T10:00:00Z",
                "userId": "u",
            },
            id="intervention",
        ),
    ],
)
def test_default_rules_file_sends_every_event_to_the_console(payload: dict[str, Any]) -> None:
    decisions = rules.load_file(ROOT / "rules.yaml", env={}).route(payload)
    assert [(d.notifier, d.fallback) for d in decisions] == [("console", False)]


def test_default_rules_file_examples_are_valid_apprise_urls() -> None:
    """Uncommenting any example notifier gives a file that loads, once its variables are set."""
    lines = (ROOT / "rules.yaml").read_text().splitlines()
    examples = [
        line.replace("  # ", "  ", 1)
        for line in lines
        if re.match(r"  # [a-z]+: ", line) and ("://" in line or '"${' in line)
    ]
    names = {line.split(":")[0].strip() for line in examples}
    assert {
        "slack",
        "email",
        "teams",
        "discord",
        "telegram",
        "ntfy",
        "pagerduty",
        "webhook",
    } <= names
    env = {
        "SLACK_TOKEN": SLACK_BOT_TOKEN,
        "SMTP_USER": "alerts",
        "SMTP_PASS": "pa55",
        "TEAMS_WORKFLOW_URL": "https://prod-00.westeurope.logic.azure.com:443/workflows/abc123/"
        "triggers/manual/paths/invoke?api-version=2016-06-01&sig=SIGabc",
        "TEAMS_WORKFLOW_ID": "abc123",
        "TEAMS_SIGNATURE": "SIGabc",
        "DISCORD_WEBHOOK_ID": "1234567890",
        "DISCORD_WEBHOOK_TOKEN": "abcdefTOKEN",
        "TELEGRAM_BOT_TOKEN": "123456789:AAE_bot-token",
        "TELEGRAM_CHAT_ID": "-1001234567890",
        "NTFY_TOPIC": "attention-alerts",
        "NTFY_TOKEN": "tk_abcdef",
        "PAGERDUTY_INTEGRATION_KEY": "R0UT1NGKEY",
        "PAGERDUTY_API_KEY": "APIKEY",
        "WEBHOOK_TOKEN": "abc",
    }
    for line in examples:  # one at a time: some names appear twice as alternatives
        rs = rules.load_text(f"notifiers:\n{line}\nrules: []\n", env=env)
        assert len(rs.notifiers) == 2, line


# --- explain ------------------------------------------------------------------------


def test_explain_says_why_each_rule_matched_or_not() -> None:
    text = with_rule(ALL_DROPS) + "  - name: last\n    notify: console\n"
    rs = rules.load_text(text, env=ENV)
    explanation = rs.explain(event(userId="user_13", score=45))
    assert [(r.rule, r.status) for r in explanation.rules] == [
        ("deep-drop", "not matched"),
        ("all-drops", "matched"),
        ("last", "not evaluated"),
    ]
    assert [c.reason for c in explanation.rules[0].failed] == [
        "score: 45 is not lt 30",
        'userId: "user_13" does not match regex "^user_(4|5)"',
    ]
    assert explanation.matched == ["all-drops"]
    assert list(explanation.decisions) == rs.route(event(userId="user_13", score=45))
    assert explanation.format() == "\n".join(
        [
            "event evt_1 (score.drop)",
            "1. deep-drop: not matched",
            "     - score: 45 is not lt 30",
            '     - userId: "user_13" does not match regex "^user_(4|5)"',
            "2. all-drops: matched -> product",
            '     + type: "score.drop" is "score.drop"',
            "     title: [all-drops] score.drop for sess_1",
            "     body:  user user_13, session sess_1",
            "            score 45 (threshold 40)",
            "            event evt_1 at 2026-11-21T10:00:00Z",
            '3. last: not evaluated (rule "all-drops" matched and does not continue)',
            "result: 1 notification: all-drops -> product",
        ]
    )


def test_explain_shows_rendered_texts_throttle_and_continue_of_a_match() -> None:
    text = ISSUE_EXAMPLE.read_text().replace('{{ userId }}"', '{{ userId }} {{ nope }}"')
    formatted = rules.load_text(text, env=ENV).explain(event()).format()
    assert "1. deep-drop: matched -> oncall" in formatted
    assert "     + score: 20 is lt 30" in formatted
    assert (
        "     ! template failed (title: 'nope' is undefined); the fallback text is sent"
        in formatted
    )
    assert "     title: [deep-drop] score.drop for sess_1" in formatted
    assert '     throttle: at most one per 15m for key "sess_1"' in formatted
    assert "     continue: later rules are evaluated too" in formatted


def test_explain_reports_a_missing_field() -> None:
    rs = rules.load_file(ISSUE_EXAMPLE, env=ENV)
    payload = {k: v for k, v in event().items() if k != "userId"}
    [outcome] = rs.explain(payload).rules
    assert [c.reason for c in outcome.failed] == ["userId: field missing"]
    assert rs.explain(payload).format().endswith("result: no rule matched; nothing is sent")


# --- summary, digest, repr ----------------------------------------------------------


def test_summary_lists_rules_and_notifiers_by_name() -> None:
    rs = rules.load_text(with_rule(ALL_DROPS), env=ENV, source="rules.yaml")
    assert rs.summary() == "\n".join(
        [
            f"rules.yaml: 2 rules, 3 notifiers (digest {rs.digest})",
            "  deep-drop -> oncall (throttle 15m, continue)",
            "  all-drops -> product",
            "notifiers: oncall (1 url), product (1 url), console (built-in)",
        ]
    )


def test_digest_is_short_stable_and_follows_the_content() -> None:
    text = ISSUE_EXAMPLE.read_text()
    first = rules.load_text(text, env=ENV).digest
    assert re.fullmatch(r"[0-9a-f]{12}", first)
    assert rules.load_text(text, env=ENV | {"SMTP_PASS": "other"}).digest == first
    assert rules.load_text(text + "\n# changed\n", env=ENV).digest != first


# --- secrets ------------------------------------------------------------------------

SECRET = "xoxb-9999-SECRET-tok3n-never-shown"
SECRET_ENV = {"SLACK_TOKEN": SECRET, "SMTP_USER": "u5er-SECRET", "SMTP_PASS": "pa55-SECRET"}


def _assert_no_secret(text: str) -> None:
    for value in SECRET_ENV.values():
        assert value not in text
    assert "slack://" not in text and "mailto://" not in text


def test_no_secret_in_repr_summary_or_explain() -> None:
    rs = rules.load_text(with_rule(ALL_DROPS), env=SECRET_ENV)
    assert repr(rs.notifiers["oncall"]) == "Notifier(name='oncall', urls=<1 url hidden>)"
    for payload in (event(), event(userId="user_13"), {"nothing": 1}):
        explanation = rs.explain(payload)
        _assert_no_secret(explanation.format())
        _assert_no_secret(repr(explanation))
    _assert_no_secret(rs.summary())
    _assert_no_secret(repr(rs))
    _assert_no_secret(repr(rs.notifiers))
    _assert_no_secret(repr(rs.rules))


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(
            SECRET_ENV | {"SLACK_TOKEN": "SECRET/not/a/valid/token/at/all"}, id="unparseable-url"
        ),
        pytest.param({"SLACK_TOKEN": SECRET, "SMTP_PASS": "pa55-SECRET"}, id="variable-unset"),
        pytest.param(SECRET_ENV | {"SMTP_USER": ""}, id="variable-empty"),
    ],
)
def test_no_secret_in_config_errors(env: dict[str, str]) -> None:
    text = with_rule(ALL_DROPS).replace("notify: [oncall]", "notify: [oncall, ops]")
    with pytest.raises(ConfigError) as caught:
        rules.load_text(text, env=env)
    _assert_no_secret(str(caught.value))
    _assert_no_secret(repr(caught.value))
    _assert_no_secret(" ".join(caught.value.problems))
    assert caught.value.__cause__ is None and caught.value.__context__ is None


def test_an_unparseable_url_is_named_by_notifier_and_scheme_only() -> None:
    with pytest.raises(ConfigError) as caught:
        rules.load_file(ISSUE_EXAMPLE, env=ENV | {"SLACK_TOKEN": "SECRET"})
    assert caught.value.problems == [
        'notifier "oncall": apprise cannot parse this url (scheme "slack"); '
        "see https://appriseit.com/services/"
    ]


def test_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    rs = rules.load_file(ISSUE_EXAMPLE)
    assert rs.notifiers["oncall"].urls == (f"slack://{SLACK_BOT_TOKEN}/#oncall",)


INDEXED = """
rules:
  - {name: any, match: {userId: user_1}, notify: console}
  - {name: drops, match: {type: score.drop, score: {lt: 30}}, notify: console}
  - {name: scores, match: {type: "score.*"}, notify: console}
  - {name: by-regex, match: {type: "~^intervention\\\\."}, notify: console}
  - {name: either, match: {type: [session.stopped, score.recover]}, notify: console}
  - {name: not-a-type, match: {type: 3}, notify: console}
  - {name: nested-type, match: {meta.type: x}, notify: console}
"""


@functools.cache
def _indexed() -> Ruleset:
    """INDEXED, loaded once: a load takes about 35 ms, thirty examples' worth."""
    return rules.load_text(INDEXED, env={})


@given(
    kind=st.one_of(
        st.sampled_from(["score.drop", "score.recover", "session.stopped", "intervention.fired"]),
        st.text(max_size=12),
        st.integers(),
        st.none(),
        st.lists(st.sampled_from(["score.drop", "x"]), max_size=2),
    ),
    user=st.sampled_from(["user_1", "user_2"]),
    score=st.integers(0, 60),
    meta=st.sampled_from([{}, {"type": "x"}]),
)
@settings(max_examples=300, deadline=None)
def test_the_index_by_type_matches_exactly_the_rules_tried_in_turn(
    kind: Any, user: str, score: int, meta: dict[str, str]
) -> None:
    rs = _indexed()
    rs._by_type.clear()  # each example starts from an index that remembers nothing
    payload = event(type=kind, userId=user, score=score, meta=meta)
    indexed = [rule.name for rule in rs.matching(payload)]
    assert indexed == [rule.name for rule in rs.rules if rule.matches(payload)]
    # Asked again, the index answers from what it remembered, the same.
    assert [rule.name for rule in rs.matching(payload)] == indexed


def test_the_index_remembers_a_bounded_number_of_types() -> None:
    rs = rules.load_text(INDEXED, env={})
    for n in range(ruleset.MAX_INDEXED_TYPES + 50):
        assert [r.name for r in rs.matching(event(type=f"t{n}", userId="user_1"))] == ["any"]
    assert len(rs._by_type) == ruleset.MAX_INDEXED_TYPES
