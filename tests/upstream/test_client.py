"""The upstream client (receiver.upstream.client) against answers made with
httpx.MockTransport: the bearer key, retries after a 429, errors named without the key."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from receiver.errors import UpstreamError
from receiver.upstream.client import LocalBudget, UpstreamClient

REMOTE = {
    "id": "s1",
    "userId": "u1",
    "score": 35,
    "status": "dropped",
    "context": "/checkout",
    "signals": 12,
    "interventions": 2,
    "startedAt": "2026-01-01T00:00:00.000Z",
    "updatedAt": "2026-01-01T00:10:00.000Z",
}


def mock_client(handler: Any, **kwargs: Any) -> UpstreamClient:
    return UpstreamClient(
        "http://upstream.test/v1",
        "ar_secret_key",
        budget=LocalBudget("enterprise"),
        transport=httpx.MockTransport(handler),
        **kwargs,
    )


def test_the_client_sends_the_bearer_key_and_retries_after_a_429() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            body = {"error": {"code": "rate_limited", "message": "slow down"}}
            return httpx.Response(429, json=body, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"id": "s/1", "status": "active"})

    async def go() -> dict[str, Any]:
        async with mock_client(handler) as client:
            return await client.session("s/1")

    assert asyncio.run(go()) == {"id": "s/1", "status": "active"}
    assert len(seen) == 2
    assert seen[0].headers["authorization"] == "Bearer ar_secret_key"
    assert seen[1].url.raw_path == b"/v1/sessions/s%2F1"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        pytest.param(
            httpx.Response(404, json={"error": {"code": "session_not_found", "message": "no"}}),
            "HTTP 404: session_not_found: no",
            id="error-body",
        ),
        pytest.param(httpx.Response(502, text="bad gateway"), "HTTP 502", id="not-json"),
        pytest.param(httpx.Response(200, text="<html>"), "without JSON", id="2xx-not-json"),
    ],
)
def test_the_client_names_what_went_wrong_and_never_the_key(
    answer: httpx.Response, message: str
) -> None:
    async def go() -> str:
        async with mock_client(lambda request: answer) as client:
            with pytest.raises(UpstreamError) as caught:
                await client.session("s1")
            return str(caught.value)

    text = asyncio.run(go())
    assert message in text and "ar_secret_key" not in text


def test_the_client_gives_up_after_five_429s() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "0"})

    async def go() -> tuple[str | None, int]:
        async with mock_client(handler) as client:
            with pytest.raises(UpstreamError) as caught:
                await client.sessions(limit=1)
            return caught.value.code, client.requests

    assert asyncio.run(go()) == ("rate_limited", 5)
