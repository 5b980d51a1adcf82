"""The enricher (receiver.upstream.enrich) over a client answered by httpx.MockTransport: its
cache and shared fetch, its rest after a timeout, the texts rendered again with the
enrichment; and the rules' side: which templates ask for enrichment."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from receiver.links import Links
from receiver.rules import templates
from receiver.rules.load import load_text
from receiver.rules.rule import Rule
from receiver.store import OutboxRow
from receiver.upstream.enrich import Enricher
from tests.upstream.test_client import REMOTE, mock_client


def test_the_enricher_caches_a_session_and_shares_one_fetch_between_waiters() -> None:
    calls: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        await asyncio.sleep(0.01)
        if request.url.path.endswith("/scores"):
            points = [{"score": i, "timestamp": f"2026-01-01T00:00:{i:02d}Z"} for i in range(30)]
            return httpx.Response(200, json={"sessionId": "s1", "history": points})
        return httpx.Response(200, json=REMOTE)

    async def go() -> list[Any]:
        async with mock_client(handler) as client:
            enricher = Enricher(client, timeout=5)
            found = await asyncio.gather(*(enricher.enrichment("s1") for _ in range(5)))
            found.append(await enricher.enrichment("s1"))
            return found

    found = asyncio.run(go())
    assert calls == ["/v1/sessions/s1", "/v1/sessions/s1/scores"]
    enrichment, reason = found[0]
    assert reason is None and enrichment["session"]["context"] == "/checkout"
    assert [p["score"] for p in enrichment["history"]] == list(range(10, 30))  # the last 20
    assert all(f == found[0] for f in found)


def test_the_enricher_rests_after_the_upstream_times_out() -> None:
    calls: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        await asyncio.sleep(5)
        return httpx.Response(200, json=REMOTE)

    async def go() -> list[tuple[Any, str | None]]:
        async with mock_client(handler) as client:
            enricher = Enricher(client, timeout=0.05)
            return [await enricher.enrichment("s1"), await enricher.enrichment("s2")]

    (first, why), (second, why_not) = asyncio.run(go())
    assert first is None and why == "the upstream did not answer within 0.05s"
    assert second is None and why_not is not None and "not asking again yet" in why_not
    assert calls == ["/v1/sessions/s1"]


def test_a_fetch_that_fails_after_its_waiters_gave_up_is_not_left_unread() -> None:
    """Every waiter timed out, then the shared fetch failed: nobody read its error, and
    asyncio logged "Future exception was never retrieved" with a traceback."""
    unread: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.1)
        return httpx.Response(500, json={"error": {"code": "internal", "message": "x"}})

    async def go() -> tuple[Any, str | None]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: unread.append(context["message"]))
        async with mock_client(handler) as client:
            enricher = Enricher(client, timeout=0.02)
            found = await enricher.enrichment("s1")
            deadline = time.monotonic() + 30
            while enricher._fetching:  # until the fetch has failed and been let go
                assert time.monotonic() < deadline, "the fetch never ended"
                await asyncio.sleep(0.01)
            import gc

            gc.collect()  # an unread future logs when it is collected
            return found

    enrichment, why = asyncio.run(go())
    assert enrichment is None and why is not None
    assert unread == []


@pytest.mark.parametrize(
    ("title", "body", "enriches"),
    [
        pytest.param("{{ userId }}", "{{ score }}", False, id="plain"),
        pytest.param("{{ session.context }}", "x", True, id="session-in-title"),
        pytest.param("x", "{% for p in history %}{{ p.score }}{% endfor %}", True, id="history"),
        pytest.param("x", "{{ event.session }}", False, id="event-field-named-session"),
    ],
)
def test_a_rule_enriches_only_when_its_texts_name_session_or_history(
    title: str, body: str, enriches: bool
) -> None:
    rule = Rule(name="r", conditions=(), notify=("n",), title=title, body=body)
    assert rule.enriches is enriches


def test_templates_see_session_and_history_empty_without_enrichment() -> None:
    ctx = templates.context({"sessionId": "s1"}, "r")
    assert (ctx["session"], ctx["history"], ctx["enriched"]) == ({}, [], False)
    enriched = templates.context({}, "r", {"session": {"context": "/x"}, "history": [1]})
    assert enriched["session"] == {"context": "/x"} and enriched["enriched"] is True


class _Events:
    """The one store method texts() reads: a stored event's body by id (store.events.get)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload

    async def get(self, event_id: str) -> tuple[None, str] | None:
        return (None, json.dumps(self.payload)) if event_id == self.payload["id"] else None


class _Store:
    def __init__(self, payload: dict[str, Any]) -> None:
        self.events = _Events(payload)


def _row(title: str, **fields: Any) -> OutboxRow:
    base = dict(
        id=1, event_id="evt_1", rule="drop", notifier="slack", target=0, title=title,
        body="b", state="sending", attempts=1, next_at=0.0, created_at=0.0, updated_at=0.0,
    )  # fmt: skip
    return OutboxRow(**{**base, **fields})


RULES_TEXT = """
notifiers:
  slack: "json://127.0.0.1:9/x"
rules:
  - name: drop
    match: {type: score.drop}
    notify: slack
    title: "{{ userId }} on {{ session.context | default('?') }}"
    body: "{{ history | length }} points"
  - name: plain
    notify: slack
    title: "{{ userId }}"
    body: "plain"
"""


def test_texts_are_rendered_again_with_the_enrichment_keeping_a_replay_mark() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/scores"):
            return httpx.Response(200, json={"history": [{"score": 1, "timestamp": "x"}]})
        return httpx.Response(200, json=REMOTE)

    payload = {"id": "evt_1", "type": "score.drop", "sessionId": "s1", "userId": "u1"}
    ruleset = load_text(RULES_TEXT)

    async def go() -> list[Any]:
        async with mock_client(handler) as client:
            enricher = Enricher(client, timeout=5)
            store: Any = _Store(payload)
            return [
                await enricher.texts(_row("u1 on ?"), ruleset, store),
                await enricher.texts(_row("[replay] u1 on ?"), ruleset, store),
                await enricher.texts(_row("u1", rule="plain"), ruleset, store),
                await enricher.texts(_row("u1 on ?", kind="resolved"), ruleset, store),
                await enricher.texts(_row("u1 on ?", event_id="evt_gone"), ruleset, store),
            ]

    fresh, replay, plain, resolved, gone = asyncio.run(go())
    assert fresh == ("u1 on /checkout", "1 points")
    assert replay == ("[replay] u1 on /checkout", "1 points")
    assert plain is None and resolved is None  # nothing to enrich: the stored texts go
    assert gone is None  # the event was pruned: the stored texts go, with a log line


def test_texts_rendered_again_keep_the_action_links() -> None:
    """An enriched message is rendered again before it is sent: with RECEIVER_PUBLIC_URL its
    links are there too (receiver.links), not emptied."""

    class _Links:
        async def get(self) -> Links:
            return Links("k" * 32, base="https://alerts.example.com", ttl=60)

    payload = {"id": "evt_1", "type": "score.drop", "sessionId": "s1", "userId": "u1"}
    ruleset = load_text(
        RULES_TEXT.replace('body: "{{ history | length }} points"', 'body: "ack {{ links.ack }}"')
    )

    async def go() -> Any:
        async with mock_client(lambda request: httpx.Response(200, json=REMOTE)) as client:
            enricher = Enricher(client, timeout=5, links=_Links())  # type: ignore[arg-type]
            return await enricher.texts(_row("u1 on ?"), ruleset, _Store(payload))  # type: ignore[arg-type]

    texts = asyncio.run(go())
    assert texts is not None and texts[1].startswith("ack https://alerts.example.com/act/")
