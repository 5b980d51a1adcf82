"""One channel interface: a channel the worker has never heard of (a small ntfy-like fake)
is claimed in its own lane, retried on its own schedule, logged and counted, with every
attempt in the row's log; the worker is not changed for it."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from receiver import events
from receiver.metrics import Metrics
from receiver.notify.backoff import Backoff, Delays
from receiver.notify.channel import Result
from receiver.notify.worker import Worker
from receiver.rules import Ruleset
from receiver.store import Notification, OutboxRow, Store, open_store
from tests.samples import sample


class Ntfy:
    """Fails twice (503, then a timeout), then delivers; remembers when each send began."""

    name = "ntfy"
    schedule = Delays((0.3, 0.6))

    def __init__(self) -> None:
        self.sends: list[float] = []

    async def lanes(self) -> list[tuple[str, int]]:
        return [("@ntfy", 0)]

    def describe(self, row: OutboxRow) -> str:
        return f"ntfy message for event {row.event_id}"

    async def send(self, row: OutboxRow) -> Result:
        self.sends.append(time.monotonic())
        if len(self.sends) == 1:
            return Result.retry("HTTP 503 Service Unavailable", status=503, excerpt="busy")
        if len(self.sends) == 2:
            return Result.retry("no answer within 1s")
        return Result.delivered(status=200, excerpt='{"id":"m1"}')


async def _queue(store: Store) -> int:
    event = events.validate(sample(id="evt_n1"))
    await store.events.accept(event, event.model_dump_json().encode())

    def work(tx: Any) -> int:
        tx.events.mark_routed(["evt_n1"], time.time())
        note = Notification("r", "@ntfy", 0, "Attention dropped", "body", channel="ntfy")
        return int(tx.outbox.add("evt_n1", note, state="pending", now=time.time()))

    return int(await store.transact(work))


def test_a_new_channel_is_retried_on_its_own_schedule_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics, channel = Metrics(), Ntfy()

    async def main() -> tuple[Any, Any]:
        store = open_store(str(tmp_path / "r.db"))
        await store.open()
        worker = Worker(
            store,
            None,  # type: ignore[arg-type]  # no apprise target is used
            lambda: Ruleset(rules=[], notifiers={}, digest=""),
            metrics=metrics,
            backoff=Backoff(initial=3600),  # the apprise schedule: far too slow to pass
            channels=[channel],
        )
        running = asyncio.create_task(worker.run())
        try:
            row_id = await _queue(store)
            worker.wake()
            deadline = time.monotonic() + 20
            while (
                len(channel.sends) < 3 or (await store.outbox.deliveries())[0].state != "delivered"
            ):
                assert time.monotonic() < deadline, channel.sends
                await asyncio.sleep(0.05)
            return (await store.outbox.deliveries())[0], (await store.outbox.attempts([row_id]))[
                row_id
            ]
        finally:
            await worker.stop(1.0)
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            await store.close()

    with caplog.at_level(logging.INFO, logger="receiver.notify"):
        row, log = asyncio.run(main())
    assert (row.state, row.last_status, row.last_error) == ("delivered", 200, None)
    assert [(a.number, a.status, a.error, a.excerpt) for a in log] == [
        (1, 503, "HTTP 503 Service Unavailable", "busy"),
        (2, None, "no answer within 1s", None),
        (3, 200, None, '{"id":"m1"}'),
    ]
    assert all(a.duration_ms >= 0 for a in log)
    first, second, third = channel.sends
    assert second - first >= 0.3 * 0.9 and third - second >= 0.6 * 0.9  # its own delays
    messages = [r.getMessage() for r in caplog.records if r.name == "receiver.notify"]
    assert any("sending ntfy message for event evt_n1 failed (attempt 1)" in m for m in messages)
    assert "delivered ntfy message for event evt_n1" in messages
    assert metrics.notifications["retried"]._value.get() == 2
    assert metrics.notifications["delivered"]._value.get() == 1

    # receiver deliveries --attempts prints the same log, for any channel's rows.
    from click.testing import CliRunner

    from receiver.cli.outbox import deliveries

    shown = CliRunner().invoke(deliveries, ["--db", str(tmp_path / "r.db"), "--attempts"])
    assert shown.exit_code == 0, shown.output
    assert f"{row.id} @ntfy[0]: 3 attempt(s) logged" in shown.output
    lines = [line for line in shown.output.splitlines() if line.startswith("  #")]
    assert [line.split()[0] for line in lines] == ["#1", "#2", "#3"]
    assert "HTTP 503" in lines[0] and "no answer within 1s" in lines[1] and "ok" in lines[2]
