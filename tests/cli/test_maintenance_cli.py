"""`receiver maintenance`: the next stretches of the rules' windows, local and UTC, from
--at, across a DST change and one-off dates; an unknown window named is refused."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from receiver.cli import cli

RULES = """
notifiers:
  team-chat: "json://127.0.0.1:9/chat"
maintenance:
  - name: weekly-deploy
    match: {cohort: beta}
    timezone: Europe/Berlin
    every: ["Sat 22:00-Sun 02:00", "Wed 12:00-12:30"]
    dates: ["2026-12-24..2026-12-26"]
    notify: [team-chat]
  - name: nightly
    timezone: America/New_York
    every: ["Mon 01:00-01:30"]
"""


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    result = CliRunner().invoke(cli, ["maintenance", "--rules", str(path), *args])
    return result.exit_code, result.output


def test_lists_the_next_windows_local_and_utc(tmp_path: Path) -> None:
    code, out = run(tmp_path, "weekly-deploy", "--at", "2026-12-23T00:00Z", "-n", "3")
    assert code == 0, out
    assert out.splitlines() == [
        "weekly-deploy  Wed 2026-12-23 12:00 CET - Wed 2026-12-23 12:30 CET"
        "  (2026-12-23T11:00:00Z - 2026-12-23T11:30:00Z)",
        # The dates run into the Saturday night range: one stretch.
        "weekly-deploy  Thu 2026-12-24 00:00 CET - Sun 2026-12-27 02:00 CET"
        "  (2026-12-23T23:00:00Z - 2026-12-27T01:00:00Z)",
        "weekly-deploy  Wed 2026-12-30 12:00 CET - Wed 2026-12-30 12:30 CET"
        "  (2026-12-30T11:00:00Z - 2026-12-30T11:30:00Z)",
    ]


def test_every_window_soonest_first_as_json_across_dst(tmp_path: Path) -> None:
    # Berlin leaves summer time on Oct 25, New York on Nov 1: the local times stay.
    code, out = run(tmp_path, "--at", "2026-10-24T00:00Z", "-n", "4", "--json")
    assert code == 0, out
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["name"], r["start"], r["start_utc"]) for r in rows] == [
        ("weekly-deploy", "Sat 2026-10-24 22:00 CEST", "2026-10-24T20:00:00Z"),
        ("nightly", "Mon 2026-10-26 01:00 EDT", "2026-10-26T05:00:00Z"),
        ("weekly-deploy", "Wed 2026-10-28 12:00 CET", "2026-10-28T11:00:00Z"),
        ("weekly-deploy", "Sat 2026-10-31 22:00 CET", "2026-10-31T21:00:00Z"),
    ]
    assert rows[1]["timezone"] == "America/New_York"


def test_a_window_in_force_is_listed_first(tmp_path: Path) -> None:
    code, out = run(tmp_path, "weekly-deploy", "--at", "2026-12-25T12:00Z", "-n", "1")
    assert code == 0 and "Thu 2026-12-24 00:00 CET - Sun 2026-12-27 02:00 CET" in out


def test_an_unknown_window_is_refused(tmp_path: Path) -> None:
    code, out = run(tmp_path, "weekly")
    assert code != 0
    assert 'unknown maintenance window "weekly"' in out and "defined: weekly-deploy, nightly" in out
