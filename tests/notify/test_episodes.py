"""receiver.notify.episodes: which alert episode an outbox row belongs to, and how it
stands now (open or resolved, acked, snoozed), with its action links; read from a real
store through its public methods."""

from __future__ import annotations

import re
from pathlib import Path

from receiver.dispatch.actions import perform
from receiver.links import Links
from receiver.notify.episodes import KEY_LENGTH, Episode, episode_of, key_of
from receiver.store import OutboxRow, Store
from receiver.store.base import Tx
from receiver.store.records import Alert
from tests.store.contract.common import event, note, run

LINKS = Links("k" * 32, base="https://alerts.example.com", ttl=3600, clock=lambda: 1000.0)


def _row(row_id: int) -> OutboxRow:
    """The row as a channel gets it; only its id is read."""
    return OutboxRow(row_id, "evt_1", "r", "console", 0, "t", "b", "sending", 1, 0, 0, 0)


async def _opened(store: Store, episode: int = 1, state: str = "open") -> dict[str, int]:
    """Alert a:1 at episode, with a row of its episode 1 and rows of no alert."""
    await store.events.accept(*event(1))

    def work(tx: Tx) -> dict[str, int]:
        tx.alerts.save(Alert("a:1", state, episode, "2026-01-01T00:00:00Z"), 1.0)
        return {
            "page": tx.outbox.add(
                "evt_1", note(), state="pending", now=1.0, kind="escalation", alert="a:1",
                episode=1,
            ),
            "plain": tx.outbox.add("evt_1", note(), state="pending", now=1.0),
            "digest": tx.outbox.add("evt_1", note(), state="held", now=1.0, kind="digest"),
            "beat": tx.outbox.add("-", note(), state="pending", now=1.0, alert="(heartbeat)"),
        }  # fmt: skip

    return await store.transact(work)


def test_an_open_episode_with_its_links_and_nothing_done_yet(tmp_path: Path) -> None:
    async def go(store: Store) -> Episode | None:
        rows = await _opened(store)
        return await episode_of(store, _row(rows["page"]), LINKS)

    found = run(str(tmp_path / "r.db"), go)
    assert found is not None
    assert (found.alert, found.episode, found.state, found.open) == ("a:1", 1, "open", True)
    assert (found.acked, found.acked_by, found.snoozed_until) == (False, None, None)
    assert dict(found.links) == dict(LINKS.for_alert("a:1", 1))
    assert LINKS.read(found.links["ack"].rsplit("/", 1)[1]).episode == 1
    assert found.key == key_of("a:1", 1)


def test_rows_of_no_alert_episode_have_none(tmp_path: Path) -> None:
    async def go(store: Store) -> list[Episode | None]:
        rows = await _opened(store)
        keys = ("plain", "digest", "beat")
        return [await episode_of(store, _row(rows[k]), LINKS) for k in keys]

    assert run(str(tmp_path / "r.db"), go) == [None, None, None]


def test_ack_and_snooze_show_as_they_stand_now(store_url: str) -> None:
    async def go(store: Store) -> tuple[Episode | None, Episode | None]:
        rows = await _opened(store)
        snooze = await perform(
            store, None, "a:1", "snooze", source="link", by="link", now=100.0, seconds=3600
        )
        assert snooze.result == "done"
        snoozed = await episode_of(store, _row(rows["page"]), None)
        ack = await perform(store, None, "a:1", "ack", source="api", by="alice", now=200.0)
        assert ack.result == "done"
        return snoozed, await episode_of(store, _row(rows["page"]), None)

    snoozed, acked = run(store_url, go)
    assert snoozed is not None and acked is not None
    assert (snoozed.snoozed_until, snoozed.acked, snoozed.links) == (3700.0, False, {})
    assert snoozed.snoozed(3699.0) and not snoozed.snoozed(3700.0)
    assert (acked.acked_by, acked.acked_at, acked.state) == ("alice", 200.0, "open")


def test_an_episode_is_resolved_when_it_closed_or_a_newer_one_opened(tmp_path: Path) -> None:
    async def go(store: Store, episode: int, state: str) -> tuple[str, int] | None:
        rows = await _opened(store, episode, state)
        found = await episode_of(store, _row(rows["page"]), LINKS)
        return None if found is None else (found.state, found.episode)

    at = str(tmp_path / "a.db")
    assert run(at, lambda s: go(s, 1, "resolved")) == ("resolved", 1)
    newer = str(tmp_path / "b.db")
    assert run(newer, lambda s: go(s, 2, "open")) == ("resolved", 1)


def test_the_key_is_stable_per_episode_and_safe_as_an_ntfy_sequence_id() -> None:
    alerts = ["session:sess_1", "intervention:x/y z", "é" * 300, ""]
    keys = {key_of(a, e) for a in alerts for e in (1, 2, 10**12)}
    assert len(keys) == len(alerts) * 3  # one per (alert, episode)
    assert all(re.fullmatch(r"[-_A-Za-z0-9]{1,64}", k) for k in keys)
    assert all(len(k) == KEY_LENGTH for k in keys)
    assert key_of("session:sess_1", 1) == Episode("session:sess_1", 1, "open").key
    assert "sess_1" not in key_of("session:sess_1", 1)
