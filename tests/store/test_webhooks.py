"""The store's side of webhook subscribers, on SQLite and PostgreSQL alike: retention of
finished deliveries whose event went first, and subscriptions owned by the key that made them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from receiver.store import Notification, Store
from receiver.store.records import WEBHOOK_NOTIFIER
from tests.store.contract.common import event, queue, run


def test_prune_deletes_failed_rows_whose_event_was_pruned_while_they_waited(
    store_url: str,
) -> None:
    """A delivery still being retried keeps its row but not its event; once it has failed
    for good (dead) or been delivered after all, a later pass prunes it: it belonged to no event any
    more, so the event-by-event pass never looked at it."""

    def hook_note(target: int) -> Notification:
        return Notification(
            rule="@subscriber", notifier=WEBHOOK_NOTIFIER, target=target, title="d", body="{}"
        )

    async def go(store: Store) -> Any:
        for i in range(3):
            await store.events.accept(*event(i))
            await queue(store, f"evt_{i}", [hook_note(i)], now=1.0)
        rows = await store.outbox.claim_due(now=1.0, limit=5, lease=30)
        assert len(rows) == 3
        first = await store.events.prune(before=2000.0, limit=100)  # all three still in flight
        dead, delivered, retrying = sorted(rows, key=lambda r: r.event_id)
        await store.outbox.mark_failed(dead.id, error="HTTP 500", now=50.0, retry_at=None)
        await store.outbox.mark_delivered(delivered.id, now=50.0)
        await store.outbox.mark_failed(retrying.id, error="HTTP 500", now=50.0, retry_at=3000.0)
        second = await store.events.prune(before=100.0, limit=100)
        left = [(r.event_id, r.state) for r in await store.outbox.deliveries()]
        return first, second, left

    first, second, left = run(store_url, go)
    assert first["events"] == 3 and first["outbox"] == 0
    # evt_0's row is dead and evt_1's delivered, both finished before 100: pruned; evt_2's
    # waits for a retry: kept.
    assert second["outbox"] == 2
    assert left == [("evt_2", "pending")]


def test_subscriptions_belong_to_their_key_and_a_key_has_at_most_cap(store_url: str) -> None:
    async def go(store: Store) -> Any:
        async def add(n: int, owner: int | None, cap: int | None = 2) -> Any:
            return await store.webhooks.add(
                public_id=f"wh_{n}",
                url="https://hooks.example.com/in",
                events=["score.drop"],
                threshold=None,
                format="service",
                secret="s",
                now=1.0,
                owner=owner,
                cap=cap,
            )

        one, two = await add(1, owner=7), await add(2, owner=7)
        refused = await add(3, owner=7)  # the key's third: over its cap of 2
        other = await add(4, owner=8)
        operator = await add(5, owner=None)  # the CLI's: no key, no cap
        await store.webhooks.update("wh_1", now=2.0, status="deleted")
        again = await add(6, owner=7)  # a deleted one no longer counts
        return (
            [one.owner, two.owner, refused, other.owner, operator.owner, again.owner],
            (await store.webhooks.get("wh_2")).owner,  # type: ignore[union-attr]
            [h.public_id for h in await store.webhooks.all(owner=7)],
            [h.public_id for h in await store.webhooks.all()],
            [h.owner for h in await store.webhooks.all(active_only=True)],
        )

    owners, read, sevens, every, active = run(store_url, go)
    assert owners == [7, 7, None, 8, None, 7]
    assert read == 7
    assert sevens == ["wh_2", "wh_6"]
    assert every == ["wh_2", "wh_4", "wh_5", "wh_6"]
    assert active == [7, 8, None, 7]


def test_creates_of_one_key_at_once_keep_to_its_cap(pg_url: str) -> None:
    """Replicas creating subscriptions of one key at the same moment: under READ COMMITTED
    each counted the others' uncommitted rows out, and all got past the cap."""
    import psycopg

    from receiver.api.auth import hash_key
    from receiver.store import open_store

    # Each insert takes 0.2 s after its count (a trigger sleeps), so the creates overlap.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(0.2); RETURN NEW; END $$"
        )

    async def go() -> tuple[int, int]:
        stores = [open_store(pg_url) for _ in range(6)]
        for store in stores:
            await store.open()
        try:
            key = await stores[0].keys.add(
                name="racer", key_hash=hash_key("racer"), prefix="racer", plan="enterprise",
                role="writer", now=1.0,
            )  # fmt: skip
            with psycopg.connect(pg_url, autocommit=True) as conn:  # after the schema is made
                conn.execute(
                    "CREATE TRIGGER slow BEFORE INSERT ON webhooks"
                    " FOR EACH ROW EXECUTE FUNCTION slow()"
                )
            made = await asyncio.gather(
                *(
                    s.webhooks.add(
                        public_id=f"wh_race_{n}_{i}",
                        url="https://hooks.example.com/in",
                        events=["score.drop"],
                        threshold=None,
                        format="service",
                        secret="s",
                        now=1.0,
                        owner=key.id,
                        cap=3,
                    )
                    for n, s in enumerate(stores)
                    for i in range(2)
                )
            )
            return sum(hook is not None for hook in made), len(
                await stores[0].webhooks.all(owner=key.id)
            )
        finally:
            for store in stores:
                await store.close()

    assert asyncio.run(go()) == (3, 3)


def test_the_api_answers_409_past_a_keys_cap(store_url: str) -> None:
    """The API over a real store, in process, with a cap of 2 (RECEIVER_WEBHOOKS_PER_KEY):
    the third is 409 invalid_webhook; a deleted one makes room; another key has its own."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    from receiver.api.auth import Access, hash_key
    from receiver.api.webhooks import WebhooksAPI
    from receiver.errors import RequestError
    from receiver.notify.webhook import WebhookChannel

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestError)
        return JSONResponse(exc.to_dict(), status_code=exc.status)

    async def go(store: Store) -> list[tuple[int, str]]:
        for name in ("a", "b"):
            await store.keys.add(
                name=name, key_hash=hash_key(name), prefix=name, plan="enterprise",
                role="writer", now=1.0,
            )  # fmt: skip
        channel = WebhookChannel(store, allow_private=True, allow_http=True)
        api = WebhooksAPI(store, Access(store), channel, per_key=2)
        app = Starlette(routes=api.routes(), exception_handlers={RequestError: refused})
        body = {"url": "http://127.0.0.1:9/hook", "events": ["score.drop"]}
        seen: list[tuple[int, str]] = []
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

            async def post(key: str) -> httpx.Response:
                r = await client.post(
                    "/v1/webhooks", json=body, headers={"Authorization": f"Bearer {key}"}
                )
                seen.append((r.status_code, r.json().get("error", {}).get("message", "")))
                return r

            first = (await post("a")).json()["id"]
            await post("a")
            await post("a")  # the third: refused
            await post("b")  # another key's first
            await client.delete(f"/v1/webhooks/{first}", headers={"Authorization": "Bearer a"})
            await post("a")  # room again
        await channel.close()
        return seen

    seen = run(store_url, go)
    assert [status for status, _ in seen] == [201, 201, 409, 201, 201]
    assert seen[2][1] == (
        "this API key already has 2 subscriptions, the most RECEIVER_WEBHOOKS_PER_KEY"
        " allows; delete one first"
    )


def test_the_served_app_takes_its_cap_from_the_setting(tmp_path: Path) -> None:
    """RECEIVER_WEBHOOKS_PER_KEY reaches the API of the app `receiver serve` runs."""
    from receiver.api.auth import hash_key
    from receiver.app import create_app
    from receiver.settings import Settings

    settings = Settings(
        db=str(tmp_path / "r.db"),
        secrets="a-test-secret-of-enough-length",
        webhooks_per_key=1,
        webhook_allow_private=True,
        webhook_allow_http=True,
    )
    app = create_app(settings)
    body = {"url": "http://127.0.0.1:9/hook", "events": ["score.drop"]}

    async def go() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t") as client,
        ):
            await app.state.store.keys.add(
                name="w", key_hash=hash_key("w"), prefix="w", plan="enterprise",
                role="writer", now=1.0,
            )  # fmt: skip
            auth = {"Authorization": "Bearer w"}
            return [
                (await client.post("/v1/webhooks", json=body, headers=auth)).status_code
                for _ in range(2)
            ]

    assert asyncio.run(go()) == [201, 409]
