"""One explanation, three ways to read it: `GET /v1/events/:id/explain`, `receiver explain
--event ID` and the admin page's Why table give the same rule, decision, reason and later
states for every event, against the real app under uvicorn on a clock the test drives. The
events are the ones explain used to get wrong: a rule that only escalates, silenced,
inhibited, quiet or held back by a storm (named `storm`, as its decision is); the event that
resolved an alert; a notification inhibited, then sent when its source ended."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.admin.auth import COOKIE
from receiver.cli import cli
from receiver.store import SQLiteStore
from tests.dispatch.test_lifecycle import T0, event
from tests.harness import FakeClock, InProcessReceiver, eventually, http_client
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

RULES = """
notifiers:
  hook: "{url}/hook"
  pager: "{url}/pager"
escalations:
  page:
    steps:
      - notify: [pager]
inhibit:
  - name: covers
    source: {{type: intervention.fired}}
    target: {{type: score.drop}}
    equal: [sessionId]
rules:
  - name: quiet
    match: {{type: score.drop, userId: u_quiet}}
    escalate: page
    active: {{hours: "20:00-21:00", tz: UTC}}
  - name: storm
    match: {{type: score.drop, userId: u_deep}}
    escalate: page
    storm: {{max: 2, per: 30s}}
  - name: page
    match: {{type: score.drop}}
    notify: hook
    resolve: true
"""


@pytest.fixture
def server(tmp_path: Path, http_sink: HTTPSink) -> Iterator[InProcessReceiver]:
    url = http_sink.json_url("").rstrip("/")
    found = InProcessReceiver(tmp_path, RULES.format(url=url), FakeClock(T0.timestamp())).start()
    try:
        yield found
    finally:
        found.stop()


def silence(server: InProcessReceiver, matchers: dict[str, str], reason: str) -> None:
    """A silence of an hour from the server's (fake) now: `receiver silence add` would
    start it at the real time, days after the clock the server routes by."""

    async def add() -> None:
        store = SQLiteStore(server.db)
        await store.open()
        try:
            now = server.clock.now
            await store.transact(lambda tx: tx.silences.add(matchers, reason, now, now + 3600))
        finally:
            await store.close()

    asyncio.run(add())


# A later state's time: ISO in the API and the CLI, the page's one format on the admin page
# ("2026-11-23 10:01:00 UTC"); the same instant to the second.
_AT = re.compile(
    r"^then (\w+) at (\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:\.\d+)?(?:Z| UTC) — "
)


def _at(state: str) -> str:
    """A later state with its time in one form, to compare where each shows it."""
    return _AT.sub(r"then \1 at \2 \3 — ", state)


def cli_ok(*args: str) -> str:
    done = CliRunner().invoke(cli, list(args))
    assert done.exit_code == 0, done.output
    return done.output


def from_api(server: InProcessReceiver, key: str, event_id: str) -> list[tuple[str, ...]]:
    found = http_client.get(
        f"{server.url}/v1/events/{event_id}/explain",
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert found.status_code == 200, found.text
    said = []
    for r in found.json()["rules"]:
        later = tuple(
            _at(f"then {s['decision']} at {s['at']} — {s['reason']}")
            for s in r.get("states", [])[1:]
        )
        said.append((r["rule"], r.get("decision", "not matched"), r["reason"], *later))
    return said


def from_cli(server: InProcessReceiver, event_id: str) -> list[tuple[str, ...]]:
    out = cli_ok(
        "explain", "--event", event_id, "--db", str(server.db), "--rules", str(server.rules)
    )
    said: list[tuple[str, ...]] = []
    for line in out.splitlines():
        if found := re.fullmatch(r"\d+\. ([\w.-]+): not matched: (.*)", line):
            said.append((found[1], "not matched", found[2]))
        elif found := re.fullmatch(r"\d+\. ([\w.-]+): (\w+) — (.*)", line):
            said.append((found[1], found[2], found[3]))
        elif line.startswith("     then "):
            said[-1] = (*said[-1], _at(line.strip()))
    return said


def from_admin(server: InProcessReceiver, cookie: str, event_id: str) -> list[tuple[str, ...]]:
    page = http_client.get(
        f"{server.url}/admin/events/{event_id}", headers={"cookie": f"{COOKIE}={cookie}"}
    )
    assert page.status_code == 200, page.text[:300]
    table = page.text.split('<table class="why">', 1)[1].split("</table>", 1)[0]
    said = []
    for rule, decision, reason in re.findall(
        r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td>", table, re.S
    ):
        first, *later = reason.split("<br>")
        said.append(
            tuple(
                _at(html.unescape(re.sub(r"<[^>]+>", "", c)))
                for c in (rule, decision, first, *later)
            )
        )
    return said


def test_the_api_the_cli_and_the_admin_page_explain_alike(
    server: InProcessReceiver, http_sink: HTTPSink
) -> None:
    silence(server, {"sessionId": "s_sil"}, "deploy")
    stream = [
        event("intervention.fired", "i_inh", 0, "s_inh", interventionId="a"),
        event("intervention.fired", "i_inh2", 0, "s_inh2", interventionId="b"),
        event("score.drop", "e_silenced", 0.01, "s_sil", userId="u_deep"),
        event("score.drop", "e_inhibited", 0.01, "s_inh", userId="u_deep"),
        event("score.drop", "e_quiet", 0.01, "s_quiet", userId="u_quiet"),
        *(event("score.drop", f"e_deep{i}", 0.01, f"s_deep{i}", userId="u_deep") for i in range(5)),
        event("score.drop", "e_page", 0.01, "s_page", userId="u_page"),
        event("score.drop", "e_later", 0.01, "s_inh2", userId="u_page"),
    ]
    for sent in stream:
        assert server.send(sent).status_code == 202
    server.wait_routed(len(stream))
    server.clock.advance(60)
    ends = [
        event("score.recover", "e_recover", 1, "s_page", userId="u_page"),
        event("intervention.resolved", "i_inh2_end", 1, "s_inh2", interventionId="b"),
    ]
    for sent in ends:
        assert server.send(sent).status_code == 202
    server.wait_routed(len(stream) + len(ends))

    # The storm: two alerts paged, then one storm message to the pager for the other three.
    def pages() -> list[str]:
        return sorted(r.json["title"] for r in http_sink.requests if r.path == "/pager")

    eventually(lambda: len(pages()) >= 3, "the storm message")
    assert pages() == [
        "[storm] score.drop for s_deep0",
        "[storm] score.drop for s_deep1",
        "[storm] storm: 3 more alerts held back, not paged",
    ]

    key = json.loads(
        cli_ok("keys", "create", "--name", "ops", "--plan", "enterprise", "--role", "admin",
               "--json", "--db", str(server.db))
    )["key"]  # fmt: skip
    signed_in = http_client.post(f"{server.url}/admin/login", data={"key": key})
    assert signed_in.status_code == 303, signed_in.text
    cookie = signed_in.cookies[COOKIE]

    decided: dict[str, str] = {}
    for event_id in ["e_silenced", "e_inhibited", "e_quiet", "e_deep4", "e_recover", "e_later"]:
        api = from_api(server, key, event_id)
        assert from_cli(server, event_id) == api, event_id
        assert from_admin(server, cookie, event_id) == api, event_id
        decided[event_id] = next(
            f"{rule}: {decision}" for rule, decision, *_ in api if decision != "not matched"
        )
    assert decided == {
        "e_silenced": "storm: silenced",
        "e_inhibited": "storm: inhibited",
        "e_quiet": "quiet: quiet",
        "e_deep4": "storm: storm",
        "e_recover": "page: sent",  # its resolved message: the rule did not match the recover
        "e_later": "page: inhibited",  # then sent when covers ended
    }
    later = from_api(server, key, "e_later")
    [(_, _, _, then)] = [r for r in later if r[0] == "page"]
    assert then.startswith("then sent at ") and "was inhibited by covers since" in then
