"""`receiver oncall`: who is on call in a schedule of rules.yaml, and the next handoffs."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.cli import cli

RULES = Path(__file__).resolve().parents[1] / "testdata" / "rules.schedules.yaml"


def oncall(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["oncall", "--rules", str(RULES), *args])
    return result.exit_code, result.output


def test_oncall_at_a_time_names_the_member_and_the_next_three_handoffs() -> None:
    code, output = oncall("primary", "--at", "2026-12-23T10:00Z")
    assert code == 0, output
    assert output.splitlines() == [
        "primary (weekly at Mon 09:00, Europe/Berlin): alice-chat on call at"
        " Wed 2026-12-23 11:00 CET",
        "  Thu 2026-12-24 00:00 CET  -> carol-mail",
        "  Sun 2026-12-27 00:00 CET  -> alice-chat",
        "  Mon 2026-12-28 09:00 CET  -> bob-chat",
    ]


def test_oncall_without_a_name_lists_every_schedule_now() -> None:
    code, output = oncall()
    assert code == 0, output
    assert output.startswith("primary (weekly at Mon 09:00, Europe/Berlin): ")
    assert len(output.splitlines()) == 4


def test_oncall_of_an_unknown_schedule_names_the_defined_ones() -> None:
    code, output = oncall("secondary")
    assert code == 1
    assert 'Error: unknown schedule "secondary"' in output
    assert "defined: primary" in output


def test_oncall_refuses_a_time_it_cannot_read() -> None:
    code, output = oncall("--at", "christmas")
    assert code == 2
    assert "is not a time" in output


@pytest.mark.parametrize(
    "at",
    [
        pytest.param("9999-12-31T23:00Z", id="past-year-9999-in-the-zone"),
        pytest.param("9999-12-20T00:00Z", id="next-handoffs-past-year-9999"),
        pytest.param("0001-01-01T00:00Z", id="year-1"),
        pytest.param("-62135596800", id="epoch-seconds-of-year-1"),
    ],
)
def test_oncall_at_the_ends_of_the_calendar_is_a_one_line_error(at: str) -> None:
    code, output = oncall("--at", at)
    assert code == 1
    assert output.splitlines() == [
        f'Error: --at {at}: in schedule "primary" (Europe/Berlin) that time or its next '
        "handoffs fall outside the years a date can show (1 to 9999)"
    ]


def test_oncall_says_so_when_the_rules_have_no_schedules(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("notifiers: {}\nrules: []\n")
    result = CliRunner().invoke(cli, ["oncall", "--rules", str(path)])
    assert result.exit_code == 0
    assert result.output == f"{path}: no schedules\n"


def test_explain_shows_who_a_schedule_target_is_on_call_now() -> None:
    result = CliRunner().invoke(
        cli, ["explain", "--rules", str(RULES), "--type", "score.drop", "--no-env"]
    )
    assert result.exit_code == 0, result.output
    assert "deep-drop: matched -> schedule:primary (on call: " in result.output
    assert "schedule:primary" not in result.output.split("result:")[1].splitlines()[0]
