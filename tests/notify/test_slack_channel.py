"""The Slack app channel's sender against the Web API stand-in, on SQLite and PostgreSQL:
two replicas sending the first message of one episode at once make one message (the
claim in store.threads), the loser updates it once the winner recorded it; a failed post
gives the claim back, so the retry posts; a row of no episode is posted as it is."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from receiver.notify import episodes
from receiver.notify.backoff import Delays
from receiver.notify.channel import Result
from receiver.notify.episodes import Episode
from receiver.notify.slack.channel import Messenger, SlackChannel
from receiver.simulator.slack_api import SlackAPI
from receiver.store import OutboxRow, Store, open_store

TOKEN = "xoxb-channel-test"
RULES = SimpleNamespace(notifiers={"oncall": SimpleNamespace(urls=("slack-app://#alerts",))})


@pytest.fixture
def slack() -> Iterator[SlackAPI]:
    api = SlackAPI(token=TOKEN).start()
    try:
        yield api
    finally:
        api.stop()


def row(i: int) -> OutboxRow:
    return OutboxRow(
        i, f"evt_{i}", "deep-drop", "oncall", 0, f"drop {i}", "score 8", "sending", 1, 0, 0, 0
    )


def channel(store: Store, api: SlackAPI) -> SlackChannel:
    return SlackChannel(
        store,
        lambda: RULES,
        schedule=Delays((1.0,)),
        messenger=Messenger(TOKEN, api.url, 5),
        public_url=None,
        link_ttl=3600,
    )


@pytest.fixture
def one_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row belongs to episode 1 of session:s1, open (the routing is not under test)."""

    async def episode_of(store: Any, row: OutboxRow, links: Any) -> Episode | None:
        return None if row.id >= 100 else Episode("session:s1", 1, "open")

    monkeypatch.setattr(episodes, "episode_of", episode_of)


def on_two_replicas(url: str, fn: Any) -> Any:
    async def main() -> Any:
        stores = [open_store(url) for _ in range(2)]
        for store in stores:
            await store.open()
        try:
            return await fn(*stores)
        finally:
            for store in stores:
                await store.close()

    return asyncio.run(main())


def test_two_replicas_at_once_post_one_message(
    store_url: str, slack: SlackAPI, one_episode: None
) -> None:
    async def both(a: Store, b: Store) -> list[Result]:
        first = await asyncio.gather(channel(a, slack).send(row(1)), channel(b, slack).send(row(2)))
        # The one that found the post claimed tries again, as the worker would.
        again = [
            await channel(b, slack).send(row(i + 1))
            for i, r in enumerate(first)
            if r.outcome == "retry"
        ]
        return [*first, *again]

    results = on_two_replicas(store_url, both)
    assert len(slack.messages()) == 1
    assert [r.outcome for r in results].count("delivered") == 2
    [message] = slack.messages()
    assert len(message.replies) == 1 and message.edits == 1


def test_a_failed_first_post_is_posted_by_the_retry(
    store_url: str, slack: SlackAPI, one_episode: None
) -> None:
    async def twice(a: Store, b: Store) -> list[Result]:
        slack.fail["chat.postMessage"] = "internal_error"
        failed = await channel(a, slack).send(row(1))
        return [failed, await channel(b, slack).send(row(1))]

    failed, retried = on_two_replicas(store_url, twice)
    assert (failed.outcome, failed.error) == ("retry", "slack chat.postMessage: internal_error")
    assert retried.outcome == "delivered" and len(slack.messages()) == 1


def test_a_row_of_no_episode_is_posted_as_it_is(
    store_url: str, slack: SlackAPI, one_episode: None
) -> None:
    async def plain(a: Store, b: Store) -> list[Result]:
        return [await channel(a, slack).send(row(100)), await channel(b, slack).send(row(101))]

    assert [r.outcome for r in on_two_replicas(store_url, plain)] == ["delivered"] * 2
    assert len(slack.messages()) == 2
    assert all(not b.get("type") == "actions" for m in slack.messages() for b in m.blocks)


def test_a_rate_limited_post_is_retried_after_slacks_wait(
    store_url: str, slack: SlackAPI, one_episode: None
) -> None:
    async def limited(a: Store, b: Store) -> list[Result]:
        slack.fail["chat.postMessage"] = "ratelimited"
        return [await channel(a, slack).send(row(1)), await channel(b, slack).send(row(1))]

    first, then = on_two_replicas(store_url, limited)
    assert (first.outcome, first.retry_after) == ("retry", 3.0)
    assert then.outcome == "delivered" and len(slack.messages()) == 1


def test_a_message_deleted_in_slack_is_posted_again(
    store_url: str, slack: SlackAPI, one_episode: None
) -> None:
    async def deleted(a: Store, b: Store) -> list[Result]:
        first = await channel(a, slack).send(row(1))
        slack.delete(slack.messages()[0])
        second = await channel(b, slack).send(row(2))
        third = await channel(a, slack).send(row(3))
        return [first, second, third]

    assert [r.outcome for r in on_two_replicas(store_url, deleted)] == ["delivered"] * 3
    [message] = slack.messages()  # the new one, updated by the third row
    assert message.edits == 1 and len(message.replies) == 2
