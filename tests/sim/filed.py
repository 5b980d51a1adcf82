"""Invariants about which event a notification is filed under and judged by: a chain's
pages belong to the event that started the chain (explain of that event lists them), and
nothing goes out while a silence holds the event it is filed under.

Both read only rows added since the last step (run.marks), so a step costs what it added.
"""

from __future__ import annotations

import json
from typing import Any

from receiver.dispatch.silences import active_silences, silencing
from receiver.store.records import SENT_STATES, Silence
from tests.sim.run import Run
from tests.sim.violation import Violation

SENT = (*SENT_STATES, "dead")
# The note routing gives the first pages it keeps for an event that started no chain
# (receiver.dispatch.pipeline: "<why>; escalation P waits" / "... not started").
UNPAGED_NOTE = "; escalation "


def _new_rows(run: Run, mark: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of the query (its first column the outbox id, `?` the last id seen) added
    since the last look under this mark."""
    last = run.marks.get(mark, 0)
    rows = run.query(sql, (last,))
    if rows:
        run.marks[mark] = max(last, max(int(r[0]) for r in rows))
    return rows


def starter_at(log: list[dict[str, Any]], at: float) -> str | None:
    """The event that started the chain as it was at `at`: its log's last "started" entry
    by then (a later event that is not suppressed starts a waiting chain again)."""
    found = [e for e in log if e.get("event") == "started" and float(e["at"]) <= at]
    return None if not found else found[-1].get("eventId")


def pages_filed_under_their_starter(run: Run) -> None:
    """A chain's pages are filed under the event that started the chain (that round).

    (Its log's last "started" entry before the page names that event: explain of it lists
    the pages; a later event of the episode started nothing, and its explanation says
    deduplicated, unless it started a waiting chain again.)"""
    rows = _new_rows(
        run,
        "pages",
        "SELECT o.id, o.event_id, o.alert, o.episode, o.rule, o.reason, e.log, o.created_at"
        " FROM outbox o JOIN escalations e ON e.alert = o.alert AND e.episode = o.episode"
        " AND e.rule = o.rule"
        " WHERE o.kind = 'escalation' AND o.id > ? AND o.created_at >= e.started_at",
    )
    for rid, eid, aid, ep, rule, reason, log, created in rows:
        if reason and UNPAGED_NOTE in reason:
            continue  # the first pages an event kept for itself (stale, or before a chain)
        starter = starter_at(json.loads(log) or [], float(created))
        if starter is not None and starter != eid:
            raise Violation(
                "pages are filed under their chain's starter",
                f"row #{rid}: a page of {aid}/{ep} rule {rule} is filed under {eid};"
                f" {starter} started the chain",
            )


def _silences(run: Run) -> list[Silence]:
    return [
        Silence(int(i), json.loads(m), r, a, b, e, created_at=c)
        for i, m, r, a, b, e, c in run.query(
            "SELECT id, matchers, reason, starts_at, ends_at, expired_at, created_at FROM silences"
        )
    ]


def nothing_sent_while_silenced(run: Run) -> None:
    """Nothing is paged, repeated or woken while a silence holds the event it is filed under.

    (A row sent, created while a silence made before it matched that event's payload: the
    silence should have held it. Resolved messages answer what was sent, and are free.)"""
    rows = _new_rows(
        run,
        "silenced",
        "SELECT id, event_id, rule, kind, state, created_at FROM outbox WHERE id > ?"
        " AND kind IN ('event', 'escalation', 'repeat') AND alert IS NOT NULL",
    )
    if not rows:
        return
    silences = _silences(run)
    if not silences:
        return
    for rid, eid, rule, kind, state, created in rows:
        body = run.seen.bodies.get(eid)
        if state not in SENT or body is None:
            continue
        found = _holding(silences, body, created)
        if found is not None:
            raise Violation(
                "nothing is sent while silenced",
                f"row #{rid} ({kind}, {rule}, {state}) of {eid} was queued at"
                f" {created - run.scenario.start:.1f} while silence #{found.id}"
                f" ({found.matchers}) held {eid}",
            )


def _holding(silences: list[Silence], body: dict[str, Any], at: float) -> Silence | None:
    """The silence made before `at` and in force at `at` that holds body, if any."""
    held = [
        s
        for s in silences
        if s.created_at < at < s.ends_at
        and s.starts_at <= at
        and (s.expired_at is None or s.expired_at > at)
    ]
    return silencing(active_silences(held), body) if held else None


def chains_resume_when_free(run: Run) -> None:
    """A suppressed chain starts again only when no silence holds the event that started it.

    (Checked at the end, from each chain's log: its "resumed" entries.)"""
    silences = _silences(run)
    if not silences:
        return
    for aid, ep, rule, log in run.query("SELECT alert, episode, rule, log FROM escalations"):
        entries = json.loads(log) or [{}]
        for entry in entries:
            if entry.get("event") != "resumed":
                continue
            starter = starter_at(entries, float(entry["at"]))
            body = run.seen.bodies.get(str(starter))
            if body is None:
                continue
            found = _holding(silences, body, float(entry["at"]))
            if found is not None:
                raise Violation(
                    "wake exactly what was held",
                    f"the chain of {aid}/{ep} rule {rule} started again at"
                    f" {float(entry['at']) - run.scenario.start:.1f} while silence"
                    f" #{found.id} ({found.matchers}) still held {starter},"
                    " which started it",
                    "woken while still held",
                )


CHECKS = (pages_filed_under_their_starter, nothing_sent_while_silenced)
FINAL = (chains_resume_when_free,)
