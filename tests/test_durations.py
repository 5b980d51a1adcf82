"""Durations a person types for a silence or a report period are capped at a year, with
an error that says so, in the CLI as on the admin page (tests/admin/test_views.py); the
pure parser refuses what no number of seconds can hold."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.cli import cli
from receiver.cli._common import with_store
from receiver.durations import MAX_SPAN, parse_duration


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("366d", id="a-day-too-many"),
        pytest.param("99999999999d", id="the-issue's"),
        pytest.param("9" * 400 + "d", id="past-a-float"),
        pytest.param("364d24h1s", id="summed"),
    ],
)
def test_a_span_over_a_year_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is longer than the limit of 365d"):
        parse_duration(text, limit=MAX_SPAN)


def test_a_year_is_allowed_and_no_limit_still_refuses_the_absurd() -> None:
    assert parse_duration("365d", limit=MAX_SPAN) == MAX_SPAN
    assert parse_duration("400d") == 400 * 86400.0  # rules.yaml and settings: no cap
    with pytest.raises(ValueError, match="is too long"):
        parse_duration("9" * 400 + "d")


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["silence", "add", "--match", "userId=u", "--for", "99999999999d",
                      "--reason", "typo"], id="silence-for"),
        pytest.param(["report", "--since", "99999999d"], id="report-since"),
        pytest.param(["backtest", "rules.yaml", "--since", "400d"], id="backtest-since"),
    ],
)  # fmt: skip
def test_the_cli_refuses_a_span_over_a_year(tmp_path: Path, args: list[str]) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("notifiers: {}\nrules: []\n")
    args = [str(rules) if a == "rules.yaml" else a for a in args]
    result = CliRunner().invoke(cli, [*args, "--db", str(tmp_path / "r.db")])
    assert result.exit_code == 2, result.output
    assert "is longer than the limit of 365d" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("value", ["1e20", "1e12", "-1e20", "inf", "nan"])
def test_report_refuses_a_time_no_date_can_show(tmp_path: Path, value: str) -> None:
    result = CliRunner().invoke(cli, ["report", "--from", value, "--db", str(tmp_path / "r.db")])
    assert result.exit_code == 2, result.output
    assert "is not a time a date can show" in result.output


def test_silence_list_shows_a_stored_end_no_date_can_show(tmp_path: Path) -> None:
    """A silence written before the cap (here through the store) lists, expires, and is
    pruned once expired."""
    db = str(tmp_path / "r.db")
    sid = with_store(
        db,
        lambda s: s.transact(lambda tx: tx.silences.add({"userId": "u"}, "odd", 1.0, 1e18)),
        create=True,
    )
    listed = CliRunner().invoke(cli, ["silence", "list", "--db", db])
    assert listed.exit_code == 0, listed.output
    assert f"#{sid}  userId=u  active until after 9999  (odd)" in listed.output
    expired = CliRunner().invoke(cli, ["silence", "expire", str(sid), "--db", db])
    assert expired.exit_code == 0, expired.output
    assert "expired" in CliRunner().invoke(cli, ["silence", "list", "--all", "--db", db]).output
    # Expired, it ends now: retention prunes it as any ended silence.
    with_store(db, lambda s: s.events.prune(time.time() + 1, limit=100))
    assert with_store(db, lambda s: s.transact(lambda tx: tx.silences.recent())) == []
