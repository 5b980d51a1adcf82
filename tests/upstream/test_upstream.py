"""The upstream client against the fake upstream as a real server (`receiver simulate
--serve-api` on a free port): registration, status, backfill and enrichment, end to end."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver import events, signature
from receiver.events import iso
from receiver.store import open_store
from receiver.upstream.client import LocalBudget, UpstreamClient
from receiver.upstream.sync import Result, backfill
from tests.fake_upstream import KEYS, FakeUpstream
from tests.harness import Receiver, run_cli
from tests.servers import HTTPSink, free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeUpstream]:
    """The fake with its live sessions standing still (a tick an hour): what it serves
    does not change under a test, however slow the machine."""
    server = FakeUpstream(tmp_path, tick=3600).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def live_fake(tmp_path: Path) -> Iterator[FakeUpstream]:
    """The fake with its live sessions moving five times a second."""
    server = FakeUpstream(tmp_path, tick=0.2).start()
    try:
        yield server
    finally:
        server.stop()


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(list(args), {**os.environ, **env}, timeout=120)


# -- register and status --------------------------------------------------------------------


def test_register_prints_the_secret_line_and_the_fake_delivers_signed_events(
    live_fake: FakeUpstream, tmp_path: Path, http_sink: HTTPSink
) -> None:
    fake = live_fake
    db = str(tmp_path / "r.db")
    done = cli(
        "upstream", "register", "--db", db, "--url", f"{http_sink.url}/v1/events",
        "--events", "score.drop,score.recover", "--threshold", "40",
        env=fake.env("free"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "registered wh_" in done.stdout
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RECEIVER_SECRETS=")]
    secret = line.removeprefix("RECEIVER_SECRETS=")
    assert len(secret) == 64
    [hook] = fake.get("/webhooks").json()["webhooks"]
    assert hook["events"] == ["score.drop", "score.recover"] and hook["threshold"] == 40
    assert "secret" not in hook  # shown once, at registration
    # The live sessions' drops and recoveries arrive, signed with that secret.
    [first, *_] = http_sink.wait_for(1, timeout=60)
    assert first.json["type"] in ("score.drop", "score.recover")
    signature.verify([secret.encode()], first.body, first.headers["X-Service-Signature"])


def test_register_refuses_an_unknown_event_name(fake: FakeUpstream, tmp_path: Path) -> None:
    done = cli(
        "upstream", "register", "--db", str(tmp_path / "r.db"), "--url", "http://x/v1/events",
        "--events", "score.dropped", env=fake.env(),
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown event 'score.dropped'" in done.stderr


def test_status_checks_reachability_and_the_key(fake: FakeUpstream, tmp_path: Path) -> None:
    db = str(tmp_path / "r.db")
    ok = cli("upstream", "status", "--db", db, env=fake.env("pro"))
    assert ok.returncode == 0, ok.stderr
    assert "reachable, key accepted" in ok.stdout and "30 sessions upstream" in ok.stdout
    wrong = cli(
        "upstream", "status", "--db", db, env={**fake.env(), "RECEIVER_UPSTREAM_KEY": "ar_x"}
    )
    assert wrong.returncode == 1
    assert "HTTP 401: unauthorized" in wrong.stderr
    assert "ar_x" not in wrong.stderr + wrong.stdout  # the key is never printed
    down = {**fake.env(), "RECEIVER_UPSTREAM_URL": f"http://127.0.0.1:{free_port()}/v1"}
    unreachable = cli("upstream", "status", "--db", db, env=down)
    assert unreachable.returncode == 1
    assert "could not be reached" in unreachable.stderr


def test_upstream_commands_say_what_to_set_when_not_configured(tmp_path: Path) -> None:
    env = {"RECEIVER_UPSTREAM_URL": "", "RECEIVER_UPSTREAM_KEY": ""}
    done = cli("upstream", "status", "--db", str(tmp_path / "r.db"), env=env)
    assert done.returncode == 1
    assert "set RECEIVER_UPSTREAM_URL" in done.stderr


# -- sync ----------------------------------------------------------------------------------


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _projection(db: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every session of the local read API and its score history, by id."""

    async def read() -> tuple[dict[str, Any], dict[str, Any]]:
        store = open_store(db)
        await store.open()
        try:
            from receiver.store.records import SessionQuery

            found: dict[str, Any] = {}
            cursor = None
            for _ in range(100):
                page = await store.sessions.page(SessionQuery(limit=100, cursor=cursor))
                found.update({s.id: s.as_dict() for s in page.sessions})
                cursor = page.cursor
                if cursor is None:
                    break
            history = {sid: await store.sessions.score_history(sid) for sid in found}
            return found, history
        finally:
            await store.close()

    return asyncio.run(read())


def test_sync_copies_sessions_and_histories_and_a_second_run_changes_nothing(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    db = str(tmp_path / "r.db")
    first = cli("upstream", "sync", "--db", db, "--json", env=fake.env("enterprise"))
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["total"] == 30 and result["done"] == 30 and result["changed"] == 30
    sessions, history = _projection(db)
    assert len(sessions) == 30
    finished = fake.get("/sessions/sess_up_000").json()
    mine = sessions["sess_up_000"]
    for field in ("userId", "score", "status", "context", "signals", "interventions"):
        assert mine[field] == finished[field], field
    # The read API writes microseconds, the service milliseconds: the same instant.
    assert _instant(mine["startedAt"]) == _instant(finished["startedAt"])
    theirs = fake.get("/sessions/sess_up_000/scores").json()["history"]
    assert [(float(p["score"]), _instant(p["timestamp"])) for p in theirs] == [
        (score, _instant(ts)) for score, ts in history["sess_up_000"]
    ]
    # Again: nothing changes.
    again = cli("upstream", "sync", "--db", db, "--json", env=fake.env("enterprise"))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["changed"] == 0
    assert _projection(db) == (sessions, history)


def test_sync_filters_by_start_date(fake: FakeUpstream, tmp_path: Path) -> None:
    """The fake's finished sessions started over the past day: a range from an hour ago
    takes only the newer ones."""
    since = datetime.fromtimestamp(time.time() - 3600, UTC)
    start = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    wanted = fake.get("/sessions", **{"from": start, "limit": "100"}).json()["total"]
    assert 0 < wanted < 30
    db = str(tmp_path / "r.db")
    done = cli("upstream", "sync", "--db", db, "--from", start, "--json", env=fake.env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total"] == wanted
    sessions, _ = _projection(db)
    assert len(sessions) == wanted
    assert all(_instant(s["startedAt"]) >= since for s in sessions.values())


def test_sync_interrupted_continues_from_its_last_page(fake: FakeUpstream, tmp_path: Path) -> None:
    db = str(tmp_path / "r.db")

    class Interrupted(Exception):
        pass

    async def run(stop_after: int | None) -> tuple[Result | None, int]:
        store = open_store(db)
        await store.open()
        client = UpstreamClient(fake.url, KEYS["enterprise"], budget=LocalBudget("enterprise"))

        def progress(result: Result) -> None:
            if stop_after is not None and result.done >= stop_after:
                raise Interrupted  # as Ctrl-C would, mid-page

        try:
            return await backfill(client, store, start=None, end=None, on_progress=progress,
                                  page_size=10), client.requests  # fmt: skip
        except Interrupted:
            return None, client.requests
        finally:
            await client.aclose()
            await store.close()

    interrupted, _ = asyncio.run(run(stop_after=15))  # pages of 10: the first one is kept
    assert interrupted is None
    resumed, requests = asyncio.run(run(stop_after=None))
    assert resumed is not None and resumed.resumed
    assert resumed.done == resumed.total == 30
    # It continued at the second page: 20 sessions read (2 requests each) and 2 pages.
    assert requests == 20 * 2 + 2
    sessions, _ = _projection(db)
    assert len(sessions) == 30


def test_sync_stays_inside_the_free_plan(fake: FakeUpstream, tmp_path: Path) -> None:
    """The free plan's 60 a minute: the bucket lets 6 go at once, then 0.9 a second, so a
    sync asking for more than 6 waits instead of being refused."""
    db = str(tmp_path / "r.db")

    async def run() -> tuple[int, int]:
        store = open_store(db)
        await store.open()
        from receiver.upstream.client import StoreBudget

        client = UpstreamClient(fake.url, KEYS["free"], budget=StoreBudget(store, "free"))
        try:
            for sid in ("sess_up_000", "sess_up_001", "sess_up_002", "sess_up_003"):
                await client.session(sid)
                await client.scores(sid)
            return client.requests, client.throttled
        finally:
            await client.aclose()
            await store.close()

    requests, throttled = asyncio.run(run())
    assert (requests, throttled) == (8, 0)
    assert fake.stats()["throttled"] == 0


def test_a_429_holds_every_request_for_its_retry_after(fake: FakeUpstream, tmp_path: Path) -> None:
    """Use up the free key's minute behind the client's back; the client's next request is
    answered 429, and the shared budget is held for Retry-After seconds."""
    for _ in range(60):
        assert fake.get("/sessions", plan="free", limit="1").status_code == 200
    refused = fake.get("/sessions", plan="free", limit="1")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    wait = int(refused.headers["Retry-After"])
    assert 1 <= wait <= 60

    async def run() -> tuple[str, float, int]:
        store = open_store(str(tmp_path / "r.db"))
        await store.open()
        from receiver.errors import UpstreamError
        from receiver.upstream.client import StoreBudget

        slept: list[float] = []

        async def no_sleep(seconds: float) -> None:
            slept.append(seconds)
            raise UpstreamError("stopped waiting")  # a test does not wait a minute

        client = UpstreamClient(fake.url, KEYS["free"], budget=StoreBudget(store, "free"),
                                sleep=no_sleep)  # fmt: skip
        try:
            try:
                await client.session("sess_up_000")
            except UpstreamError as exc:
                outcome = str(exc)
            # Any replica drawing on the shared budget now waits out the hold too.
            return outcome, await StoreBudget(store, "free").take(), client.throttled
        finally:
            await client.aclose()
            await store.close()

    outcome, held, throttled = asyncio.run(run())
    assert throttled == 1 and outcome == "stopped waiting"
    assert wait - 5 <= held <= wait  # the budget is held for Retry-After, not less


# -- enrichment ------------------------------------------------------------------------------

RULES = """
notifiers:
  hook: "{url}"
rules:
  - name: drop
    match:
      type: score.drop
    notify: hook
    title: "{{{{ userId }}}} dropped on {{{{ session.context | default('?') }}}}"
    body: >-
      status={{{{ session.status | default('?') }}}}
      signals={{{{ session.signals | default('?') }}}}
      started={{{{ session.startedAt | default('?') }}}}
      points={{{{ history | length }}}} enriched={{{{ enriched }}}}
"""


def _drop(session_id: str, n: int) -> dict[str, Any]:
    return events.sample(
        "score.drop",
        id=f"evt_enrich_{n}",
        sessionId=session_id,
        userId="user_1",
        score=20,
        timestamp=_now(),
    )


def _now() -> str:
    return iso(datetime.now(UTC), digits=3)


def test_notifications_are_enriched_from_upstream_and_go_out_without_when_it_is_down(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    fake = FakeUpstream(tmp_path).start()
    try:
        env = {**fake.env("pro"), "RECEIVER_UPSTREAM_TIMEOUT": "1s"}
        server = Receiver(tmp_path, rules=RULES.format(url=http_sink.json_url()), env=env).start()
        try:
            truth = fake.get("/sessions/sess_up_001").json()
            points = len(fake.get("/sessions/sess_up_001/scores").json()["history"])
            assert server.send(_drop("sess_up_001", 1)).status_code == 202
            [sent] = http_sink.wait_for(1, timeout=20)
            assert sent.json["title"] == f"user_1 dropped on {truth['context']}"
            assert sent.json["message"] == (
                f"status={truth['status']} signals={truth['signals']}"
                f" started={truth['startedAt']} points={min(points, 20)} enriched=true"
            )
            # The upstream goes down: the next notification still goes out, unenriched,
            # after at most the timeout, with one log line saying why.
            fake.stop()
            assert server.send(_drop("sess_up_002", 2)).status_code == 202
            [_, plain] = http_sink.wait_for(2, timeout=20)
            assert plain.json["title"] == "user_1 dropped on ?"
            assert plain.json["message"] == "status=? signals=? started=? points=0 enriched=false"
            lines = [x for x in server.logs().splitlines() if "without enrichment" in x]
            assert len(lines) == 1 and "evt_enrich_2" in lines[0]
            assert "could not be reached" in lines[0]
            assert KEYS["pro"] not in server.logs()
        finally:
            server.stop()
    finally:
        fake.stop()


def test_a_slow_upstream_delays_a_notification_by_the_timeout_at_most(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    slow = HTTPSink().start()
    slow.delay(30)
    try:
        env = {
            "RECEIVER_UPSTREAM_URL": f"{slow.url}/v1",
            "RECEIVER_UPSTREAM_KEY": "ar_k",
            "RECEIVER_UPSTREAM_TIMEOUT": "0.5",
        }
        server = Receiver(tmp_path, rules=RULES.format(url=http_sink.json_url()), env=env).start()
        try:
            assert server.send(_drop("sess_slow", 3)).status_code == 202
            [sent] = http_sink.wait_for(1, timeout=20)
            assert sent.json["message"].endswith("enriched=false")
            assert slow.requests  # it was asked
            [line] = [x for x in server.logs().splitlines() if "without enrichment" in x]
            assert "did not answer within 0.5s" in line
        finally:
            server.stop()
    finally:
        slow.stop()


def test_enrichment_is_never_on_the_ingest_path(tmp_path: Path, http_sink: HTTPSink) -> None:
    """With the upstream stalling, events are still acknowledged (202) at once; the stall
    only holds the notification, never the POST."""
    slow = HTTPSink().start()
    slow.delay(30)
    try:
        env = {"RECEIVER_UPSTREAM_URL": f"{slow.url}/v1", "RECEIVER_UPSTREAM_KEY": "ar_k",
               "RECEIVER_UPSTREAM_TIMEOUT": "5"}  # fmt: skip
        server = Receiver(tmp_path, rules=RULES.format(url=http_sink.json_url()), env=env).start()
        try:
            for n in range(5):
                response = server.send(_drop(f"sess_i{n}", 10 + n))
                assert response.status_code == 202
            assert not http_sink.requests  # still waiting on the upstream
            assert len(server.query("SELECT id FROM events")) == 5
        finally:
            server.stop()
    finally:
        slow.stop()


def test_explain_shows_the_enriched_fields(fake: FakeUpstream, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(url="json://127.0.0.1:9/x"))
    truth = fake.get("/sessions/sess_up_003").json()
    done = cli(
        "explain", "--rules", str(rules), "--db", str(tmp_path / "none.db"),
        "--type", "score.drop", "--session", "sess_up_003", "--user", "user_1",
        env=fake.env("free"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f'session.context = "{truth["context"]}"' in done.stdout
    assert f'session.status = "{truth["status"]}"' in done.stdout
    assert f"user_1 dropped on {truth['context']}" in done.stdout
    assert "enriched=true" in done.stdout
    assert not (tmp_path / "none.db").exists()  # explain creates no database


def test_explain_without_upstream_says_templates_see_empty_session(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(url="json://127.0.0.1:9/x"))
    done = cli("explain", "--rules", str(rules), "--type", "score.drop",
               env={"RECEIVER_UPSTREAM_URL": "", "RECEIVER_UPSTREAM_KEY": ""})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "enrichment: none (the upstream is not configured)" in done.stdout
    assert "dropped on ?" in done.stdout


def test_receiver_without_upstream_settings_never_calls_out(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    env = {"RECEIVER_UPSTREAM_URL": "", "RECEIVER_UPSTREAM_KEY": ""}
    server = Receiver(tmp_path, rules=RULES.format(url=http_sink.json_url()), env=env).start()
    try:
        assert server.send(_drop("sess_up_001", 20)).status_code == 202
        [sent] = http_sink.wait_for(1, timeout=20)
        assert sent.json["message"].endswith("enriched=false")
        assert "without enrichment" not in server.logs()
    finally:
        server.stop()


def test_the_fake_refuses_requests_without_a_key(fake: FakeUpstream) -> None:
    response = httpx.get(f"{fake.url}/sessions", timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
