"""The invariant of the "update" rows an ack or a snooze queues (receiver.dispatch.updates),
checked with the others (tests.sim.invariants)."""

from __future__ import annotations

from collections import Counter, defaultdict

from receiver.notify import registry
from tests.sim.run import Run
from tests.sim.violation import Violation

SENT = ("pending", "sending", "delivered", "dead")


def updates_once(run: Run) -> None:
    """An ack or a snooze updates each message it can once, and only those.

    (Each done ack or snooze queues at most one update row per target; only to a channel
    that updates in place, the Slack app's or ntfy's, and only to a target the episode's
    messages went to before it; nothing queues one but a done ack or snooze.)"""
    updating = registry.updating()
    acted: Counter[tuple[str, int, float]] = Counter()
    for aid, ep, at in run.query(
        "SELECT alert, episode, at FROM alert_actions"
        " WHERE action IN ('ack', 'snooze') AND outcome = 'done'"
    ):
        acted[(aid, int(ep), float(at))] += 1
    paged: dict[tuple[str, int], list[tuple[str, int, float]]] = defaultdict(list)
    for aid, ep, notifier, target, created in run.query(
        "SELECT alert, episode, notifier, target, created_at FROM outbox"
        " WHERE kind IN ('event', 'repeat', 'escalation') AND alert IS NOT NULL"
        f" AND state IN {SENT}"
    ):
        paged[(aid, int(ep))].append((notifier, int(target), float(created)))
    made: Counter[tuple[str, int, float, str, int]] = Counter()
    for rid, aid, ep, notifier, target, channel, created in run.query(
        "SELECT id, alert, episode, notifier, target, channel, created_at FROM outbox"
        " WHERE kind = 'update'"
    ):
        where = f"update row #{rid} ({aid}/{ep} to {notifier}[{target}], {channel})"
        if channel not in updating:
            raise Violation("updates once", f"{where}: its channel cannot update a message")
        moment = (aid, int(ep), float(created))
        if moment not in acted:
            raise Violation("updates once", f"{where}: no done ack or snooze queued it")
        if not any(
            (n, t) == (notifier, int(target)) and c <= float(created)
            for n, t, c in paged[(aid, int(ep))]
        ):
            raise Violation("updates once", f"{where}: the episode never paged that target")
        made[(*moment, notifier, int(target))] += 1
    for (aid, ep, at, notifier, target), count in made.items():
        if count > acted[(aid, ep, at)]:
            raise Violation(
                "updates once",
                f"{aid}/{ep} at {at}: {count} update rows to {notifier}[{target}]"
                f" for {acted[(aid, ep, at)]} action(s)",
            )
