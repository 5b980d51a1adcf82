"""Digests: a grouping rule's notifications gathered into one message a group, sent when the
group's wait ends or it reaches its max."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from receiver.rules import Rule, format_duration
from receiver.store.base import Tx
from receiver.store.records import Group, Notification

DIGEST_MEMBERS = 100  # members kept per digest; the count goes on


def join(
    tx: Tx,
    event_id: str,
    payload: Mapping[str, Any],
    rule: Rule,
    rows: Sequence[Notification],
    *,
    now: float,
    texts: bool = True,
) -> int:
    """Add the event to its open group for rule (a new group, with a held digest row per
    target in rows, when none is open) and return the group's id. texts=False leaves the
    digest's title and body empty (`receiver backtest` never reads them)."""
    spec = rule.group
    assert spec is not None
    key = spec.key(dict(payload))
    group = tx.digests.find_open(rule.name, key, now)
    if group is None:
        group = tx.digests.new(rule.name, key, now, now + spec.wait)
        for n in rows:  # the digest's rows, one per target; texts written later
            tx.outbox.add(
                event_id,
                n,
                state="held",
                now=now,
                next_at=group.closes_at,
                kind="digest",
                group_id=group.id,
                reason=f"digest of {rule.name} for {key}",
            )
    members = group.members[: DIGEST_MEMBERS - 1] + [
        {k: payload.get(k) for k in ("id", "type", "sessionId", "userId", "score")}
    ]
    group = Group(group.id, group.rule, group.key, group.closes_at, group.count + 1, members)
    release = group.count >= spec.max
    title, body = digest_text(rule, group) if texts else ("", "")
    tx.digests.update(group, title=title, body=body, now=now, release=release)
    return group.id


def digest_text(rule: Rule, group: Group) -> tuple[str, str]:
    """One message for a digest: the count, the worst scores and the sessions."""
    members = group.members
    types = sorted({str(m.get("type")) for m in members})
    title = f"[{rule.name}] {group.count} × {', '.join(types)}"
    if group.key != "*":
        title += f" ({group.key.replace('|', ', ')})"
    scored = sorted(
        (m for m in members if isinstance(m.get("score"), int | float)), key=lambda m: m["score"]
    )[:5]
    lines = [f"{group.count} events in {format_duration(rule.group.wait if rule.group else 0)}"]
    if scored:
        lines.append(
            "worst scores: "
            + ", ".join(f"{m.get('userId') or m.get('sessionId')} {m['score']}" for m in scored)
        )
    sessions = list(dict.fromkeys(str(m.get("sessionId")) for m in members))
    more = f" (+{len(sessions) - 10} more)" if len(sessions) > 10 else ""
    lines.append(f"sessions: {', '.join(sessions[:10])}{more}")
    return title, "\n".join(lines)
