"""The invariants, checked after every step of a run (tests.sim.run). Each is a function
whose docstring's first line is its statement (docs/testing.md quotes them); a broken one
raises Violation naming it.

They read what the run left: the SQLite file's rows (outbox, escalations, alerts,
events), the transitions routing applied and the sends the runner made (run.seen), and
for "explain is true" the explanation the API gives (receiver.why.explain_event, the code
behind GET /v1/events/:id/explain).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from receiver import why
from receiver.dispatch.alerts import opener
from receiver.dispatch.inhibition import suppression
from receiver.dispatch.pipeline import UNPAGED
from receiver.dispatch.silences import active_silences
from receiver.rules import Rule, Ruleset
from receiver.store.records import SENT_STATES
from tests.sim import filed, sends, storms, subscribers, updates
from tests.sim.run import LEASE, Run
from tests.sim.violation import Violation

SENT = (*SENT_STATES, "dead")
# A chain started by a suppressed notification notes "<state>: waits": the decision it is.
WAITS = {
    "silenced": "silenced", "muted": "quiet", "inhibited": "inhibited",
    "maintenance": "maintenance",
}  # fmt: skip


def matched(ruleset: Ruleset, payload: dict[str, Any]) -> Iterator[Rule]:
    """The rules that decide about payload, in order (first match wins unless continue)."""
    for rule in ruleset.matching(payload):
        yield rule
        if not rule.continue_:
            return


def escalate_only(rule: Rule) -> bool:
    return rule.escalate is not None and not rule.notify


def _event_rows(run: Run) -> dict[tuple[str, str], list[tuple[int, str, str | None]]]:
    rows: dict[tuple[str, str], list[tuple[int, str, str | None]]] = defaultdict(list)
    for rid, eid, rule, state, reason in run.query(
        "SELECT id, event_id, rule, state, reason FROM outbox WHERE kind = 'event'"
    ):
        rows[(eid, rule)].append((rid, state, reason))
    return rows


def _chains(run: Run) -> dict[tuple[str, int, str], tuple[float, list[dict[str, Any]]]]:
    return {
        (a, int(ep), r): (float(started), json.loads(log))
        for a, ep, r, started, log in run.query(
            "SELECT alert, episode, rule, started_at, log FROM escalations"
        )
    }


def _kept(run: Run) -> set[tuple[str, str]]:
    """(event, rule) of the first pages a rule that only escalates kept, unsent, for an
    event that started no chain (receiver.dispatch.pipeline.UNPAGED: its row says why)."""
    states = ", ".join(f"'{s}'" for s in UNPAGED)
    return set(
        run.query(
            f"SELECT event_id, rule FROM outbox WHERE kind = 'escalation' AND state IN ({states})"
        )
    )


def _decided(run: Run) -> Iterator[tuple[str, tuple[str, str | None, int | None, str], Rule]]:
    """(event, its transition, rule) for every rule that decided about a routed event."""
    for eid in run.seen.order:
        seen = run.seen.transitions[eid]
        for rule in matched(run.seen.rulesets[seen[3]], run.seen.bodies[eid]):
            yield eid, seen, rule


def nothing_vanishes(run: Run) -> None:
    """Every event is routed, and every rule it matched recorded a row or its chain.

    (A rule that only escalates records the chain it started or joined, or the first pages
    it kept unsent with what stopped them: silenced, quiet, inhibited, storm, stale.)"""
    unrouted = [e for e in run.seen.bodies if e not in run.seen.transitions]
    if unrouted:
        raise Violation("nothing vanishes", f"accepted, never routed: {unrouted[:5]}")
    rows, chains, kept = _event_rows(run), _chains(run), _kept(run)
    for eid, (what, aid, ep, _), rule in _decided(run):
        if (eid, rule.name) in rows or (eid, rule.name) in kept:
            continue
        if escalate_only(rule):
            if what not in ("open", "update") or (aid, ep, rule.name) in chains:
                continue
            raise Violation(
                "nothing vanishes",
                f"event {eid} opened alert {aid} (episode {ep}); rule {rule.name} escalates"
                f" ({rule.escalate.name if rule.escalate else ''}) and recorded nothing:"
                " no row, no chain",
            )
        raise Violation("nothing vanishes", f"event {eid}: rule {rule.name} wrote no row")


def open_alerts_accounted(run: Run) -> None:
    """Every open alert's rules paged it, or recorded why not and what ends it.

    (held, silenced, quiet, inhibited, storm, throttled, digest, stale: a row's reason.)"""
    open_now = {
        (a, int(ep)) for a, ep in run.query("SELECT id, episode FROM alerts WHERE state = 'open'")
    }
    rows, chains, kept = _event_rows(run), _chains(run), _kept(run)
    for eid, (what, aid, ep, _), rule in _decided(run):
        if (aid, ep) not in open_now or what not in ("open", "update"):
            continue
        if (eid, rule.name) in kept:  # a chain's first pages, kept with what stopped them
            continue
        own = rows.get((eid, rule.name), [])
        if any(state in SENT or reason for _, state, reason in own):
            continue
        if rule.escalate is not None and (aid, ep, rule.name) in chains:
            continue
        raise Violation(
            "every open alert is accounted for",
            f"alert {aid} (episode {ep}) is open; rule {rule.name} matched its event {eid}"
            f" and neither paged nor recorded why: rows {own}",
        )


def _listed(found: Any) -> set[str]:
    """The ids of the notifications an explanation lists, wherever it lists them."""
    ids: set[str] = set()
    if isinstance(found, dict):
        if "notifier" in found and "id" in found:
            ids.add(str(found["id"]))
        for value in found.values():
            ids |= _listed(value)
    elif isinstance(found, list):
        for value in found:
            ids |= _listed(value)
    return ids


def _expected_escalation(run: Run, eid: str, rule: Rule, chains: Any) -> set[str] | None:
    """The decisions an escalate-only rule's explanation may give for event eid: what its
    chain shows (None: not an event that starts or joins a chain)."""
    what, aid, ep, _ = run.seen.transitions[eid]
    if what not in ("open", "update"):
        return None
    chain = chains.get((aid, ep, rule.name))
    unstarted = {"storm", "stale", "throttled", "held", "silenced", "quiet", "inhibited"}
    unstarted.add("flapping")  # flap detection keeps the pages of an alert that flaps
    unstarted.add("maintenance")  # a maintenance window holds them, as a silence does
    if chain is None:  # nothing started, nothing running: neither sent nor deduplicated
        return unstarted
    started_at, log = chain
    [(routed_at,)] = run.query("SELECT routed_at FROM events WHERE id = ?", (eid,))
    if routed_at < started_at:  # routed before a later event started it: what stopped it
        return unstarted
    routed = dict(run.query("SELECT id, routed_at FROM events WHERE routed_at = ?", (started_at,)))
    starter = next(
        (
            e
            for e in run.seen.order
            if e in routed
            and run.seen.transitions[e][1:3] == (aid, ep)
            and run.seen.transitions[e][0] in ("open", "update")
            and any(r.name == rule.name for r in matched(
                run.seen.rulesets[run.seen.transitions[e][3]], run.seen.bodies[e]))
        ),
        None,
    )  # fmt: skip
    if eid in {e.get("eventId") for e in log[1:] if e.get("event") == "started"}:
        return {"sent", "held"}  # it started the waiting chain again (dispatch.escalations)
    if starter != eid:
        return {"deduplicated"}
    note = str(log[0].get("note") or "") if log else ""
    waited = note.removesuffix(": waits")
    if waited in WAITS:
        return {WAITS[waited]}
    return {"sent", "held"}


async def explain_is_true(run: Run, event_ids: list[str]) -> None:
    """Explain's decision for every (event, rule) is what the rows and chains show.

    The explanation is the API's (GET /v1/events/:id/explain), and it lists every row the
    event made (its notifications, and the resolved messages of the alert it closed)."""
    assert run.store is not None
    chains = _chains(run)
    for eid in event_ids:
        found = await why.explain_event(run.store, eid, run.ruleset)
        if found is None:
            raise Violation("explain is true", f"event {eid} was routed and explain finds none")
        listed = _listed(found)
        what = run.seen.transitions[eid][0]
        for rid, rule, kind, state in run.query(
            "SELECT id, rule, kind, state FROM outbox WHERE event_id = ? ORDER BY id", (eid,)
        ):
            if kind == "event" or (kind == "resolved" and what == "resolve"):
                if str(rid) not in listed:
                    raise Violation(
                        "explain is true",
                        f"event {eid} made {kind} row #{rid} ({rule}, {state}) and its"
                        f" explanation does not show it: {_summary(found)}",
                        f"explain omits a {kind} row",
                    )
        ruleset = run.seen.rulesets[run.seen.transitions[eid][3]]
        for entry in found["rules"]:
            rule = ruleset.by_name.get(entry["rule"])
            if rule is None or not entry.get("matched") or not escalate_only(rule):
                continue
            if any(n.get("kind") == "event" for n in entry.get("notifications", [])):
                continue
            expected = _expected_escalation(run, eid, rule, chains)
            if expected is not None and entry.get("decision") not in expected:
                raise Violation(
                    "explain is true",
                    f"event {eid}: rule {rule.name} (escalate only) is explained"
                    f" {entry.get('decision')!r} ({entry.get('reason')}); its chain shows"
                    f" {' or '.join(sorted(expected))}",
                    f"explain says {entry.get('decision')} for {'/'.join(sorted(expected))}",
                )


def _summary(found: dict[str, Any]) -> str:
    return "; ".join(
        f"{r['rule']}: {r.get('decision', 'not matched')}" for r in found.get("rules", [])
    )


def once(run: Run) -> None:
    """A row is sent at most once a lease; a step pages at most once an episode and round.

    (Never again after its delivery was recorded; again within a lease only after a
    failure was recorded; an ack, reack, a snooze's or a silence's end lets a step page again.)"""
    by_row: dict[int, list[float]] = defaultdict(list)
    for rid, at in run.seen.sends:
        by_row[rid].append(at)
    for rid, times in by_row.items():
        marked = run.seen.delivered.get(rid)
        failed = run.seen.failed.get(rid, [])
        for before, after in zip(times, times[1:], strict=False):
            if after - before < LEASE and not any(before <= t <= after for t in failed):
                raise Violation("once", f"row #{rid} sent at {before} and again at {after}")
        if marked is not None and any(t > marked for t in times):
            raise Violation("once", f"row #{rid} sent again after its delivery was recorded")
    for (aid, ep, rule), (_, log) in _chains(run).items():
        seen: set[tuple[int, int]] = set()
        for n, entry in enumerate(log):
            if entry.get("event") != "paged":
                # acked, reack, resumed, snooze ended, or started again by a later event
                # (from step one, as resumed): the step may page again
                what = entry.get("event")
                if what not in ("skipped", "started") or (what == "started" and n > 0):
                    seen.clear()
                continue
            key = (int(entry["step"]), int(entry["round"]))
            if key in seen:
                raise Violation(
                    "once",
                    f"alert {aid}/{ep} rule {rule}: step {key[0]} round {key[1]} paged twice",
                )
            seen.add(key)


def resolved_reaches_paged(run: Run) -> None:
    """Resolved messages go to exactly the targets paged for that episode.

    (Its escalations' pages, and a resolve: true rule's targets when it notified; a page
    given up on, dead when the alert resolved, reached nobody.)"""
    rows: dict[tuple[str, int, str], dict[str, set[tuple[str, int]]]] = defaultdict(
        lambda: defaultdict(set)
    )
    opening = {e for e, seen in run.seen.transitions.items() if seen[0] in ("open", "update")}
    for rid, eid, aid, ep, rule, kind, state, notifier, target in run.query(
        "SELECT id, event_id, alert, episode, rule, kind, state, notifier, target FROM outbox"
        " WHERE alert IS NOT NULL AND episode IS NOT NULL"
    ):
        if kind == "event" and eid not in opening:
            continue  # a closing (or late) event's own notification: not a page of the episode
        moment = run.seen.resolved_seq.get((aid, int(ep)))
        if kind != "resolved" and moment is not None and sends.dead_at(run, int(rid), moment):
            continue  # given up on before the alert resolved: it never reached its target
        if kind == "resolved" or state in SENT:
            rows[(aid, int(ep), rule)][kind].add((notifier, int(target)))
    opened_with = {
        (seen[1], seen[2]): seen[3] for seen in run.seen.transitions.values() if seen[0] == "open"
    }
    for (aid, ep), digest in run.seen.resolved_by.items():
        if opened_with.get((aid, ep)) != digest:
            continue  # rules reloaded during the episode: who should hear is not defined
        ruleset = run.seen.rulesets[digest]
        for name, rule in ruleset.by_name.items():
            kinds = rows.get((aid, ep, name))
            if kinds is None:
                continue
            resolved = kinds.get("resolved", set())
            if rule.escalate is not None:
                paged = kinds.get("event", set()) | kinds.get("repeat", set())
                paged |= kinds.get("escalation", set())
                expected = {p for p in paged if p[0] in ruleset.notifiers}
            elif (
                rule.resolve
                and kinds.get("event")
                and not any(n.startswith("schedule:") for n in rule.notify)
            ):
                expected = {
                    (n, i) for n in rule.notify for i in range(len(ruleset.notifiers[n].urls))
                }
            else:
                continue
            if resolved != expected:
                raise Violation(
                    "resolved reaches who was paged",
                    f"alert {aid} episode {ep}, rule {name}: resolved messages to"
                    f" {sorted(resolved)}, paged {sorted(expected)}",
                )


def wake_exactly_what_was_held(run: Run) -> None:
    """What a silence, quiet hours or an inhibition held is notified once, if still open.

    (A woken notification, "was silenced since ...", comes at most once a hold, and never
    for an episode that resolved first; at the end, what nothing holds any more waits for
    nothing: checked by wake_at_the_end.)"""
    woke: dict[tuple[Any, ...], int] = defaultdict(int)
    for rid, aid, ep, rule, notifier, target, body, created in run.query(
        "SELECT id, alert, episode, rule, notifier, target, body, created_at FROM outbox"
        " WHERE kind = 'event' AND alert IS NOT NULL AND body LIKE ?",
        ("%\nwas %",),
    ):
        since = body.rsplit("\n", 1)[-1]
        if not since.startswith("was ") or " since " not in since:
            continue
        key = (aid, ep, rule, notifier, target, since)
        woke[key] += 1
        if woke[key] > 1:
            raise Violation(
                "wake exactly what was held", f"row #{rid}: {aid}/{ep} {rule} woken twice ({since})"
            )
        resolved = run.seen.resolved_at.get((aid, int(ep)))
        if resolved is not None and created > resolved:
            raise Violation(
                "wake exactly what was held",
                f"row #{rid}: {aid} episode {ep} resolved at {resolved - run.scenario.start:.0f}"
                f" and was woken at {created - run.scenario.start:.0f} ({since})",
                "woken after it resolved",
            )


async def wake_at_the_end(run: Run) -> None:
    """At the end, no open alert's notice or chain waits for a hold that has ended."""
    assert run.store is not None
    ruleset = run.ruleset
    now = run.now

    def waiting(tx: Any) -> list[str]:
        silences = active_silences(tx.silences.active(now))
        stuck = []
        for what, aid, ep, name, why_, about in run.query(
            "SELECT 'notice', alert, episode, rule, suppressed_why, suppressed_event FROM notices"
            " WHERE suppressed_since IS NOT NULL UNION ALL"
            " SELECT 'chain', alert, episode, rule, suppressed_why, log FROM escalations"
            " WHERE suppressed_since IS NOT NULL AND next_at IS NULL"
        ):
            alert = tx.alerts.get(aid)
            rule = ruleset.by_name.get(name)
            if alert is None or alert.state != "open" or alert.episode != ep or rule is None:
                continue
            if what == "chain":  # judged by the event that started it, as its notice is
                about = filed.starter_at(json.loads(about) or [], now)
            fields = run.seen.bodies.get(about) if about else None
            fields = opener(tx, alert) if fields is None else fields
            held = suppression(tx, ruleset, rule, fields, silences, now, aid)
            if held is None:
                stuck.append(f"{what} of {aid}/{ep} rule {name} (was {why_})")
        tx.alerts.forget()
        return stuck

    stuck = await run.store.transact(waiting)
    if stuck:
        raise Violation(
            "wake exactly what was held",
            f"nothing holds them any more and they still wait: {stuck[:3]}",
            "never woken",
        )


def rows_name_their_channel(run: Run) -> None:
    """Each row records the channel its notifier's URL goes to, which sends it.

    (receiver.notify.registry: the pager's ntfys:// URL the ntfy channel, the others
    apprise's.)"""
    # A reload may move a notifier to another channel (chat to the Slack app's): a row
    # names the channel of its notifier in one of the files the run has routed with.
    loaded = run.seen.rulesets.values()
    wrong = [
        row
        for row in run.query("SELECT id, notifier, target, channel FROM outbox")
        if any(row[1] in rs.notifiers for rs in loaded)
        and row[3] not in {rs.channel(row[1], row[2]) for rs in loaded if row[1] in rs.notifiers}
    ]
    if wrong:
        raise Violation("rows name their channel", f"(id, notifier, target, channel): {wrong[:3]}")


CHECKS = (
    nothing_vanishes,
    rows_name_their_channel,
    open_alerts_accounted,
    once,
    resolved_reaches_paged,
    wake_exactly_what_was_held,
    *filed.CHECKS,
    storms.storm_windows_told_once,
    *subscribers.CHECKS,
    updates.updates_once,
)


async def check(run: Run, final: bool, routed: list[str]) -> None:
    """Every invariant after a step; explain for the events routed in it (all at the end)."""
    for invariant in CHECKS:
        invariant(run)
    await explain_is_true(run, list(run.seen.order) if final else routed)
    if final:
        await wake_at_the_end(run)
        for invariant in filed.FINAL:
            invariant(run)
        storms.storm_windows_told_once(run, final=True)
