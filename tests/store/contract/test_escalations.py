"""tx.escalations and the notices that wait for a silence to end: chains started once,
their steps due in order, saved whole, stopped on resolve; what an ack or a snooze does to
them (store.alerts); databases from before the escalations table upgraded in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.escalations import MAX_LOG
from receiver.store.records import Action, Alert, Chain, Notice, waiting_key
from tests.store.contract.common import note, run, schema_before

POLICY: dict[str, Any] = {
    "name": "wake-someone",
    "steps": [
        {"after": 0.0, "notify": ["team-chat"]},
        {"after": 300.0, "notify": ["schedule:primary", "lead-mail"]},
    ],
    "repeat": 2,
    "reack": 1800.0,
}


def _chain(
    alert: str = "a",
    episode: int = 1,
    rule: str = "r",
    *,
    next_at: float | None = 100.0,
    since: float | None = None,
    why: str | None = None,
    step: int = 0,
    log: list[dict[str, Any]] | None = None,
) -> Chain:
    """A chain as dispatch starts it: running (next_at), or waiting for a silence (since)."""
    started = [{"at": 10.0, "event": "started", "note": ""}]
    return Chain(
        alert, episode, rule, POLICY, step, 0, next_at, 10.0, since, why,
        started if log is None else log,
    )  # fmt: skip


def _start(*chains: Chain) -> Any:
    def work(tx: Tx) -> None:
        for chain in chains:
            tx.escalations.start(chain)

    return work


def _where(chains: list[Chain]) -> list[tuple[str, int, str, float | None]]:
    return [(c.alert, c.episode, c.rule, c.next_at) for c in chains]


# -- tx.escalations, on every store -----------------------------------------------------------


def test_a_chain_starts_once_per_alert_episode_and_rule(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_start(_chain(next_at=100.0)))
        again = _chain(next_at=999.0, step=1, log=[{"at": 50.0, "event": "started"}])
        await store.transact(_start(again, _chain(rule="q"), _chain(episode=2, next_at=200.0)))
        return await store.transact(
            lambda tx: (tx.escalations.of("a", 1), tx.escalations.of("a", 2))
        )

    first, second = run(tx_url, go)
    assert first == [_chain(rule="q"), _chain(next_at=100.0)]  # by rule; the first start stands
    assert second == [_chain(episode=2, next_at=200.0)]


def test_a_suppressed_chain_starts_again_when_started_unsuppressed(tx_url: str) -> None:
    """Only a chain waiting for a silence to end starts again, from its first step; one
    running, one that stopped and a suppressed start change nothing."""

    async def go(store: Store) -> Any:
        waiting = _chain(next_at=None, since=50.0, why="silenced", step=2)
        stopped = _chain(rule="stopped", next_at=None, step=2)
        running = _chain(rule="running", next_at=100.0, step=1)
        await store.transact(_start(waiting, stopped, running))
        await store.transact(
            _start(
                _chain(next_at=None, since=60.0, why="muted"),  # still suppressed: no change
                _chain(rule="running", next_at=None, since=60.0, why="muted"),
            )
        )
        unchanged = await store.transact(lambda tx: tx.escalations.of("a", 1))
        await store.transact(
            _start(
                _chain(next_at=500.0, log=[{"at": 70.0, "event": "started"}]),
                _chain(rule="stopped", next_at=500.0),
                _chain(rule="running", next_at=500.0),
            )
        )

        def after(tx: Tx) -> Any:
            return (
                tx.escalations.of("a", 1),
                tx.escalations.due(500.0),
                tx.escalations.suppressed(None),
            )

        return unchanged, *await store.transact(after)

    unchanged, chains, due, waiting = run(tx_url, go)
    assert [(c.rule, c.step, c.next_at, c.suppressed_since) for c in unchanged] == [
        ("r", 2, None, 50.0),
        ("running", 1, 100.0, None),
        ("stopped", 2, None, None),
    ]
    restarted, running, stopped = chains
    assert (restarted.step, restarted.next_at) == (0, 500.0)
    # It keeps what it was (its log; since when it was silenced, for its first page's text).
    assert restarted.log == _chain().log
    assert (restarted.suppressed_since, restarted.suppressed_why) == (50.0, "silenced")
    assert (running.step, running.next_at) == (1, 100.0)
    assert (stopped.step, stopped.next_at) == (2, None)
    assert [c.rule for c in due] == ["running", "r"] and waiting == []


def test_due_lists_the_chains_due_by_now_earliest_first_up_to_limit(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(
            _start(
                _chain("a", next_at=300.0),
                _chain("b", next_at=100.0),
                _chain("c", next_at=200.0),
                _chain("d", next_at=500.0),
                _chain("e", next_at=None),
                _chain("f", next_at=None, since=50.0, why="silenced"),
            )
        )

        def look(tx: Tx) -> Any:
            return (
                [c.alert for c in tx.escalations.due(250.0)],
                [c.alert for c in tx.escalations.due(300.0, limit=2)],
                [c.alert for c in tx.escalations.due(300.0, limit=2)],  # a read: still due
                [c.alert for c in tx.escalations.due(10_000.0)],
            )

        before = await store.transact(look)

        def moved(tx: Tx) -> Any:
            b, c = tx.escalations.due(200.0)
            b.next_at, c.next_at = 900.0, None
            tx.escalations.save(b)
            tx.escalations.save(c)
            c.next_at = 150.0  # then earlier again: the store has what was saved last
            tx.escalations.save(c)
            c.next_at = 950.0
            tx.escalations.save(c)
            return _where(tx.escalations.due(10_000.0)), tx.escalations.due(299.0)

        return before, *await store.transact(moved)

    (by_250, limited, again, every), after, early = run(tx_url, go)
    assert by_250 == ["b", "c"] and limited == again == ["b", "c"]
    assert every == ["b", "c", "a", "d"]
    assert after == [
        ("a", 1, "r", 300.0),
        ("d", 1, "r", 500.0),
        ("b", 1, "r", 900.0),
        ("c", 1, "r", 950.0),
    ]
    assert early == []


def test_next_due_is_the_earliest_step(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        empty = await store.transact(lambda tx: tx.escalations.next_due())
        await store.transact(
            _start(
                _chain("a", next_at=300.0),
                _chain("b", next_at=200.0),
                _chain("c", next_at=None, since=5.0, why="silenced"),
            )
        )
        first = await store.transact(lambda tx: tx.escalations.next_due())

        def later(tx: Tx) -> Any:
            [b] = tx.escalations.of("b", 1)
            b.next_at = 700.0
            tx.escalations.save(b)
            moved = tx.escalations.next_due()
            for chain in tx.escalations.due(1000.0):
                chain.next_at = None
                tx.escalations.save(chain)
            return moved, tx.escalations.next_due()

        return empty, first, *await store.transact(later)

    assert run(tx_url, go) == (None, 200.0, 300.0, None)


def test_save_keeps_every_field_the_start_and_the_newest_log_entries(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_start(_chain()))
        saved = _chain(next_at=777.5, since=640.25, why="muted", step=2)
        saved.round = 1
        saved.log = [
            {"at": 10.0, "event": "started", "note": ""},
            {"at": 100.0, "event": "paged", "step": 1, "round": 1, "to": ["team-chat", "ü"]},
            {"at": 640.25, "event": "skipped", "step": 2, "note": "silence #3: «deploy»"},
        ]
        await store.transact(lambda tx: tx.escalations.save(saved))
        kept = await store.transact(lambda tx: tx.escalations.of("a", 1))
        long = _chain(step=1, log=[{"at": float(i), "event": "paged", "n": i} for i in range(60)])
        await store.transact(lambda tx: tx.escalations.save(long))
        return saved, kept, await store.transact(lambda tx: tx.escalations.of("a", 1))

    saved, [kept], [long] = run(tx_url, go)
    assert kept == saved and kept.policy == POLICY
    assert len(long.log) == MAX_LOG
    # The oldest go but the first, the start, which names the event the pages belong to.
    assert [e["n"] for e in long.log] == [0, *range(61 - MAX_LOG, 60)]


def test_suppressed_chains_page_by_since_and_alert(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(
            _start(
                _chain("c", next_at=None, since=200.0, why="muted"),
                _chain("b", next_at=None, since=100.0, why="silenced"),
                _chain("z", next_at=None, since=50.0, why="silenced"),
                _chain("a", next_at=None, since=100.0, why="silenced"),
                _chain("resumed", next_at=400.0, since=10.0, why="silenced"),
                _chain("running", next_at=400.0),
                _chain("stopped", next_at=None),
            )
        )

        def pages(tx: Tx) -> list[list[tuple[str, float | None]]]:
            s = tx.escalations.suppressed
            return [
                [(c.alert, c.suppressed_since) for c in found]
                for found in (
                    s(None, 2),
                    s(waiting_key(s(None, 2)[-1]), 2),
                    s((100.0, "b", 1, "r")),
                    s((200.0, "c", 1, "r")),
                    s(None),
                )
            ]

        return await store.transact(pages)

    first, second, rest, done, every = run(tx_url, go)
    assert first == [("z", 50.0), ("a", 100.0)]
    assert second == [("b", 100.0), ("c", 200.0)]
    assert rest == [("c", 200.0)] and done == []
    assert every == first + second


def test_a_page_boundary_between_two_rules_of_one_alert_loses_neither(tx_url: str) -> None:
    """Two rules' notifications of one alert silenced at the same moment: the cursor names
    the episode and rule too, so a page ending at the first still finds the second."""

    async def go(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            for rule in ("q", "r"):
                tx.notices.suppress("a", 1, rule, 100.0, "silenced")
            first = tx.notices.suppressed(None, 1)
            second = tx.notices.suppressed(waiting_key(first[-1]), 1)
            third = tx.notices.suppressed(waiting_key(second[-1]), 1)
            return [n.rule for n in first + second + third]

        return await store.transact(work)

    assert run(tx_url, go) == ["q", "r"]


def test_end_stops_the_episodes_chains_and_logs_it_once(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(
            _start(
                _chain("a", 1, "r", next_at=100.0),
                _chain("a", 1, "q", next_at=None, since=50.0, why="silenced"),
                _chain("a", 2, "r", next_at=300.0),
                _chain("b", 1, "r", next_at=200.0),
            )
        )
        await store.transact(lambda tx: tx.escalations.end("a", 1, 500.0, "the alert is resolved"))
        await store.transact(lambda tx: tx.escalations.end("a", 1, 600.0, "again"))

        def after(tx: Tx) -> Any:
            e = tx.escalations
            return e.of("a", 1), _where(e.due(10_000.0)), e.suppressed(None), e.next_due()

        return await store.transact(after)

    ended, due, waiting, next_due = run(tx_url, go)
    ending = {"at": 500.0, "event": "ended", "note": "the alert is resolved"}
    assert [(c.rule, c.next_at, c.suppressed_since, c.suppressed_why) for c in ended] == [
        ("q", None, None, None),
        ("r", None, None, None),
    ]
    assert [c.log for c in ended] == [_chain().log + [ending]] * 2
    assert due == [("b", 1, "r", 200.0), ("a", 2, "r", 300.0)]
    assert waiting == [] and next_due == 200.0


def test_paged_lists_each_target_sent_or_on_its_way(tx_url: str) -> None:
    """Everyone the rule's messages about the episode went to: its own notifications,
    repeats and escalation pages, not held, suppressed or other kinds of rows."""

    async def go(store: Store) -> Any:
        def rows(tx: Tx) -> Any:
            def add(kind: str, state: str, notifier: str, target: int = 0, **of: Any) -> None:
                where = {"alert": "a", "episode": 1, **of}
                rule = where.pop("rule", "r")
                tx.outbox.add(
                    "e1", note(rule, notifier, target), state=state, now=5.0, next_at=5.0,
                    kind=kind, **where,
                )  # fmt: skip

            add("event", "pending", "team-chat")
            add("repeat", "pending", "team-chat")  # the same target again: listed once
            add("escalation", "pending", "lead-mail", 1)
            add("escalation", "delivered", "pager", 2)
            add("escalation", "held", "held-pager")
            add("escalation", "silenced", "silenced-pager")
            add("escalation", "muted", "muted-pager")
            add("digest", "pending", "digest-chat")
            add("resolved", "pending", "resolved-chat")
            add("escalation", "pending", "other-rule", rule="q")
            add("escalation", "pending", "other-episode", episode=2)
            add("escalation", "pending", "other-alert", alert="b")
            return tx.escalations.paged("a", 1, "r"), tx.escalations.paged("a", 3, "r")

        return await store.transact(rows)

    paged, none = run(tx_url, go)
    assert paged == [("lead-mail", 1), ("pager", 2), ("team-chat", 0)]
    assert none == []


def test_notices_suppressed_then_notified(tx_url: str) -> None:
    """A suppressed notice waits (it is not due); the rule's notification, once sent, clears
    it and its repeats start; a suppression after that changes nothing."""

    async def go(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            n = tx.notices
            n.suppress("a", 1, "r", 100.0, "silenced")
            n.suppress("a", 1, "r", 150.0, "muted")  # the first note stands
            waiting = n.of("a", 1), n.due(10_000.0)
            n.add("a", 1, "r", 200.0, 60.0)
            n.add("a", 1, "q", 200.0, None)
            n.suppress("a", 1, "r", 300.0, "silenced")
            n.suppress("a", 1, "q", 300.0, "muted")
            notified = sorted(n.of("a", 1), key=lambda x: x.rule)
            return waiting, notified, n.due(259.0), n.due(260.0), n.suppressed(None)

        return await store.transact(work)

    (waiting, due), notified, early, on_time, still = run(tx_url, go)
    assert waiting == [Notice("a", 1, "r", 100.0, None, 0, 100.0, "silenced")] and due == []
    assert notified == [
        Notice("a", 1, "q", 200.0, None, 0, None, None),
        Notice("a", 1, "r", 200.0, 260.0, 0, None, None),
    ]
    assert early == [] and [x.rule for x in on_time] == ["r"] and still == []


def test_suppressed_notices_page_and_wake(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            n = tx.notices
            n.suppress("a", 1, "r", 100.0, "silenced")
            n.suppress("b", 1, "r", 100.0, "muted")
            n.suppress("c", 1, "r", 50.0, "silenced")
            n.suppress("d", 1, "r", 200.0, "silenced")
            n.add("e", 1, "r", 10.0, None)
            pages = [
                [(x.alert, x.suppressed_since, x.suppressed_why) for x in found]
                for found in (n.suppressed(None, 2), n.suppressed((100.0, "a", 1, "r"), 2))
            ]
            c, a = n.suppressed(None, 2)
            n.woke(a, 300.0, 60.0)
            n.woke(c, 300.0, None)  # resolved meanwhile: no longer waiting, nothing repeats
            woken = n.of("a", 1) + n.of("c", 1)
            return pages, woken, n.due(359.0), n.due(360.0), n.suppressed(None)

        return await store.transact(work)

    pages, woken, early, on_time, left = run(tx_url, go)
    assert pages == [
        [("c", 50.0, "silenced"), ("a", 100.0, "silenced")],
        [("b", 100.0, "muted"), ("d", 200.0, "silenced")],
    ]
    assert woken == [
        Notice("a", 1, "r", 300.0, 360.0, 0, None, None),
        Notice("c", 1, "r", 300.0, None, 0, None, None),
    ]
    assert early == [] and [x.alert for x in on_time] == ["a"]
    assert [x.alert for x in left] == ["b", "d"]


# -- SQL stores only: acknowledgements (the in-memory store has none) -------------------------


def _open(tx: Tx) -> None:
    tx.alerts.save(Alert("a", "open", 2, "2026-01-01T00:00:01Z", "t1", "evt_1"), 10.0)
    tx.alerts.save(Alert("b", "open", 1, "2026-01-01T00:00:02Z", "t2", "evt_2"), 10.0)
    tx.alerts.save(Alert("c", "resolved", 1, "2026-01-01T00:00:03Z"), 10.0)


# The open episode's chains, each in another state, and other episodes' and alerts'.
CHAINS = (
    _chain("a", 2, "running", next_at=900.0),
    _chain("a", 2, "waiting", next_at=None, since=50.0, why="silenced"),
    _chain("a", 2, "resumed", next_at=800.0, since=50.0, why="silenced"),
    _chain("a", 2, "ran-out", next_at=None, step=2),
    _chain("a", 1, "r", next_at=None),
    _chain("b", 1, "r", next_at=900.0),
    _chain("c", 1, "r", next_at=None),
)


def _next_at(chains: list[Chain]) -> dict[str, float | None]:
    return {f"{c.alert}/{c.episode}/{c.rule}": c.next_at for c in chains}


async def _all_chains(store: Store) -> dict[str, float | None]:
    return _next_at([c for alert in "abc" for c in await store.alerts.chains(alert)])


def test_acked_and_unack_remove_the_acknowledgement_and_record_it(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_open)
        before = await store.transact(lambda tx: tx.escalations.acked("a", 2))
        await store.alerts.ack("a", by="ops", now=20.0)
        await store.alerts.ack("b", by="ops", now=20.0)
        acked = await store.transact(lambda tx: tx.escalations.acked("a", 2))
        other = await store.transact(lambda tx: tx.escalations.acked("a", 1))
        await store.transact(lambda tx: tx.escalations.unack("a", 2, 1820.0, "reack 30m"))
        after = await store.transact(lambda tx: tx.escalations.acked("a", 2))
        again = await store.alerts.ack("a", by="lead", now=1900.0)  # a new ack counts again
        return (
            before, acked, other, after, again, await store.alerts.acks(["a", "b"]),
            await store.alerts.actions(["a", "b"]),
        )  # fmt: skip

    before, acked, other, after, again, acks, actions = run(store_url, go)
    assert before is None and acked == ("ops", 20.0) and other is None and after is None
    assert again is not None and (again.acked_by, again.acked_at) == ("lead", 1900.0)
    assert {k: (v.acked_by, v.acked_at) for k, v in acks.items()} == {
        ("a", 2): ("lead", 1900.0),
        ("b", 1): ("ops", 20.0),  # another alert's ack stays
    }
    assert actions == [Action("a", 2, "unack", "escalation", "reack 30m", 1820.0, "done", None)]


def test_a_page_that_died_is_not_paged(store_url: str) -> None:
    async def go(store: Store) -> Any:
        def rows(tx: Tx) -> None:
            for notifier in ("team-chat", "lead-mail"):
                tx.outbox.add(
                    "e1", note("r", notifier), state="pending", now=5.0, kind="escalation",
                    alert="a", episode=1,
                )  # fmt: skip

        await store.transact(rows)
        for row in await store.outbox.claim_due(now=5.0, limit=5, lease=30):
            if row.notifier == "team-chat":
                await store.outbox.mark_delivered(row.id, now=6.0)
            else:
                await store.outbox.mark_failed(row.id, error="gone", now=6.0, retry_at=None)
        return await store.transact(lambda tx: tx.escalations.paged("a", 1, "r"))

    assert run(store_url, go) == [("team-chat", 0)]


def test_an_ack_makes_the_episodes_chains_look_at_once(store_url: str) -> None:
    """Every chain of the open episode that does not wait for a silence to end looks at once
    (it sees the ack and stops, or waits for reack); the others are left as they are."""

    async def go(store: Store) -> Any:
        await store.transact(_open)
        await store.transact(_start(*CHAINS))
        await store.alerts.ack("a", by="ops", now=20.0)
        await store.alerts.ack("c", by="ops", now=20.0)  # resolved: nothing changes
        due = await store.transact(lambda tx: _where(tx.escalations.due(20.0)))
        return await _all_chains(store), due

    chains, due = run(store_url, go)
    assert chains == {
        "a/2/ran-out": 20.0,  # with reack, its last step pages again when the ack is that old
        "a/2/resumed": 20.0,
        "a/2/running": 20.0,
        "a/2/waiting": None,
        "a/1/r": None,
        "b/1/r": 900.0,
        "c/1/r": None,
    }
    assert sorted(due) == [("a", 2, rule, 20.0) for rule in ("ran-out", "resumed", "running")]


def test_a_snooze_puts_the_episodes_chains_off_until_it_ends(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_open)
        await store.transact(_start(*CHAINS, _chain("a", 2, "later", next_at=9000.0)))
        await store.alerts.snooze("a", until=5000.0)
        await store.alerts.snooze("c", until=5000.0)
        due = await store.transact(lambda tx: _where(tx.escalations.due(4999.0)))
        return await _all_chains(store), due

    chains, due = run(store_url, go)
    assert chains == {
        "a/2/ran-out": 5000.0,
        "a/2/resumed": 5000.0,  # its first step must not page during the snooze
        "a/2/running": 5000.0,
        "a/2/later": 9000.0,  # a step due after the snooze's end stays when it was
        "a/2/waiting": None,
        "a/1/r": None,
        "b/1/r": 900.0,
        "c/1/r": None,
    }
    assert due == [("b", 1, "r", 900.0)]


def test_an_alerts_chains_are_listed_newest_episode_first(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(
            _start(
                _chain("a", 1, "r"),
                _chain("a", 3, "r"),
                _chain("a", 2, "r"),
                _chain("a", 2, "q", next_at=None, since=5.0, why="muted"),
                _chain("b", 5, "r"),
            )
        )
        return await store.alerts.chains("a"), await store.alerts.chains("x")

    chains, none = run(store_url, go)
    assert [(c.episode, c.rule) for c in chains] == [(3, "r"), (2, "q"), (2, "r"), (1, "r")]
    assert chains[1] == _chain("a", 2, "q", next_at=None, since=5.0, why="muted")
    assert none == []


# -- upgrades: a database from before escalations ---------------------------------------------


def _old_schema(conn: Any, migrations: list[Any], mark: str) -> None:
    """conn's database at the schema before escalations (the migrations before the one that
    makes the table), with an open alert, its notice and its ack."""
    schema_before(conn, migrations, mark, "CREATE TABLE escalations")
    conn.execute(
        "INSERT INTO alerts (id, state, episode, opened_ts, opened_event, last_ts, updated_at)"
        " VALUES ('a', 'open', 1, 't1', 'evt_1', '2026-01-01T00:00:01Z', 10)"
    )
    conn.execute(
        "INSERT INTO notices (alert, episode, rule, notified_at, next_repeat_at)"
        " VALUES ('a', 1, 'r', 10, 70)"
    )


def _check_upgraded(url: str) -> None:
    async def after(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            kept = tx.notices.of("a", 1)
            tx.notices.suppress("a", 1, "q", 20.0, "silenced")
            tx.escalations.start(_chain("a", 1, "r", next_at=500.0))
            return kept, tx.notices.suppressed(None), tx.escalations.next_due()

        found = await store.transact(work)
        await store.alerts.ack("a", by="ops", now=30.0)
        return (*found, await store.alerts.chains("a"))

    kept, waiting, next_due, chains = run(url, after)
    assert kept == [Notice("a", 1, "r", 10.0, 70.0, 0, None, None)]
    assert [(n.rule, n.suppressed_since, n.suppressed_why) for n in waiting] == [
        ("q", 20.0, "silenced")
    ]
    assert next_due == 500.0 and _where(chains) == [("a", 1, "r", 30.0)]


def test_a_sqlite_database_from_before_escalations_is_upgraded(tmp_path: Path) -> None:
    from receiver.store.sqlite.schema import MIGRATIONS

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        _old_schema(conn, MIGRATIONS, "?")
    _check_upgraded(str(db))
    versions = sqlite3.connect(db).execute("SELECT max(version) FROM schema_version").fetchone()
    assert versions == (len(MIGRATIONS),)


def test_a_postgres_database_from_before_escalations_is_upgraded(pg_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from receiver.store.postgres.schema import MIGRATIONS

    with psycopg.connect(pg_url) as conn, conn.transaction():
        _old_schema(conn, MIGRATIONS, "%s")
    _check_upgraded(pg_url)
    with psycopg.connect(pg_url) as conn:
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    assert version == (len(MIGRATIONS),)
