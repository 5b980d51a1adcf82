"""Silences in force: each one's matchers compiled once, and which of them silence a payload."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from receiver.rules.match import Condition, compile_match
from receiver.store.records import Silence

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
