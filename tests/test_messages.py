"""Validation messages are in our words: never a library's ("unable to extract tag using
discriminator", "sys.set_int_max_str_digits", a bare ValueError traceback)."""

import json
import sys

import pytest

from receiver import events, rules
from receiver.errors import ConfigError, InvalidEventError, InvalidJSONError

LIMIT = sys.get_int_max_str_digits()


def test_an_event_without_a_type_names_the_field_and_the_types() -> None:
    body = json.dumps({"id": "e1", "sessionId": "s", "timestamp": "2026-11-23T10:00:00Z"})
    with pytest.raises(InvalidEventError) as caught:
        events.parse(body.encode())
    assert str(caught.value) == (
        "type: field required; one of score.drop, score.recover, session.stopped,"
        " intervention.fired, intervention.resolved"
    )


def test_a_number_with_too_many_digits_says_so_plainly() -> None:
    body = b'{"id": "e1", "type": "score.drop", "score": ' + b"7" * (LIMIT + 1) + b"}"
    with pytest.raises(InvalidJSONError) as caught:
        events.parse(body)
    assert str(caught.value) == (
        f"body is not acceptable JSON: a number has {LIMIT + 1} digits; at most {LIMIT} are allowed"
    )


def test_rules_yaml_values_python_cannot_build_are_config_errors() -> None:
    huge = "rules:\n  - name: a\n    notify: console\n    match: {score: " + "9" * 5000 + "}\n"
    with pytest.raises(ConfigError) as caught:
        rules.load_text(huge)
    assert str(caught.value) == (
        f"rules.yaml: yaml value error: a number has 5000 digits; at most {LIMIT} are allowed"
    )
    bad_date = "rules:\n  - name: a\n    notify: console\n    match: {day: 2026-13-45}\n"
    with pytest.raises(ConfigError, match="yaml value error: month must be in 1..12"):
        rules.load_text(bad_date)
