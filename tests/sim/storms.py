"""Wake exactly what was held, for a storm window (receiver.dispatch.storm): what a window
held back is not sent one by one when it ends; it is told once, in the window's storm
message (one a target, a digest group of key STORM_KEY), sent when the window ends and
counting each held notification once. An alert it held that resolved meanwhile gets
nothing more (no resolved message: nothing of it was sent; "resolved reaches who was
paged" checks that).
"""

from __future__ import annotations

from collections import defaultdict

from receiver.dispatch.storm import STORM_KEY
from receiver.store.records import SENT_STATES
from tests.sim.run import Run
from tests.sim.violation import Violation

SENT = (*SENT_STATES, "dead")
NAME = "wake exactly what was held"


def _fail(detail: str, kind: str) -> None:
    raise Violation(NAME, detail, f"storm: {kind}")


def storm_windows_told_once(run: Run, final: bool = False) -> None:
    """What a storm window held back is told once, in its storm message, when it ends.

    (One message a target, not sent before the window ends, sent once it has, counting
    each notification the window held back once; every row held back is in a window.)"""
    groups = {
        int(gid): (rule, float(closes), int(count))
        for gid, rule, closes, count in run.query(
            "SELECT id, rule, closes_at, count FROM groups WHERE key = ?", (STORM_KEY,)
        )
    }
    held: dict[int, set[str]] = defaultdict(set)
    for eid, gid, rule in run.query(
        "SELECT event_id, group_id, rule FROM outbox WHERE state = 'storm'"
    ):
        if gid is None or int(gid) not in groups:
            _fail(f"{eid} ({rule}) was held back by a storm in no window: {gid}", "no window")
        held[int(gid)].add(eid)
    messages: dict[int, list[tuple[int, str, int, str, str]]] = defaultdict(list)
    for rid, gid, notifier, target, state, title in run.query(
        "SELECT id, group_id, notifier, target, state, title FROM outbox WHERE kind = 'storm'"
    ):
        messages[int(gid)].append((int(rid), notifier, int(target), state, title))
    sent_at = dict(reversed(run.seen.sends))  # row -> its first send
    for gid, (rule, closes, count) in groups.items():
        if len(held[gid]) != count:
            _fail(
                f"storm window #{gid} of {rule} counts {count} held back; rows show"
                f" {len(held[gid])}: {sorted(held[gid])[:5]}",
                "miscounted",
            )
        rows = messages[gid]
        targets = [(n, t) for _, n, t, _, _ in rows]
        if len(set(targets)) != len(targets):
            _fail(f"storm window #{gid} of {rule} has two messages to one target", "twice")
        for rid, notifier, target, state, title in rows:
            at = sent_at.get(rid)
            if at is not None and at < closes:
                _fail(
                    f"storm message #{rid} of {rule} sent at {at - run.scenario.start:.1f},"
                    f" before its window ends at {closes - run.scenario.start:.1f}",
                    "told early",
                )
            if f"storm: {count} more" not in title:
                _fail(f"storm message #{rid} says {title!r}; the window held {count}", "text")
            if final and closes < run.now and state not in SENT:
                _fail(
                    f"storm message #{rid} of {rule} to {notifier}[{target}] is {state}"
                    f" after its window ended at {closes - run.scenario.start:.1f}",
                    "never told",
                )
