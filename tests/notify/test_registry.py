"""The channel seam (issue 43, item 1): a notifier URL's scheme picks its channel from one
registry, and a channel added there alone (here a tiny one, registered by the test only)
is accepted by `receiver check`, routed, claimed, sent through, counted under its own label
in /metrics and offered by the admin filter, with nothing else changed."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver import events
from receiver.cli import cli
from receiver.notify import registry
from receiver.notify.apprise import lanes_of
from receiver.notify.backoff import Delays
from receiver.notify.channel import Kind, Parts, Result
from receiver.store import OutboxRow
from receiver.store.records import OutboxQuery
from tests.admin.test_views import running, until


class Tiny:
    """Sends to tiny://ROOM by remembering the row, once the test lets it."""

    name = "tiny"
    schedule = Delays((0.1,))

    def __init__(self, parts: Parts) -> None:
        self.rules = parts.rules
        self.sent: list[OutboxRow] = []
        self.go = asyncio.Event()

    async def lanes(self) -> list[tuple[str, int]]:
        return lanes_of(self.rules(), self.name)

    def describe(self, row: OutboxRow) -> str:
        return f"tiny message {row.id}"

    async def send(self, row: OutboxRow) -> Result:
        await self.go.wait()
        self.sent.append(row)
        return Result.delivered(status=200)


def _check(url: str, scheme: str) -> str | None:
    return None if re.fullmatch(r"tiny://[a-z]+", url) else "tiny needs tiny://ROOM"


BUILT: list[Tiny] = []


def _build(parts: Parts) -> Tiny:
    BUILT.append(Tiny(parts))
    return BUILT[-1]


TINY = Kind("tiny", frozenset({"tiny"}), _build, check=_check)
RULES = """
notifiers:
  room: "{hook}"
rules:
  - name: page-tiny
    match: {{type: score.drop}}
    notify: [room]
"""


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny channel in the registry: one line, as a real channel's."""
    BUILT.clear()
    monkeypatch.setattr(registry, "KINDS", [TINY, *registry.KINDS])


def test_schemes_pick_their_channel_and_an_unknown_one_names_the_channels() -> None:
    names = registry.names()  # the label values dashboards know; apprise's, the fallback, last
    assert (names[0], names[-1]) == ("webhook", "notify")
    assert [registry.channel_of(u) for u in ("console://", "json://h/x", "https://h/x")] == [
        "notify"
    ] * 3
    assert registry.problem("json://localhost/x", '"json"') is None
    problem = registry.problem("nope://secret-token@host", '"nope"')
    assert problem is not None and "secret-token" not in problem
    assert problem.startswith('no channel takes this url (scheme "nope"); the channels: webhook')
    assert "notify (every scheme apprise knows" in problem


def test_a_channel_registered_alone_is_checked_routed_sent_counted_and_listed(
    tmp_path: Path, tiny: None
) -> None:
    rules = tmp_path / "check.yaml"
    rules.write_text(RULES.format(hook="tiny://ops"))
    assert CliRunner().invoke(cli, ["check", str(rules)]).exit_code == 0
    rules.write_text(RULES.format(hook="tiny://OPS!"))
    refused = CliRunner().invoke(cli, ["check", str(rules)])
    assert refused.exit_code == 1 and "tiny needs tiny://ROOM" in refused.output
    rules.write_text(RULES.format(hook="nope://x"))
    unknown = CliRunner().invoke(cli, ["check", str(rules)])
    assert unknown.exit_code == 1 and "tiny (tiny://)" in unknown.output, unknown.output

    async def main() -> None:
        async with running(tmp_path, hook="tiny://ops", rules_text=RULES) as admin:
            await admin.send(events.sample("score.drop", id="evt_tiny_1"))

            async def claimed() -> list[OutboxRow]:
                rows = await admin.store.outbox.page(OutboxQuery(channel="tiny"))
                return [r for r in rows if r.state == "sending"]

            [row] = await until(claimed, "the tiny row claimed")
            assert (row.notifier, row.channel) == ("room", "tiny")
            scraped = (await admin.client.get("/metrics")).text
            assert 'receiver_outbox_pending{channel="tiny"} 1.0' in scraped, scraped
            assert 'receiver_outbox_pending{channel="notify"} 0.0' in scraped
            assert 'receiver_outbox_pending{channel="webhook"} 0.0' in scraped
            listed = await admin.page("/admin/notifications?channel=tiny")
            assert "<option selected>tiny</option>" in listed
            assert f'href="/admin/notifications/{row.id}"' in listed
            others = await admin.page("/admin/notifications?channel=webhook")
            assert f'href="/admin/notifications/{row.id}"' not in others
            [channel] = BUILT
            channel.go.set()

            async def delivered() -> bool:
                rows = await admin.store.outbox.page(OutboxQuery(channel="tiny"))
                return [r.state for r in rows] == ["delivered"]

            await until(delivered, "the tiny row delivered")
            assert [r.id for r in channel.sent] == [row.id]
            scraped = (await admin.client.get("/metrics")).text
            assert 'receiver_outbox_pending{channel="tiny"} 0.0' in scraped

    asyncio.run(main())


def test_only_the_slack_app_and_ntfy_update_a_message_in_place() -> None:
    # An ack or a snooze queues update rows to these alone (receiver.dispatch.updates):
    # apprise's services and subscribers cannot change a message once sent.
    assert registry.updating() == {"slack-app", "ntfy"}
