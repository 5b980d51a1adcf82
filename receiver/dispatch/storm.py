"""The storm guard (a rule's `storm: {max: 10, per: 5m}`): past `max` notifications of the
rule inside a window of `per`, the rest of the window's are held back (outbox state
`storm`, each kept with its reason) and one storm message a target goes out when the window
ends: how many were held back, the top sessions and users, and where to see them. A window
after one that went over is a storm from its start; the first window that stays under max
is followed by single messages again. The count lives in the store (tx.storms): replicas
share it. The storm message is a digest group of the rule (receiver.dispatch.digests' table,
key STORM_KEY), sent by the notify worker when its window closes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from receiver.durations import format_duration
from receiver.links import Links
from receiver.rules import Rule
from receiver.store.base import Tx
from receiver.store.records import Group, Notification

STORM_KEY = "(storm)"
MEMBERS = 1000  # held notifications kept in the storm message's group; the count goes on
TOP = 5


def held(
    tx: Tx,
    event_id: str,
    payload: Mapping[str, Any],
    rule: Rule,
    rows: Sequence[Notification],
    *,
    now: float,
    texts: bool = True,
    links: Links | None = None,
) -> tuple[str, int] | None:
    """Count the rule's notification of the event; (reason, storm group) when it is held
    back in a storm, else None (it goes out)."""
    spec = rule.storm
    assert spec is not None
    start, count, prev = tx.storms.count(rule.name, now, spec.per)
    if count <= spec.max and prev <= spec.max:
        return None
    group = tx.digests.find_open(rule.name, STORM_KEY, now)
    if group is None:
        group = tx.digests.new(rule.name, STORM_KEY, now, start + spec.per)
        for n in rows:  # the storm message, one a target; its text is written below
            tx.outbox.add(
                event_id, n, state="held", now=now, next_at=group.closes_at, kind="storm",
                group_id=group.id, reason=f"storm message of {rule.name}",
            )  # fmt: skip
    member = {k: payload.get(k) for k in ("id", "sessionId", "userId")}
    members = group.members if len(group.members) >= MEMBERS else [*group.members, member]
    group = Group(group.id, group.rule, group.key, group.closes_at, group.count + 1, members)
    title, body = storm_text(rule, group, links) if texts else ("", "")
    tx.digests.update(group, title=title, body=body, now=now, release=False)
    why = f"storm: over {spec.max} in {format_duration(spec.per)}; in storm message #{group.id}"
    return why, group.id


def storm_text(rule: Rule, group: Group, links: Links | None) -> tuple[str, str]:
    """The storm message: how many were held back, the top sessions and users, where."""
    spec = rule.storm
    assert spec is not None
    per = format_duration(spec.per)
    if rule.escalate is None:
        title = f"[{rule.name}] storm: {group.count} more notifications held back"
        lines = [
            f"{rule.name} went over {spec.max} notifications in {per}: {group.count} more of"
            " this window were held back, not sent one by one."
        ]
    else:  # each held back is an alert whose escalation did not start
        alerts = "alert" if group.count == 1 else "alerts"
        title = f"[{rule.name}] storm: {group.count} more {alerts} held back, not paged"
        lines = [
            f"{rule.name} went over {spec.max} alerts in {per}: {group.count} more of this"
            f" window were held back, not paged: their escalation {rule.escalate.name} did"
            " not start."
        ]
    of = f" (of the first {MEMBERS})" if group.count > len(group.members) else ""
    for field, label in (("sessionId", "sessions"), ("userId", "users")):
        top = Counter(str(m.get(field)) for m in group.members if m.get(field) is not None)
        if top:
            shown = ", ".join(f"{name} ×{n}" for name, n in top.most_common(TOP))
            lines.append(f"top {label}{of}: {shown}")
    if links is not None:
        where = f"{links.base}/admin/notifications?state=storm&rule={quote(rule.name)}"
        lines.append(f"all of them: {where}")
    else:
        lines.append("all of them: receiver deliveries --state storm")
    lines.append(f"Single messages again once a window of {per} stays at {spec.max} or fewer.")
    return title, "\n".join(lines)
