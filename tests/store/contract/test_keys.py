"""store.keys: API keys (their hashes) and the plan limits every replica shares."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from receiver.store import Store, open_store
from tests.store.contract.common import run


def test_keys_are_stored_listed_and_revoked(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        key = await store.keys.add(
            name="ci", key_hash="h1", prefix="ar_ab", plan="pro", role="reader", now=5.0
        )
        with pytest.raises(KeyError):
            await store.keys.add(
                name="ci", key_hash="h2", prefix="ar_cd", plan="pro", role="reader", now=6.0
            )
        found = await store.keys.authorize("h1", now=10.0)
        unknown = await store.keys.authorize("h9", now=10.0)
        revoked = await store.keys.revoke("ci", now=11.0)
        again = await store.keys.revoke("ci", now=12.0)
        after = await store.keys.authorize("h1", now=13.0)
        return key, found, unknown, revoked, again, after, await store.keys.all()

    key, found, unknown, revoked, again, after, listed = run(store_url, go)
    assert (key.name, key.plan, key.role, key.prefix) == ("ci", "pro", "reader", "ar_ab")
    assert found[0] is not None and found[0].name == "ci"
    assert found[1] is not None and found[1].limit == 600 and found[1].remaining == 599
    assert unknown == (None, None)
    assert (revoked, again, after) == (True, False, (None, None))
    assert [(k.name, k.revoked_at) for k in listed] == [("ci", 11.0)]
    assert not any(hasattr(k, "hash") for k in listed)


def test_a_free_key_gets_sixty_a_minute_and_the_sixty_first_is_refused(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        await store.keys.add(
            name="f", key_hash="hf", prefix="ar_f", plan="free", role="reader", now=0.0
        )
        await store.keys.add(
            name="e", key_hash="he", prefix="ar_e", plan="enterprise", role="admin", now=0.0
        )
        burst = [await store.keys.authorize("hf", now=100.0 + i / 100) for i in range(61)]
        later = await store.keys.authorize("hf", now=160.5)  # the first ones have left the window
        unlimited = [await store.keys.authorize("he", now=100.0) for _ in range(100)]
        return burst, later, unlimited

    burst, later, unlimited = run(store_url, go)
    refused = [limit for _, limit in burst if not limit.allowed]
    assert len(refused) == 1 and burst[-1][1] == refused[0]
    assert refused[0].remaining == 0 and refused[0].reset == 60
    assert burst[0][1].remaining == 59
    assert later[1].allowed
    assert all(key is not None and limit is None for key, limit in unlimited)


def test_replicas_share_one_count(pg_url: str) -> None:
    async def go() -> list[bool]:
        a, b = open_store(pg_url), open_store(pg_url)
        await a.open()
        await b.open()
        try:
            await a.keys.add(
                name="f", key_hash="hf", prefix="ar_f", plan="free", role="reader", now=0.0
            )
            results = await asyncio.gather(
                *(s.keys.authorize("hf", now=100.0) for s in [a, b] * 35)
            )
            return [limit.allowed for _, limit in results]
        finally:
            await a.close()
            await b.close()

    allowed = asyncio.run(go())
    assert allowed.count(True) == 60 and allowed.count(False) == 10


def test_a_request_below_the_key_s_role_is_not_counted(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        await store.keys.add(
            name="f", key_hash="hf", prefix="ar_f", plan="free", role="reader", now=0.0
        )
        writes = [await store.keys.authorize("hf", now=100.0, role="writer") for _ in range(70)]
        read = await store.keys.authorize("hf", now=100.0, role="reader")
        return writes, read

    writes, (key, limit) = run(store_url, go)
    assert all(k is not None and k.role == "reader" and lim is None for k, lim in writes)
    assert key is not None and limit is not None and limit.allowed and limit.remaining == 59
