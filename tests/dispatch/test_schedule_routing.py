"""A rule notifying schedule:primary reaches the member on call when the event is routed: the
real router and pipeline on SQLite, on a FakeClock; the outbox row names a real notifier."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from receiver import events
from receiver.dispatch.router import Router
from receiver.metrics import Metrics
from receiver.rules.load import load_file
from receiver.store import SQLiteStore
from tests.harness import FakeClock

RULES = Path(__file__).resolve().parents[1] / "testdata" / "rules.schedules.yaml"
BERLIN = ZoneInfo("Europe/Berlin")
DAY = 86400.0


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=BERLIN).timestamp()


def route_at(
    tmp_path: Path, moments: list[float], *, quiet_until: float | None = None
) -> list[tuple[str, str, str]]:
    """Route one score.drop at each moment (the clock set there), then with quiet_until run
    the timers there; the outbox rows' (event id, rule, notifier) in order."""
    ruleset = load_file(RULES)
    clock = FakeClock(moments[0])

    async def main() -> None:
        store = SQLiteStore(tmp_path / "r.db", clock=clock)
        await store.open()
        try:
            router = Router(
                store, lambda: ruleset, metrics=Metrics(), on_routed=lambda: None, clock=clock
            )
            for number, moment in enumerate(moments):
                clock.advance(moment - clock.now)
                stamp = datetime.fromtimestamp(moment, BERLIN).isoformat()
                event = events.validate(
                    events.sample(
                        "score.drop", id=f"evt_{number}", sessionId=f"s{number}", timestamp=stamp
                    )
                )
                await store.events.accept(event, event.model_dump_json().encode())
                await router.route_pending()
            if quiet_until is not None:
                clock.advance(quiet_until - clock.now)
                await router.tick()
        finally:
            await store.close()

    asyncio.run(main())
    with sqlite3.connect(tmp_path / "r.db") as conn:
        rows = conn.execute("SELECT event_id, rule, notifier FROM outbox ORDER BY id").fetchall()
    return [(str(e), str(r), str(n)) for e, r, n in rows]


def test_a_rule_notifying_a_schedule_reaches_the_member_on_call(tmp_path: Path) -> None:
    moments = [
        at("2026-12-02T12:00"),  # alice's week
        at("2026-12-07T08:59"),  # still alice: the handoff is at 09:00
        at("2026-12-07T09:00"),  # bob's week
        at("2026-12-25T12:00"),  # the override: carol
        at("2026-12-27T00:00"),  # the override has ended: alice again
    ]
    assert route_at(tmp_path, moments) == [
        ("evt_0", "deep-drop", "alice-chat"),
        ("evt_1", "deep-drop", "alice-chat"),
        ("evt_2", "deep-drop", "bob-chat"),
        ("evt_3", "deep-drop", "carol-mail"),
        ("evt_4", "deep-drop", "alice-chat"),
    ]


def test_the_heartbeat_pages_whoever_is_on_call_when_it_fires(tmp_path: Path) -> None:
    # silent_for 1h: the last event is alice's, the silence is noticed in bob's week.
    rows = route_at(tmp_path, [at("2026-12-07T07:30")], quiet_until=at("2026-12-07T09:30"))
    assert rows == [("evt_0", "deep-drop", "alice-chat"), ("-", "(heartbeat)", "bob-chat")]
