"""`make demo`'s flapping scene: a score that hovers around its threshold, with and without
`flap`.

The simulator's session model (receiver.simulator.walk) walks two demo sessions through the
same score series around a threshold of 50: nine changes, ending below it. The first
session's rule has `flap: {changes: 4, within: 1m, quiet: 5s}` (minutes shortened to
seconds, as the demo's retries are), the second's is the same rule without it. Without
`flap` each change is a message (a drop, or the resolved message of `resolve: true`); with
it the first three go out, the fourth sends one flapping message, the rest are kept as
`flapping` rows, and once the session has stayed below for `quiet` one settled message says
so. The demo prints both counts.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

import httpx
from rich.markup import escape

from receiver import signature
from receiver.simulator.walk import Walk, timestamp
from receiver.store import Store
from receiver.store.records import EventQuery, OutboxQuery

THRESHOLD = 50.0
# Around the threshold: nine crossings (drop, recover, ...), ending below it.
SERIES = (45.0, 55.0, 44.0, 56.0, 47.0, 53.0, 46.0, 54.0, 45.0)
FLAP = "{changes: 4, within: 1m, quiet: 5s}"
WITH, WITHOUT = "flap-scene", "no-flap-scene"  # the two rules
DONE = ("delivered", "dead", "flapping")  # the outbox states a row rests in

# Put first in the demo's rules: only the scene's sessions match them. Titles name the
# session's context as every demo rule does: unknown upstream, so "on ?" (not enriched).
RULES = """\
  - name: {name}
    match:
      type: score.drop
      sessionId: "{prefix}_*"
    notify: [slack]
    resolve: true{flap}
    title: >-
      {{{{ sessionId }}}} dropped to {{{{ score }}}} on {{{{ session.context|default('?') }}}}
"""


class Stage(Protocol):
    """What the scene needs of the demo: its say(), the secret, the receiver."""

    secret: str

    def say(self, what: str, text: str, style: str = "") -> None: ...
    def messages(self) -> list[tuple[str, dict[str, Any]]]: ...
    @property
    def receiver_url(self) -> str: ...
    @property
    def console(self) -> Any: ...


def rules(text: str) -> str:
    """The demo's rules file with the scene's two rules put first."""
    scene = RULES.format(name=WITH, prefix="demo_flap", flap=f"\n    flap: {FLAP}")
    scene += RULES.format(name=WITHOUT, prefix="demo_noflap", flap="")
    return text.replace("rules:\n", "rules:\n" + scene, 1)


def walk(session: str) -> Walk:
    return Walk(session, "user_flap", THRESHOLD, 60.0, random.Random(7))


async def play(demo: Stage, store: Store, timeout: float = 30.0) -> dict[str, str]:
    """Run the scene; the messages each session produced, for the summary."""
    run = uuid.uuid4().hex[:6]
    flapping, steady = f"demo_flap_{run}", f"demo_noflap_{run}"
    walks = [walk(flapping), walk(steady)]
    scores = " ".join(f"{s:g}" for s in SERIES)
    demo.say("flapping", f"{flapping} and {steady}: scores {scores} around 50", "yellow")
    sent = 0
    async with httpx.AsyncClient(timeout=10) as client:
        for score in SERIES:
            for one in walks:
                for fields in one.move_to(score):
                    if not fields["type"].startswith("score."):
                        continue  # its interventions are alerts of their own
                    event = {**fields, "id": f"evt_{one.session_id}_{sent}"}
                    event["timestamp"] = timestamp(datetime.now(UTC))
                    await _send(client, demo, event)
                    sent += 1
            # One change at a time: each routed before the next, as a real hover would be.
            await _until(partial(_routed, store, (flapping, steady), sent), timeout)
    demo.say("flapping", f"{len(SERIES)} changes each; {WITH} has flap: {FLAP}", "yellow")
    await _until(partial(_settled, store), timeout + 5)
    with_flap = _titles(demo, flapping)
    without = _titles(demo, steady)
    flaps = sum("] flapping: " in t for t in with_flap)
    settled = sum(_settle(t) for t in with_flap)
    before = len(with_flap) - flaps - settled
    demo.say("flapping", f"without flap: {len(without)} messages, one per change", "yellow")
    demo.say(
        "flapping",
        f"with flap: {len(with_flap)} messages: {before} before it flapped, {flaps} flapping,"
        f" {settled} settled",
        "yellow",
    )
    for title in with_flap:
        demo.console.print(f"            [yellow]│[/yellow] {escape(title)}", highlight=False)
    return {
        f"{steady} (no flap)": f"{len(without)} messages for {len(SERIES)} changes",
        f"{flapping} (flap)": f"{len(with_flap)} messages: {before} + {flaps} flapping"
        f" + {settled} settled",
    }


async def _send(client: httpx.AsyncClient, demo: Stage, event: dict[str, Any]) -> None:
    body = json.dumps(event).encode()
    headers = {signature.SIGNATURE_HEADER: signature.sign(demo.secret.encode(), body)}
    answer = await client.post(f"{demo.receiver_url}/v1/events", content=body, headers=headers)
    if answer.status_code != 202:
        raise httpx.HTTPError(f"the flapping scene's event was refused: {answer.status_code}")


async def _routed(store: Store, sessions: tuple[str, ...], sent: int) -> bool:
    rows = []
    for session in sessions:
        rows += await store.events.page(EventQuery(limit=100, session_id=session))
    return len(rows) == sent and all(r.routed_at is not None for r in rows)


async def _settled(store: Store) -> bool:
    """The flapping session has settled, and every row of both rules has been sent or kept."""
    rows = []
    for rule in (WITH, WITHOUT):
        rows += await store.outbox.page(OutboxQuery(limit=100, rule=rule))
    settled = any(r.rule == WITH and _settle(r.title) for r in rows)
    return settled and all(r.state in DONE for r in rows)


def _settle(title: str) -> bool:
    """A settle message's title: `[settled open] ...` or `[rule] settled recovered: ...`."""
    return title.startswith("[settled") or "] settled " in title


def _titles(demo: Stage, session: str) -> list[str]:
    """The titles of the messages about session that reached the sink."""
    titles = (str(m.get("title", "")) for _, m in demo.messages())
    return [t for t in titles if session in t]


async def _until(check: Callable[[], Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the flapping scene's session did not settle in time")
