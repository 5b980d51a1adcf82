"""`receiver webhooks add` and `list` with a subscription's rate limit, filter and health:
set at registration, checked as POST /v1/webhooks checks them, shown by the listing (and
its --json, as GET /v1/webhooks shows them). Click's runner on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from receiver.cli import cli
from receiver.notify.health import health_event
from receiver.store import open_store
from receiver.store.webhook_health import HealthPolicy
from tests import dbview
from tests.servers import HTTPSink

ALLOW = {"RECEIVER_WEBHOOK_ALLOW_PRIVATE": "1", "RECEIVER_WEBHOOK_ALLOW_HTTP": "1"}


def run(db: Path, *args: str, **env: str) -> tuple[int, str]:
    done = CliRunner().invoke(cli, ["webhooks", *args, "--db", str(db)], env={**ALLOW, **env})
    return done.exit_code, done.output


def test_add_sets_the_rate_limit_and_filter_and_list_shows_them(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    code, out = run(
        db, "add", "--url", "http://127.0.0.1:9/beta", "--event", "score.drop",
        "--rate-limit", "50", "--filter", '{"cohort": {"in": ["beta"]}}', "--json",
    )  # fmt: skip
    assert code == 0, out
    made = json.loads(out)
    assert (made["rateLimit"], made["filter"]) == (50, {"cohort": {"in": ["beta"]}})
    code, out = run(db, "add", "--url", "http://127.0.0.1:9/all", "--event", "score.drop")
    assert code == 0, out
    code, out = run(db, "list")
    assert code == 0, out
    beta, every = out.splitlines()
    assert beta.startswith(f"{made['id']}  active  healthy  http://127.0.0.1:9/beta  score.drop")
    assert 'at most 50/s, filter {"cohort": {"in": ["beta"]}}' in beta
    assert "at most" not in every and "filter" not in every
    code, out = run(db, "list", "--json")
    listed = [json.loads(line) for line in out.splitlines()]
    assert [(h["rateLimit"], h["filter"]) for h in listed] == [
        (50, {"cohort": {"in": ["beta"]}}), (None, None)
    ]  # fmt: skip
    assert all("secret" not in h for h in listed)


def test_add_refuses_a_rate_over_the_setting_and_a_filter_that_is_not_a_match(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.db"
    url = ["--url", "http://127.0.0.1:9/x"]
    code, out = run(db, "add", *url, "--rate-limit", "20", RECEIVER_WEBHOOK_MAX_RATE="10")
    assert code == 1 and "rateLimit must be a number of deliveries a second from 1 to 10" in out
    code, out = run(db, "add", *url, "--filter", '{"score": {"bogus": 1}}')
    assert code == 1 and 'filter.score: unknown operator "bogus"' in out
    code, out = run(db, "add", *url, "--filter", "{userId: u1}")
    assert code == 2 and "Invalid value for --filter: not JSON" in out
    code, out = run(db, "add", *url, "--filter", '["u1"]')
    assert code == 1 and "filter must be a JSON object" in out
    assert run(db, "list")[1].startswith("no webhook subscribers")


def test_list_shows_a_failing_subscription_s_health_since_when_and_why(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    code, out = run(db, "add", "--url", "http://127.0.0.1:9/down", "--json")
    assert code == 0, out
    public_id = json.loads(out)["id"]

    async def fail() -> None:
        store = open_store(str(db))
        await store.open()
        try:
            hook = await store.webhooks.get(public_id)
            assert hook is not None
            for i in range(5):
                await store.webhooks.record_delivery(
                    hook.id, ok=False, error="HTTP 500 Internal Server Error", now=1.8e9 + i,
                    policy=HealthPolicy(), make_event=lambda h, c, o: health_event(h, c, o, 0),
                )  # fmt: skip
        finally:
            await store.close()

    asyncio.run(fail())
    code, out = run(db, "list")
    assert code == 0, out
    assert f"{public_id}  active  failing since 2027-01-15T08:00:00.000Z: HTTP 500" in out
    code, out = run(db, "list", "--json")
    shown = json.loads(out)
    assert (shown["health"], shown["failingSince"]) == ("failing", "2027-01-15T08:00:00.000Z")


def test_set_changes_or_removes_the_rate_limit_and_filter_checked_as_on_registration(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.db"
    code, out = run(db, "add", "--url", "http://127.0.0.1:9/x", "--rate-limit", "5", "--json")
    hook = json.loads(out)["id"]
    code, out = run(db, "set", hook, "--rate-limit", "20", "--filter", '{"userId": "u1"}')
    assert (code, out) == (0, f'{hook}: at most 20/s, filter {{"userId": "u1"}}\n')
    code, out = run(db, "set", hook, "--no-filter")
    assert (code, out) == (0, f"{hook}: at most 20/s, no filter\n")
    code, out = run(db, "set", hook, "--no-rate-limit")
    assert (code, out) == (0, f"{hook}: no rate limit, no filter\n")
    shown = json.loads(run(db, "list", "--json")[1])
    assert (shown["rateLimit"], shown["filter"]) == (None, None)

    code, out = run(db, "set", hook, "--rate-limit", "2000")
    assert code == 1 and "rateLimit must be a number of deliveries a second from 1 to 1000" in out
    code, out = run(db, "set", hook, "--filter", '{"score": {"less": 3}}')
    assert code == 1 and 'filter.score: unknown operator "less"' in out
    code, out = run(db, "set", hook, "--filter", '{"a": 1}', "--no-filter")
    assert code == 2 and "--filter or --no-filter, not both" in out
    code, out = run(db, "set", hook)
    assert code == 2 and "nothing to change" in out
    code, out = run(db, "set", "wh_nope", "--rate-limit", "3")
    assert code == 1 and "no webhook 'wh_nope'" in out
    shown = json.loads(run(db, "list", "--json")[1])
    assert (shown["rateLimit"], shown["filter"]) == (None, None)  # refusals changed nothing


def test_enable_brings_a_disabled_one_back_only_after_a_test_delivery_succeeds(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    db = tmp_path / "r.db"
    code, out = run(db, "add", "--url", f"{http_sink.url}/back", "--json")
    hook = json.loads(out)["id"]
    assert run(db, "enable", hook) == (0, f"{hook} is active already\n")

    async def disable() -> None:
        store = open_store(str(db))
        await store.open()
        try:
            await store.webhooks.update(hook, now=1.8e9, status="disabled", reason="410 Gone")
        finally:
            await store.close()

    asyncio.run(disable())
    http_sink.fail_with(500)
    code, out = run(db, "enable", hook)
    assert code == 1 and f"{hook} stays disabled: its test delivery failed (HTTP 500" in out
    assert json.loads(run(db, "list", "--json")[1])["status"] == "disabled"
    http_sink.ok()
    assert run(db, "enable", hook) == (0, f"enabled {hook}: its test delivery answered 200\n")
    shown = json.loads(run(db, "list", "--json")[1])
    assert (shown["status"], shown["health"]) == ("active", "healthy")
    tests = [r.json for r in http_sink.requests if r.path == "/back"]
    assert [t["type"] for t in tests] == ["webhook.test", "webhook.test"]
    told = dbview.query(str(db), "SELECT type FROM events WHERE type LIKE 'webhook.%'")
    assert told == [("webhook.recovered",)]  # its owner told, once
