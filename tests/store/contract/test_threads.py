"""The store contract of chat threads (receiver.store.threads): one message per alert
episode and target, claimed before it is posted, so senders at once post it once; on
SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
from typing import Any

from receiver.store import Store, open_store
from tests.store.contract.common import run

TARGET = "slack-app://C0123ABCD"


def test_the_first_sender_claims_later_ones_find_the_posted_message(store_url: str) -> None:
    async def scenario(store: Store) -> list[Any]:
        first = await store.threads.claim("a#1", TARGET, now=10.0, lease=30.0)
        during = await store.threads.claim("a#1", TARGET, now=11.0, lease=30.0)
        card = {"title": "drop", "state": "open"}
        recorded = await store.threads.posted(
            "a#1", TARGET, channel_id="C0123ABCD", ts="1.000100", card=card, now=12.0
        )
        after = await store.threads.claim("a#1", TARGET, now=13.0, lease=30.0)
        other_episode = await store.threads.claim("a#2", TARGET, now=13.0, lease=30.0)
        other_target = await store.threads.claim("a#1", "slack-app://C999", now=13.0, lease=30.0)
        return [first, during, recorded, after, other_episode, other_target]

    first, during, recorded, after, other_episode, other_target = run(store_url, scenario)
    assert (first.state, during.state, recorded, after.state) == ("mine", "busy", True, "posted")
    assert (after.thread.channel_id, after.thread.ts) == ("C0123ABCD", "1.000100")
    assert after.thread.card == {"title": "drop", "state": "open"}
    assert (other_episode.state, other_target.state) == ("mine", "mine")


def test_a_released_or_expired_claim_goes_to_the_next_sender(store_url: str) -> None:
    async def scenario(store: Store) -> list[str]:
        await store.threads.claim("a#1", TARGET, now=10.0, lease=30.0)
        await store.threads.release("a#1", TARGET)  # the post failed
        again = await store.threads.claim("a#1", TARGET, now=11.0, lease=30.0)
        held = await store.threads.claim("a#1", TARGET, now=40.0, lease=30.0)
        taken = await store.threads.claim("a#1", TARGET, now=41.0, lease=30.0)  # 11 + 30 ran out
        # The first recording wins; one taken over after it posted is not recorded twice.
        firsts = [
            await store.threads.posted("a#1", TARGET, channel_id="C1", ts=ts, card={}, now=42.0)
            for ts in ("1.1", "1.2")
        ]
        found = await store.threads.claim("a#1", TARGET, now=43.0, lease=30.0)
        return [again.state, held.state, taken.state, *map(str, firsts), str(found.thread.ts)]

    assert run(store_url, scenario) == ["mine", "busy", "mine", "True", "False", "1.1"]


def test_a_message_is_found_by_its_address_and_its_card_updated(store_url: str) -> None:
    async def scenario(store: Store) -> list[Any]:
        await store.threads.claim("a#1", TARGET, now=10.0, lease=30.0)
        await store.threads.posted(
            "a#1", TARGET, channel_id="C1", ts="5.5", card={"state": "open"}, now=11.0
        )
        await store.threads.update("a#1", TARGET, card={"state": "acked"}, now=12.0)
        unposted = await store.threads.claim("b#1", TARGET, now=12.0, lease=30.0)
        return [
            await store.threads.find("C1", "5.5"),
            await store.threads.find("C1", "6.6"),
            await store.threads.find("C2", "5.5"),
            unposted.thread.ts,
        ]

    found, wrong_ts, wrong_channel, unposted = run(store_url, scenario)
    assert (found.key, found.target, found.card, found.updated_at) == (
        "a#1",
        TARGET,
        {"state": "acked"},
        12.0,
    )
    assert (wrong_ts, wrong_channel, unposted) == (None, None, None)


def test_two_replicas_claiming_at_once_give_the_post_to_one(store_url: str) -> None:
    """Two stores on one database (two replicas), many claims at once: one "mine"."""

    async def main() -> list[str]:
        stores = [open_store(store_url, clock=lambda: 10.0) for _ in range(2)]
        for store in stores:
            await store.open()
        try:
            claims = await asyncio.gather(
                *(
                    stores[i % 2].threads.claim("a#1", TARGET, now=10.0, lease=30.0)
                    for i in range(8)
                )
            )
            return sorted(c.state for c in claims)
        finally:
            for store in stores:
                await store.close()

    assert asyncio.run(main()) == ["busy"] * 7 + ["mine"]


def test_a_moved_message_is_found_at_its_new_address(store_url: str) -> None:
    async def scenario(store: Store) -> list[Any]:
        await store.threads.claim("a#1", TARGET, now=10.0, lease=30.0)
        await store.threads.posted("a#1", TARGET, channel_id="C1", ts="1.1", card={}, now=11.0)
        await store.threads.moved(
            "a#1", TARGET, channel_id="C1", ts="2.2", card={"state": "open"}, now=12.0
        )
        claim = await store.threads.claim("a#1", TARGET, now=13.0, lease=30.0)
        return [claim.state, claim.thread.ts, await store.threads.find("C1", "1.1")]

    assert run(store_url, scenario) == ["posted", "2.2", None]


def test_retention_prunes_messages_not_updated_since(store_url: str) -> None:
    async def scenario(store: Store) -> list[str]:
        for key, at in (("old#1", 10.0), ("new#1", 500.0)):
            await store.threads.claim(key, TARGET, now=at, lease=30.0)
            await store.threads.posted(key, TARGET, channel_id="C1", ts=key, card={}, now=at)
        await store.events.prune(100.0, limit=100)
        return [
            (await store.threads.claim(key, TARGET, now=600.0, lease=30.0)).state
            for key in ("old#1", "new#1")
        ]

    assert run(store_url, scenario) == ["mine", "posted"]  # the old one would post anew
