"""The backtest's own reads and fast paths give what the general ones give: the period's
rows (receiver.store.replay) in store.history.between()'s order and pages, a throttle key
rendered without the template context, a throttled rule's decisions kept by key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from receiver import events, rules
from receiver.backtest import period
from receiver.backtest import replay as backtest
from receiver.store import open_store, replay

START = 1_795_000_000.0


def test_the_replay_rows_are_the_history_events_in_the_same_order(tmp_path: Path) -> None:
    clock = [START]
    # Ties in arrival time (ordered by id) across page boundaries, and events outside.
    arrivals = [START - 1, START, START, START, START + 1, START + 1, START + 2, START + 9]

    async def main() -> tuple[list[tuple[str, float, str]], list[tuple[str, float, str]]]:
        store = open_store(str(tmp_path / "receiver.db"), clock=lambda: clock[0])
        await store.open()
        try:
            for i, received in enumerate(arrivals):
                payload = events.sample("score.drop", id=f"e{(7 * i) % 8}")
                clock[0] = received
                await store.events.accept(events.validate(payload), json.dumps(payload).encode())
            end = START + 9
            read = []
            after = None
            while rows := await replay.page(store, START, end, after=after, limit=2):
                read += [(r[0], r[1], r[2]) for r in rows]
                after = (rows[-1][1], rows[-1][0])
            whole = await store.history.between(START, end, after=None, limit=100)
            return read, [(e.id, e.received_at, e.body) for e in whole]
        finally:
            await store.close()

    read, whole = asyncio.run(main())
    assert len(read) == 6
    assert read == whole


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("{{ userId }}", id="a-payload-field"),
        pytest.param("{{userId}}", id="no-spaces"),
        pytest.param("{{ score }}", id="a-number"),
        pytest.param("{{ nested }}", id="a-mapping"),
        pytest.param("{{ missing }}", id="undefined"),
        pytest.param("{{ rule }}", id="set-by-the-context"),
        pytest.param("{{ event }}", id="the-whole-event"),
        pytest.param("{{ delta }}", id="computed"),
        pytest.param("{{ links }}", id="the-links"),
        pytest.param("{{ session }}", id="the-enrichment"),
        pytest.param("{{ userId }}-{{ type }}", id="two-names"),
    ],
)
def test_a_throttle_key_is_rendered_as_route_renders_it(key: str) -> None:
    """render_key() prints a one-name template from the payload itself unless the name is
    one the template context sets: the same key as render() either way; and untitled_decisions(),
    which keeps a throttled rule's decisions by key, decides as route() does."""
    ruleset = rules.load_text(
        "notifiers:\n  hook: json://127.0.0.1:9/hook\nrules:\n"
        f"  - name: r\n    match: {{type: score.drop}}\n    notify: hook\n"
        f"    throttle: {{key: {json.dumps(key)}, every: 10m}}\n"
    )
    rule = ruleset.rules[0]
    untitled: dict[Any, Any] = {}
    for user, nested in (("u1", {"a": 1}), ("u2", None), ("u1", [1, 2]), (" u3 ", "x")):
        payload = events.sample("score.drop", userId=user, nested=nested, rule="mine")
        payload.update(delta=99, links="not links", session="s")
        assert rule.render_key(payload).throttle_key == rule.render(payload).throttle_key
        want = [(d.notifier, d.throttle_key) for d in ruleset.route(payload)]
        made = backtest.untitled_decisions(ruleset, payload, untitled)
        got = [(d.notifier, d.throttle_key) for d in made]
        assert got == want


def test_the_fast_paths_report_what_the_general_ones_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a day that sets every lifecycle option to work: a resolve that has nothing of its
    episode to answer skips the pipeline, a throttled rule's decisions are kept by key;
    without either (the pipeline asked at every resolve, nothing kept), the same results."""
    from receiver.store.memory_tables import MemoryScratch
    from tests.test_backtest import HEADER, at, keep
    from tests.test_backtest import START as T0
    from tests.test_backtest_parallel import CANDIDATE, CURRENT, day_of_events

    clock = [T0]
    stream = day_of_events()
    rulesets = [rules.load_text(HEADER + text) for text in (CANDIDATE, CURRENT)]

    async def main() -> list[backtest.Result]:
        store = open_store(str(tmp_path / "receiver.db"), clock=lambda: clock[0])
        await store.open()
        try:
            await keep(store, [dict(p) for p in stream], clock)
            results, _ = await period.run(store, rulesets, start=T0, end=at(24 * 60))
            return results
        finally:
            await store.close()

    fast = asyncio.run(main())
    tmp_path = tmp_path / "general"
    tmp_path.mkdir()
    monkeypatch.setattr(MemoryScratch, "answers", lambda self, alert: True)
    monkeypatch.setattr(backtest, "MAX_KEYED", 0)
    general = asyncio.run(main())
    assert sum(r.sent for r in fast) > 0
    for mine, theirs in zip(fast, general, strict=True):
        assert vars(mine) == vars(theirs)
