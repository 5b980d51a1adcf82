"""`receiver silence add --until-resolved [--after 5m]` from the command line: it names the
open alerts it ends with, `silence list` says how it ends, and the options that do not go
together are refused naming the option; the admin page's form makes the same silence."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from click.testing import CliRunner

from receiver import events
from receiver.cli import cli
from receiver.events import iso_epoch
from tests.admin.test_views import RULES, running, until
from tests.servers import HTTPSink


def test_the_cli_and_the_admin_form_add_silences_that_end_with_their_alerts(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    db = str(tmp_path / "receiver.db")

    async def main() -> None:
        async with running(tmp_path, http_sink.json_url("/hook"), rules_text=RULES) as admin:
            stamp = iso_epoch(time.time())
            await admin.send(events.sample("score.drop", id="d1", sessionId="s1", timestamp=stamp))
            await until(lambda: admin.store.alerts.get("session:s1"), "the alert to open")
            made = await admin.post(
                "/admin/silences",
                {"matchers": "sessionId=s1", "duration": "2h", "reason": "form",
                 "until_resolved": "1", "after": "10m"},
            )  # fmt: skip
            assert made.status_code == 303, made.text[:300]
            page = await admin.page("/admin/silences")
            assert "until resolved (after 10m, 1 alert)" in page

    asyncio.run(main())
    runner = CliRunner()
    args = ["silence", "add", "--db", db, "--match", "sessionId=s*", "--reason", "known"]
    added = runner.invoke(cli, [*args, "--until-resolved"])
    assert added.exit_code == 0, added.output
    assert "until resolved (after 5m; at most until" in added.output
    assert "ends with 1 open alert: session:s1" in added.output
    listed = runner.invoke(cli, ["silence", "list", "--db", db])
    assert "active until resolved (after 5m, 1 alert; at most until" in listed.output
    for extra, message in (
        ([], "Invalid value for --for: required (or --until-resolved)"),
        (["--for", "1h", "--after", "5m"], "Invalid value for --after: only with"),
        (["--until-resolved", "--after", "soon"], "Invalid value for --after: invalid duration"),
    ):  # fmt: skip
        refused = runner.invoke(cli, [*args, *extra])
        assert refused.exit_code == 2 and message in refused.output, refused.output
