"""Failed sends in the runner's notify worker (tests.sim.run): in a scenario with
`fails` > 0, a send fails that share of the time, decided for each (row, attempt) from the
seed: mostly a failure the row is retried after (receiver.notify.backoff.Backoff without
its jitter, from 10 s, giving up an hour after the row was made), else a give-up (a refusal no retry
helps: dead at once). Each failure joins the row's attempt log (store.outbox.mark_failed),
as the worker's would. An operator's retry of what went dead (`receiver deliveries retry`,
the admin page's button: store.outbox.retry_dead) is the "redeliver" operation.

What the invariants read of it (run.seen): when each row failed, went dead and was
retried by an operator: "once" allows a send again after a recorded failure, and
"resolved reaches who was paged" counts a page that was dead when its alert resolved as
never having reached its target.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from receiver.notify.backoff import Backoff
from receiver.store.records import Attempt, OutboxRow

if TYPE_CHECKING:
    from tests.sim.run import Run

# Its first retry comes sooner than the runner's lease: "once" must tell a retry from a resend.
RETRY = Backoff(initial=10.0, maximum=600.0, give_up=3600.0, jitter=0.0)
GIVE_UP = 0.2  # the share of failures that are give-ups


def outcome(run: Run, row: OutboxRow) -> str:
    """delivered, retry or give_up: what this attempt at row comes to."""
    fails = run.scenario.fails
    if not fails:
        return "delivered"
    # Keyed by what the row is, not its id: a PostgreSQL sequence does not roll back with a
    # transaction a crash undid, so ids differ between stores; what is sent must not.
    what = (
        f"{row.event_id}:{row.rule}:{row.kind}:{row.notifier}:{row.target}"
        f":{float(row.created_at):.3f}:{row.attempts}"
    )
    roll = random.Random(f"send:{run.scenario.seed}:{what}").random()
    if roll >= fails:
        return "delivered"
    return "give_up" if roll < fails * GIVE_UP else "retry"


async def fail(run: Run, row: OutboxRow, how: str) -> str:
    """Record the failed attempt (retried at the schedule's time, or dead); what became
    of the row, for the trace."""
    assert run.store is not None
    retry_at = RETRY.retry_at(row, run.now) if how == "retry" else None
    status = 503 if how == "retry" else 400
    await run.store.outbox.mark_failed(
        row.id, error=f"sim: HTTP {status}", now=run.now, retry_at=retry_at,
        attempt=Attempt(run.now, 0, status, f"sim: HTTP {status}"),
    )  # fmt: skip
    run.seen.failed.setdefault(row.id, []).append(run.now)
    if retry_at is None:
        run.seen.died.setdefault(row.id, []).append(run.seen.tick())
        return "dead"
    return f"retry at {retry_at - run.scenario.start:.3f}"


async def redeliver(run: Run) -> int:
    """An operator retries every dead row (`receiver deliveries retry`)."""
    assert run.store is not None
    dead = [int(rid) for (rid,) in run.query("SELECT id FROM outbox WHERE state = 'dead'")]
    n = await run.store.outbox.retry_dead(None, now=run.now)
    moment = run.seen.tick()
    for rid in dead:
        run.seen.revived.setdefault(rid, []).append(moment)
    return int(n)


def dead_at(run: Run, row: int, moment: int) -> bool:
    """Whether row was dead at a moment (run.seen.tick()): it went dead before, and no
    operator's retry revived it since."""
    died = [t for t in run.seen.died.get(row, []) if t < moment]
    if not died:
        return False
    return not any(died[-1] < t < moment for t in run.seen.revived.get(row, []))
