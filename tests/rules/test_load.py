"""rules.yaml validation: each bad file in tests/testdata is refused, naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from receiver import rules
from receiver.errors import ConfigError

TESTDATA = Path(__file__).resolve().parents[1] / "testdata"
SLACK_BOT_TOKEN = "xoxb-1234-1234-4ddbc191d40ee098cbaae6f3523ada2d"


def _file(case: str) -> Path:
    return TESTDATA / f"rules.{case}.yaml"


def _param(case: str, message: str, env: dict[str, str] | None = None) -> object:
    return pytest.param(case, message, env or {}, id=case)


@pytest.mark.parametrize(
    ("case", "message", "env"),
    [
        _param("yaml-syntax", "yaml syntax error at line 4, column 9: expected ',' or ']'"),
        _param(
            "yaml-duplicate-key", 'yaml syntax error at line 4, column 5: duplicate key "notify"'
        ),
        _param("empty", "the file is empty; expected a mapping with keys notifiers, rules"),
        _param("top-level-list", "expected a mapping with keys notifiers, rules at the top level"),
        _param(
            "unknown-top-level-key",
            'unknown top-level key "routes"; '
            "allowed: notifiers, rules, heartbeat, schedules, escalations, inhibit, maintenance",
        ),
        _param("rules-not-a-list", "rules: expected a list of rules, got a mapping"),
        _param(
            "notifiers-not-a-mapping",
            "notifiers: expected a mapping of notifier names to apprise urls, got a list",
        ),
        _param(
            "unknown-rule-key",
            'rule "deep-drop": unknown key "notfy"; '
            "allowed: name, match, notify, title, body, throttle, continue",
        ),
        _param(
            "unknown-throttle-key",
            'rule "deep-drop": throttle: unknown key "per"; allowed: key, every',
        ),
        _param(
            "missing-throttle-every", 'rule "deep-drop": throttle: missing required key "every"'
        ),
        _param(
            "bad-duration",
            'rule "deep-drop": throttle.every: invalid duration "15 minutes"; '
            "expected whole numbers with units d, h, m, s",
        ),
        _param("zero-duration", 'rule "deep-drop": throttle.every: duration "0s" is zero'),
        _param(
            "undefined-notifier",
            'undefined notifier "ops" used in rule "deep-drop"; defined: oncall, console',
        ),
        _param(
            "duplicate-rule-name",
            'rule "deep-drop": duplicate rule name "deep-drop"; rule names must be unique',
        ),
        _param("missing-name", 'rule #1: missing required key "name"'),
        _param("invalid-rule-name", 'rule "deep drop!": name: invalid name; allowed: letters'),
        _param("rule-not-a-mapping", "rule #1: expected a mapping with keys name, match, notify"),
        _param("missing-notify", 'rule "deep-drop": missing required key "notify"'),
        _param(
            "empty-notify",
            'rule "deep-drop": notify: expected a notifier name or a non-empty list of them',
        ),
        _param("notify-twice", 'rule "deep-drop": notify: notifier "console" is listed twice'),
        _param("url-in-notify", 'rule "deep-drop": notify: an apprise url is not allowed here'),
        _param(
            "continue-not-bool",
            'rule "deep-drop": continue: expected true or false, got "sometimes"',
        ),
        _param("title-not-string", 'rule "deep-drop": title: expected a template string, got'),
        _param(
            "match-not-mapping",
            'rule "deep-drop": match: expected a mapping of payload fields to conditions',
        ),
        _param(
            "bad-regex",
            'rule "deep-drop": match.userId: invalid regex "^user_(": missing )',
        ),
        _param("empty-regex", 'rule "deep-drop": match.userId: empty regex "~"'),
        _param(
            "unknown-operator",
            'rule "deep-drop": match.score: unknown operator "less"; '
            "allowed: lt, lte, gt, gte, eq, between",
        ),
        _param(
            "empty-operator-mapping",
            'rule "deep-drop": match.score: empty operator mapping; allowed: lt, lte',
        ),
        _param(
            "operator-not-number", 'rule "deep-drop": match.score: lt: expected a number, got "30"'
        ),
        _param(
            "between-one-number",
            'rule "deep-drop": match.score: between: expected two numbers [low, high], got [10]',
        ),
        _param(
            "between-not-numbers",
            'rule "deep-drop": match.score: between: expected two numbers [low, high]',
        ),
        _param(
            "between-reversed", 'rule "deep-drop": match.score: between: low 40 is above high 10'
        ),
        _param(
            "match-null-value", 'rule "deep-drop": match.userId: null is not a condition; allowed'
        ),
        _param("match-empty-list", 'rule "deep-drop": match.type: empty list matches nothing'),
        _param(
            "match-nested-list", 'rule "deep-drop": match.type: a nested list is not a condition'
        ),
        _param(
            "match-bad-field-path",
            'rule "deep-drop": match: field name "meta..page" is not allowed',
        ),
        _param(
            "title-syntax", 'rule "deep-drop": title: template syntax error at line 1: unexpected'
        ),
        _param(
            "body-unknown-filter",
            "rule \"deep-drop\": body: template syntax error at line 1: no filter named 'nope'",
        ),
        _param(
            "throttle-key-syntax", 'rule "deep-drop": throttle.key: template syntax error at line 1'
        ),
        _param("empty-body", 'rule "deep-drop": body: empty template; omit it for the default'),
        _param(
            "env-var-unset",
            'notifier "oncall": environment variable SLACK_TOKEN is not set',
        ),
        _param(
            "env-var-empty",
            'notifier "oncall": environment variable SLACK_TOKEN is empty',
            {"SLACK_TOKEN": ""},
        ),
        _param("env-var-invalid", 'notifier "oncall": invalid variable reference "${1TOKEN}"'),
        _param(
            "url-unparseable",
            'notifier "oncall": apprise cannot parse this url (scheme "slack")',
            {"SLACK_TOKEN": "not-a-slack-token"},
        ),
        _param(
            "url-unknown-scheme",
            'notifier "oncall": url #2: no channel takes this url (scheme "slak"); the channels:'
            " webhook (subscribers of POST /v1/webhooks, no notifier url); ntfy (ntfy://,"
            " ntfys://); slack-app (slack-app://); notify (every scheme apprise knows, see"
            " https://appriseit.com/services/)",
        ),
        _param(
            "notifier-empty-list",
            'notifier "oncall": expected an apprise url or a non-empty list of them',
        ),
        _param("notifier-invalid-name", 'notifier "on call": invalid name; allowed: letters'),
    ],
)
def test_bad_file_is_refused_with_a_message_naming_the_key(
    case: str, message: str, env: dict[str, str]
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        rules.load_file(_file(case), env=env)
    assert caught.value.source == str(_file(case))
    # Messages are lowercase at the start, Alertmanager style.
    assert all(p[:1] == p[:1].lower() for p in caught.value.problems)


def test_every_problem_in_a_file_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        rules.load_file(_file("many-problems"), env={})
    assert caught.value.problems == [
        'unknown top-level key "extra"; '
        "allowed: notifiers, rules, heartbeat, schedules, escalations, inhibit, maintenance",
        'notifier "oncall": environment variable SLACK_TOKEN is not set',
        'rule "deep-drop": match.score: unknown operator "less"; '
        "allowed: lt, lte, gt, gte, eq, between",
        'rule "deep-drop": match.userId: invalid regex "(": '
        "missing ), unterminated subpattern at position 0",
        'undefined notifier "ops" used in rule "deep-drop"; defined: oncall, console',
        'rule "deep-drop": throttle.every: invalid duration "soon"; expected whole numbers '
        "with units d, h, m, s in that order, e.g. 90s, 15m, 2h, 1d, 1h30m",
        'rule "deep-drop": title: template syntax error at line 1: '
        "unexpected end of template, expected 'end of print statement'",
        'rule "deep-drop": unknown key "colour"; '
        "allowed: name, match, notify, title, body, throttle, continue, hold, resolve, "
        "resolved_title, resolved_body, group, repeat, active, storm, flap, escalate",
        'rule "deep-drop": duplicate rule name "deep-drop"; rule names must be unique',
    ]
    assert str(caught.value).startswith(f"{_file('many-problems')}: 9 problems:\n  - ")


def test_a_notifier_with_a_problem_still_counts_as_defined_for_rules() -> None:
    with pytest.raises(ConfigError) as caught:
        rules.load_file(_file("env-var-unset"), env={})
    assert not any("undefined notifier" in p for p in caught.value.problems)


def test_missing_file_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot read rules file: no such file or directory"):
        rules.load_file(TESTDATA / "rules.does-not-exist.yaml")


@pytest.mark.parametrize(
    ("text", "count"),
    [
        pytest.param("rules: []\n", 0, id="empty-rules-list"),
        pytest.param("notifiers:\nrules:\n", 0, id="null-sections"),
        pytest.param("rules:\n  - name: all\n    notify: console\n", 1, id="name-and-notify-only"),
        pytest.param(
            "rules:\n  - name: all\n    notify: console\n    match:\n    title:\n",
            1,
            id="null-match-and-title-take-defaults",
        ),
    ],
)
def test_minimal_files_load(text: str, count: int) -> None:
    assert len(rules.load_text(text, env={}).rules) == count


def test_yaml_python_tags_are_refused() -> None:
    with pytest.raises(ConfigError, match="yaml syntax error at line 1"):
        rules.load_text("rules: !!python/object/apply:os.system ['true']\n", env={})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("90s", 90.0, id="seconds"),
        pytest.param("15m", 900.0, id="minutes"),
        pytest.param("2h", 7200.0, id="hours"),
        pytest.param("1d", 86400.0, id="days"),
        pytest.param("1h30m", 5400.0, id="hours-and-minutes"),
        pytest.param("1d2h3m4s", 93784.0, id="every-unit"),
        pytest.param(" 5m ", 300.0, id="surrounding-space"),
    ],
)
def test_parse_duration_reads_units(text: str, seconds: float) -> None:
    assert rules.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("15", id="no-unit"),
        pytest.param("1.5h", id="fraction"),
        pytest.param("30m1h", id="wrong-order"),
        pytest.param("15 minutes", id="words"),
        pytest.param("-5m", id="negative"),
        pytest.param("5m5m", id="unit-twice"),
    ],
)
def test_parse_duration_refuses_other_spellings(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f'invalid duration "{text}"')):
        rules.parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(0, "0s", id="zero"),
        pytest.param(5400, "1h30m", id="hours-and-minutes"),
        pytest.param(90061, "1d1h1m1s", id="every-unit"),
    ],
)
def test_format_duration_is_the_inverse_of_parse(seconds: float, text: str) -> None:
    assert rules.format_duration(seconds) == text
    assert rules.parse_duration(text) == seconds
