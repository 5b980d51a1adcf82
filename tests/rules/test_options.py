"""The rule key `flap: {changes, within, quiet}`: read into a FlapSpec, each bad value refused
with a message naming the key and saying what is allowed, the pairs it cannot combine with
refused with their reason, by the loader and by `receiver check` alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver import rules
from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.rules.options import FlapSpec

RULE = """
notifiers:
  chat: "json://127.0.0.1:9/chat"
rules:
  - name: r
    match: {{type: score.drop}}
    notify: chat
    {extra}
"""


def test_flap_is_read_and_makes_the_rule_follow_its_alert() -> None:
    rule = rules.load_text(RULE.format(extra="flap: {changes: 4, within: 10m, quiet: 15m}"), env={})
    [found] = rule.rules
    assert found.flap == FlapSpec(4, 600.0, 900.0)
    assert found.follows_alert and rule.flaps
    assert found.flap.text == "4 changes in 10m"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param(
            "flap: 4", 'rule "r": flap: expected a mapping with keys changes, within, quiet',
            id="not-a-mapping",
        ),
        pytest.param(
            "flap: {changes: 4}",
            "rule \"r\": flap: 'within', 'quiet' required, as in {changes: 4, within: 10m,"
            " quiet: 15m}",
            id="missing",
        ),
        pytest.param(
            "flap: {changes: 1, within: 10m, quiet: 15m}",
            'rule "r": flap.changes: expected a whole number from 2 to 1000, got 1',
            id="one-change",
        ),
        pytest.param(
            "flap: {changes: 4, within: soon, quiet: 15m}",
            'rule "r": flap.within: invalid duration "soon"', id="bad-within",
        ),
        pytest.param(
            "flap: {changes: 4, within: 10m, quiet: 0s}",
            'rule "r": flap.quiet: expected a duration such as 90s, 15m, 1h30m, got "0s"',
            id="zero-quiet",
        ),
        pytest.param(
            "flap: {changes: 4, within: 10m, quiet: 15m, every: 1m}",
            'rule "r": flap: unknown key "every"; allowed: changes, within, quiet',
            id="unknown-key",
        ),
        pytest.param(
            "flap: {changes: 4, within: 10m, quiet: 15m}\n    group: {by: [type]}",
            'rule "r": flap: a rule that groups events into digests sends one message for many'
            " alerts, never one alert's notification",
            id="group",
        ),
        pytest.param(
            "flap: {changes: 4, within: 10m, quiet: 15m}\n    throttle: {every: 1h}",
            'rule "r": throttle: flap already holds back an alert\'s messages while it flaps',
            id="throttle",
        ),
    ],
)  # fmt: skip
def test_a_bad_flap_is_refused_naming_the_key(tmp_path: Path, extra: str, message: str) -> None:
    text = RULE.format(extra=extra)
    with pytest.raises(ConfigError, match=re.escape(message)):
        rules.load_text(text, env={})
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    checked = CliRunner().invoke(cli, ["check", str(path)])
    assert checked.exit_code == 1 and message in " ".join(checked.output.split())
