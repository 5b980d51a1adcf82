"""Silences in force: each one's matchers compiled once, and which of them silence a payload;
ending those that end with their alerts (until resolved; added by store.silences)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from receiver.events import to_utc
from receiver.matchers import Condition, compile_match
from receiver.store.base import Tx
from receiver.store.records import Alert, Silence

# The lifecycle's logger, where a refused silence has always been reported.
log = logging.getLogger("receiver.lifecycle")

# Each silence with its compiled conditions (active_silences).
Active = list[tuple[Silence, tuple[Condition, ...]]]


def active_silences(silences: Sequence[Silence]) -> Active:
    """Each silence with its compiled conditions. A silence with a matcher that no longer
    compiles (a regex made before RE2, with a backreference, say) silences nothing: with
    that condition dropped it would silence more than it says."""
    active = []
    for silence in silences:
        conditions, problems = _silence_conditions(
            json.dumps(silence.matchers, sort_keys=True, default=str)
        )
        if problems:
            _refused_silence(silence.id, "; ".join(problems))
        else:
            active.append((silence, conditions))
    return active


def matching(active: Active, payload: Mapping[str, Any]) -> Iterator[Silence]:
    """The silences whose every condition holds for payload, in order."""
    for silence, conditions in active:
        if all(c.holds(payload) for c in conditions):
            yield silence


def silencing(active: Active, payload: Mapping[str, Any]) -> Silence | None:
    """The first silence that silences payload, if any."""
    return next(matching(active, payload), None)


@functools.lru_cache(maxsize=256)  # each batch looks silences up again: compile each once
def _silence_conditions(matchers: str) -> tuple[tuple[Condition, ...], tuple[str, ...]]:
    conditions, problems = compile_match(json.loads(matchers))
    return conditions, tuple(problems)


@functools.lru_cache(maxsize=256)  # once per silence, not once per batch
def _refused_silence(silence_id: int, problems: str) -> None:
    log.warning(
        "silence #%d is ignored: %s; expire it and add it again in a form that is allowed",
        silence_id,
        problems,
    )


def end_resolved(tx: Tx, now: float) -> list[int]:
    """End each until-resolved silence whose alerts have all been resolved for its after
    (the timers run this before they look at what silences ended); the ids ended."""
    ended = []
    for silence in tx.silences.active(now):
        if silence.after is None:
            continue
        since = now - silence.after
        if silence.alerts:
            done = all(_resolved_by(tx.alerts.get(a), since) for a in silence.alerts)
        else:
            done = silence.created_at <= since
        if done and tx.silences.expire(silence.id, now):
            ended.append(silence.id)
            log.info("silence #%d ended: its alerts resolved", silence.id)
    return ended


def _resolved_by(alert: Alert | None, at: float) -> bool:
    """Whether the alert was resolved by at and still is (gone: as good as resolved)."""
    if alert is None:
        return True
    if alert.state != "resolved" or not alert.resolved_ts:
        return False
    return to_utc(datetime.fromisoformat(alert.resolved_ts)).timestamp() <= at
