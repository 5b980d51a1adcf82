"""`receiver alerts ack|resolve|snooze ID`: each answers in words, says "already" when there
is nothing left to do, and is recorded with source cli."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from receiver.cli import cli
from receiver.store import open_store
from receiver.store.base import Tx
from receiver.store.records import Alert

RULES = """
notifiers:
  hook: "json://127.0.0.1:9/hook"
rules:
  - name: drop
    match: {type: score.drop}
    notify: hook
    resolve: true
"""


def _store(db: Path, fn: Any) -> Any:
    async def go() -> Any:
        store = open_store(str(db))
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(go())


def _open_alerts(db: Path) -> None:
    def opened(tx: Tx) -> None:
        for sid in ("s1", "s2", "s3"):
            tx.alerts.save(
                Alert(f"session:{sid}", "open", 1, "2026-01-01T00:00:01Z", "t", "e"), 1.0
            )

    _store(db, lambda store: store.transact(opened))


def invoke(db: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["alerts", *args, "--db", str(db), "--by", "ana"])


def test_ack_resolve_and_snooze_from_the_command_line(tmp_path: Path) -> None:
    db = tmp_path / "receiver.db"
    _open_alerts(db)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)

    first = invoke(db, "ack", "session:s1")
    assert first.exit_code == 0 and first.output == "session:s1 acknowledged\n"
    again = invoke(db, "ack", "session:s1")
    assert again.exit_code == 0
    assert again.output.startswith("session:s1 was acknowledged already, by ana at ")

    resolved = invoke(db, "resolve", "session:s2", "--rules", str(rules))
    assert (resolved.exit_code, resolved.output) == (0, "session:s2 resolved\n")
    twice = invoke(db, "resolve", "session:s2", "--rules", str(rules))
    assert twice.output == "session:s2 is resolved already\n"

    snoozed = invoke(db, "snooze", "session:s3", "--for", "2h")
    assert (snoozed.exit_code, snoozed.output) == (0, "session:s3 snoozed for 2h\n")
    bad = invoke(db, "snooze", "session:s3", "--for", "soon")
    assert bad.exit_code == 2 and "--for" in bad.output

    missing = invoke(db, "ack", "session:nope")
    assert missing.exit_code == 1
    assert missing.output == "Error: no alert 'session:nope' (see: receiver alerts)\n"

    actions = _store(db, lambda s: s.alerts.actions(["session:s1", "session:s2", "session:s3"]))
    assert [(a.alert, a.action, a.source, a.actor, a.outcome) for a in actions] == [
        ("session:s1", "ack", "cli", "ana", "done"),
        ("session:s1", "ack", "cli", "ana", "already"),
        ("session:s2", "resolve", "cli", "ana", "done"),
        ("session:s2", "resolve", "cli", "ana", "already"),
        ("session:s3", "snooze", "cli", "ana", "done"),
    ]
