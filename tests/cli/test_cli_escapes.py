"""Values from events reach the terminal escaped: an event id cannot set the window title,
clear the screen or start a line of its own in any CLI listing (issue 28, item 11)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from receiver import events
from receiver.cli import cli
from tests.harness import Receiver, signed

pytestmark = pytest.mark.e2e

# Sets the window title, rings the bell, clears the screen, then forges a line.
HOSTILE = "evt_\x1b]0;pwned\x07\x1b[2J\x1b[31m[bold]x[/bold]\nFORGED LINE\u202e"
SESSION = "sess_\x1b[2Jclear"
USER = "user_\r\x9bowned"
# Characters that act on a terminal or start a line (C0 except the newline we print
# ourselves, DEL, C1, line separators, bidi overrides).
_RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """A receiver that took one score.drop with hostile id, session and user, sent it to
    the console, and opened its alert; then stopped, so the CLI reads its database."""
    server = Receiver(tmp_path_factory.mktemp("escapes")).start()
    try:
        event = events.sample("score.drop", id=HOSTILE, sessionId=SESSION, userId=USER)
        body = json.dumps(event).encode()
        assert server.post(body, signed(body)).status_code == 202
        deadline = time.monotonic() + 30
        while "delivered" not in run(server, "deliveries", "--json"):
            assert time.monotonic() < deadline, "the console notification was never sent"
            time.sleep(0.1)
    finally:
        server.stop()
    yield server


def run(server: Receiver, *args: str) -> str:
    result = CliRunner().invoke(cli, [*args, "--db", str(server.db)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def assert_escaped(out: str) -> None:
    assert _RAW.search(out) is None, repr(out)
    assert "\nFORGED LINE" not in out


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("deliveries",), id="deliveries"),
        pytest.param(("alerts",), id="alerts"),
        pytest.param(("report", "--since", "1d"), id="report"),
        pytest.param(("replay", HOSTILE, "--wait", "0"), id="replay"),
    ],
)
def test_event_values_are_escaped_in_cli_listings(stored: Receiver, args: tuple[str, ...]) -> None:
    out = run(stored, *args)
    assert_escaped(out)
    if args[0] != "report":
        assert "\\x1b]0;pwned\\x07" in out  # shown, as logs show it


def test_the_deliveries_table_shows_brackets_as_written(stored: Receiver) -> None:
    """rich would read [bold] in an id as markup and drop it."""
    assert "[bold]" in run(stored, "deliveries").replace("\n", "")


def test_silence_reasons_and_matchers_are_escaped(stored: Receiver) -> None:
    run(
        stored,
        "silence",
        "add",
        "--match",
        f"userId={USER}",
        "--for",
        "1h",
        "--reason",
        "x\x1b[2Jy",
    )
    out = run(stored, "silence", "list")
    assert_escaped(out)
    assert "x\\x1b[2Jy" in out


def test_json_output_stays_json(stored: Receiver) -> None:
    for line in run(stored, "deliveries", "--json").splitlines():
        assert json.loads(line)["event_id"] == HOSTILE


def test_explain_escapes_the_event_id_and_values(stored: Receiver) -> None:
    out = run(stored, "explain", "--id", HOSTILE, "--user", USER, "--rules", str(stored.rules))
    assert_escaped(out)
    assert out.startswith("event evt_\\x1b]0;pwned\\x07")


def test_a_subscribers_answer_is_escaped_in_webhook_listings(
    stored: Receiver, tmp_path: Path
) -> None:
    """A delivery's last error quotes the subscriber's answer, which can carry ESC. On a
    copy of the module's database: a row added to it changed the other tests' tables."""
    import asyncio
    import sqlite3
    from types import SimpleNamespace

    copy: Any = SimpleNamespace(db=tmp_path / "copy.db")  # what run() reads of a Receiver
    with sqlite3.connect(stored.db) as source, sqlite3.connect(copy.db) as target:
        source.backup(target)

    from receiver.store import open_store
    from receiver.store.records import subscriber_delivery

    async def go() -> str:
        store = open_store(str(copy.db))
        await store.open()
        try:
            hook = await store.webhooks.add(
                public_id="wh_hostile", url="https://hooks.example.com/in\u202e",
                events=["score.drop"], threshold=None, format="service", secret="s",
                now=time.time(),
            )  # fmt: skip
            assert hook is not None
            note = subscriber_delivery(hook.id, "d", "{}")
            await store.transact(
                lambda tx: tx.outbox.add(
                    HOSTILE, note, state="pending", now=time.time(), kind="webhook"
                )
            )
            [row] = await store.outbox.claim_due(now=time.time() + 1, limit=5, lease=30)
            await store.outbox.mark_failed(
                row.id, error="HTTP 500: \x1b]0;pwned\x07\x1b[2J", now=time.time(), retry_at=None
            )
            return hook.public_id
        finally:
            await store.close()

    public_id = asyncio.run(go())
    out = run(copy, "webhooks", "deliveries", public_id)
    assert_escaped(out)
    assert "\\x1b]0;pwned\\x07" in out
    assert_escaped(run(copy, "webhooks", "list"))
