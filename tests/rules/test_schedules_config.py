"""rules.yaml `schedules:` validation: each bad schedule is refused with a message naming the
schedule and the key; `schedule:NAME` targets must name a schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from receiver import rules
from receiver.errors import ConfigError

TESTDATA = Path(__file__).resolve().parents[1] / "testdata"

HEAD = """\
notifiers:
  alice-chat: json://127.0.0.1:9/a
  bob-chat: json://127.0.0.1:9/b
"""
GOOD = {
    "timezone": "Europe/Berlin",
    "rotation": "weekly",
    "handoff": '"Mon 09:00"',
    "start": "2026-11-30",
    "members": "[alice-chat, bob-chat]",
}
RULE = "rules:\n  - {name: deep-drop, notify: schedule:primary}\n"


def text(rule: str = RULE, **changes: str | None) -> str:
    spec = {**GOOD, **changes}
    lines = [f"    {key}: {value}" for key, value in spec.items() if value is not None]
    return HEAD + "schedules:\n  primary:\n" + "\n".join(lines) + "\n" + rule


def problems(source: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        rules.load_text(source)
    return caught.value.problems


def test_the_issue_example_loads_and_names_its_schedule() -> None:
    rs = rules.load_file(TESTDATA / "rules.schedules.yaml")
    assert list(rs.schedules) == ["primary"]
    assert rs.heartbeat is not None and rs.heartbeat.notify == ("schedule:primary",)
    assert "schedule primary: weekly at Mon 09:00 Europe/Berlin" in rs.summary()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            {"shift": "8h"},
            'schedule "primary": unknown key "shift"; allowed: timezone, rotation, handoff, start,'
            " members, overrides",
            id="unknown-key",
        ),
        pytest.param(
            {"timezone": "Europe/Berln"},
            'schedule "primary": timezone: unknown zone "Europe/Berln"; use an IANA name',
            id="unknown-zone",
        ),
        pytest.param(
            {"timezone": None}, 'schedule "primary": missing required key "timezone"', id="no-zone"
        ),
        pytest.param(
            {"rotation": "fortnightly"},
            'schedule "primary": rotation: invalid duration "fortnightly"',
            id="bad-rotation",
        ),
        pytest.param(
            {"rotation": "30m", "handoff": '"09:00"'},
            'schedule "primary": rotation: "30m" is shorter than 1h',
            id="rotation-too-short",
        ),
        pytest.param(
            {"handoff": '"09:00"'},
            'schedule "primary": handoff: a weekly rotation hands off on a day and time such as'
            ' "Mon 09:00"',
            id="weekly-handoff-without-day",
        ),
        pytest.param(
            {"rotation": "daily"},
            'schedule "primary": handoff: only a weekly rotation names a day',
            id="daily-handoff-with-day",
        ),
        pytest.param(
            {"handoff": '"Mon 25:00"'},
            'schedule "primary": handoff: expected a local time such as "Mon 09:00",'
            ' got "Mon 25:00"',
            id="bad-hour",
        ),
        pytest.param(
            {"handoff": '"Monday 09:00"'},
            'schedule "primary": handoff: expected a local time such as "Mon 09:00"',
            id="bad-day",
        ),
        pytest.param(
            {"start": "next-week"},
            'schedule "primary": start: expected a date such as 2026-11-30, got "next-week"',
            id="bad-start",
        ),
        pytest.param(
            {"members": "[alice-chat, ops]"},
            'schedule "primary": members: undefined notifier "ops"; defined: alice-chat, bob-chat,'
            " console",
            id="member-not-a-notifier",
        ),
        pytest.param(
            {"members": "[]"},
            'schedule "primary": members: expected a non-empty list of notifier names',
            id="no-members",
        ),
        pytest.param(
            {"overrides": '[{from: "2026-12-27T00:00", to: "2026-12-24T00:00", member: bob-chat}]'},
            'schedule "primary": overrides[0]: to "2026-12-24T00:00" is not after from'
            ' "2026-12-27T00:00"',
            id="inverted-override",
        ),
        pytest.param(
            {
                "overrides": '[{from: "2026-12-24T00:00", to: "2026-12-27T00:00",'
                ' member: bob-chat}, {from: "2026-12-26T00:00", to: "2026-12-28T00:00",'
                " member: alice-chat}]"
            },
            'schedule "primary": overrides: 2026-12-26T00:00..2026-12-28T00:00 (alice-chat)'
            " overlaps 2026-12-24T00:00..2026-12-27T00:00 (bob-chat); overrides must not overlap",
            id="overlapping-overrides",
        ),
        pytest.param(
            {"overrides": '[{from: "2026-12-24T00:00", to: "2026-12-27T00:00", who: bob-chat}]'},
            'schedule "primary": overrides[0]: unknown key "who"; allowed: from, to, member',
            id="override-unknown-key",
        ),
        pytest.param(
            {"overrides": '[{from: "2026-12-24T00:00", to: "2026-12-27T00:00", member: ops}]'},
            'schedule "primary": overrides[0].member: undefined notifier "ops"',
            id="override-member-not-a-notifier",
        ),
        pytest.param(
            {"overrides": '[{from: "Christmas", to: "2026-12-27T00:00", member: bob-chat}]'},
            'schedule "primary": overrides[0].from: expected a local date and time such as'
            ' "2026-12-24T00:00", got "Christmas"',
            id="override-bad-time",
        ),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_key(
    changes: dict[str, str | None], message: str
) -> None:
    found = problems(text(**changes))
    assert any(p.startswith(message) for p in found), found


def test_an_undefined_schedule_target_is_an_error_naming_both() -> None:
    rule = "rules:\n  - {name: deep-drop, notify: [schedule:secondary]}\n"
    assert problems(text(rule)) == [
        'undefined schedule "secondary" used in rule "deep-drop"; defined schedules: primary'
    ]


def test_an_undefined_schedule_in_the_heartbeat_is_an_error() -> None:
    source = HEAD + "heartbeat: {silent_for: 1h, notify: schedule:primary}\n"
    assert problems(source) == [
        'undefined schedule "primary" used in heartbeat; defined schedules: (none)'
    ]


def test_a_rule_naming_a_broken_schedule_is_not_wrong_too() -> None:
    assert problems(text(timezone="Mars/Olympus")) == [
        'schedule "primary": timezone: unknown zone "Mars/Olympus"; use an IANA name such as'
        " Europe/Berlin"
    ]


def test_schedules_must_be_a_mapping() -> None:
    found = problems(HEAD + "schedules: [primary]\n")
    assert found == ['schedules: expected a mapping of schedule names, got ["primary"]']


def test_check_reports_schedule_problems(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from receiver.cli import cli

    path = tmp_path / "rules.yaml"
    path.write_text(text(timezone="Europe/Berln"))
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 1
    assert 'schedule "primary": timezone: unknown zone "Europe/Berln"' in result.output
