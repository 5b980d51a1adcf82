"""The session projection behind the read API: one summary per session, folded from its events.

Pure: the router folds each batch it routes into the stored summaries (in the batch's
transaction), and a read folds in the events not routed yet, so a GET right after a 202
sees the event. Folding is order-free: every field that "the latest event" sets is
kept with its mark (the event's timestamp, then its id, as text whose order is time
order), counts only grow, and a stop is for good. So out-of-order deliveries give the
same summary as in-order ones, and the router sees each event once (a replay is not
folded again), so duplicates count once.

    fact = Fact.from_payload(payload)       # what one event says about its session
    summary = Summary(id=fact.session_id)
    summary.fold(fact)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from receiver.events import iso, utc_z

STATUSES = ("active", "dropped", "stopped")
# What score.drop and score.recover make of a session that has not stopped.
_TRENDS = {"score.drop": "dropped", "score.recover": "active"}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _text(value: Any) -> str | None:
    """A text field, unless empty or holding a NUL (which PostgreSQL's text cannot)."""
    return value if isinstance(value, str) and value and "\x00" not in value else None


def _instant(value: Any) -> str | None:
    """An ISO 8601 timestamp from a payload, normalised by iso(); None if it is not one."""
    if not isinstance(value, str):
        return None
    if (utc := utc_z(value)) is not None:
        return utc
    try:
        return iso(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        return None


@dataclass(slots=True)
class Fact:
    """What one event says about its session. Not frozen, though nothing changes one: a
    frozen dataclass sets each field through object.__setattr__, and the router makes one
    for every event."""

    event_id: str
    type: str
    session_id: str
    ts: str  # iso(): text order is time order
    user_id: str | None = None
    score: float | None = None
    context: str | None = None
    cohort: str | None = None
    signals: int | None = None
    started: str | None = None

    @property
    def mark(self) -> str:
        """Orders the events of a session: by timestamp, then by id (a stable tie-break)."""
        return f"{self.ts} {self.event_id}"

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Fact | None:
        """The fact of a stored (so validated) event's payload; None without a session."""
        session_id, ts = payload.get("sessionId"), _instant(payload.get("timestamp"))
        if not isinstance(session_id, str) or ts is None:
            return None
        signals = payload.get("signals")
        started = payload.get("startedAt")
        return cls(  # by position (the fields' order): the router makes one an event
            str(payload.get("id")),
            str(payload.get("type")),
            session_id,
            ts,
            _text(payload.get("userId")),
            _number(payload.get("score")),
            _text(payload.get("context")) or _text(payload.get("page")),
            _text(payload.get("cohort")),
            signals if isinstance(signals, int) and not isinstance(signals, bool) else None,
            None if started is None else _instant(started),
        )


@dataclass(slots=True)
class Summary:
    """One session as the read API shows it, with what folding needs to stay order-free.

    Each *_mark is the Fact.mark of the event that set the field before it ("" for none).
    """

    id: str
    user_id: str | None = None
    user_mark: str = ""
    score: float | None = None
    score_mark: str = ""
    trend: str | None = None  # "dropped" or "active", from the latest drop or recover
    trend_mark: str = ""
    stopped: bool = False
    context: str | None = None
    context_mark: str = ""
    cohort: str | None = None
    cohort_mark: str = ""
    signals_sent: int | None = None
    signals_mark: str = ""
    score_events: int = 0
    interventions: int = 0
    started_sent: str | None = None  # the earliest startedAt a payload sent
    first_ts: str | None = None
    last_ts: str | None = None

    @property
    def status(self) -> str:
        return "stopped" if self.stopped else (self.trend or "active")

    @property
    def started_at(self) -> str | None:
        return self.started_sent or self.first_ts

    @property
    def signals(self) -> int:
        return self.signals_sent if self.signals_sent is not None else self.score_events

    @property
    def score_ts(self) -> str | None:
        return self.score_mark.split(" ", 1)[0] if self.score_mark else None

    def fold(self, fact: Fact) -> None:
        """Take one event in. Any order of the same events gives the same summary."""
        mark = fact.mark
        if fact.user_id is not None and mark > self.user_mark:
            self.user_id, self.user_mark = fact.user_id, mark
        if fact.score is not None:
            self.score_events += 1
            if mark > self.score_mark:
                self.score, self.score_mark = fact.score, mark
        if fact.type in _TRENDS and mark > self.trend_mark:
            self.trend, self.trend_mark = _TRENDS[fact.type], mark
        if fact.type == "session.stopped":
            self.stopped = True
        elif fact.type == "intervention.fired":
            self.interventions += 1
        if fact.context is not None and mark > self.context_mark:
            self.context, self.context_mark = fact.context, mark
        if fact.cohort is not None and mark > self.cohort_mark:
            self.cohort, self.cohort_mark = fact.cohort, mark
        if fact.signals is not None and mark > self.signals_mark:
            self.signals_sent, self.signals_mark = fact.signals, mark
        if fact.started is not None and (
            self.started_sent is None or fact.started < self.started_sent
        ):
            self.started_sent = fact.started
        if self.first_ts is None or fact.ts < self.first_ts:
            self.first_ts = fact.ts
        if self.last_ts is None or fact.ts > self.last_ts:
            self.last_ts = fact.ts

    def as_list_item(self) -> dict[str, Any]:
        """The list form of part 2: id, userId, score, status, context, startedAt."""
        return {
            "id": self.id,
            "userId": self.user_id,
            "score": _score(self.score),
            "status": self.status,
            "context": self.context,
            "startedAt": self.started_at,
        }

    def as_dict(self) -> dict[str, Any]:
        """Every field of part 2."""
        return {
            **self.as_list_item(),
            "cohort": self.cohort,
            "signals": self.signals,
            "interventions": self.interventions,
            "updatedAt": self.last_ts,
        }


UPSTREAM_MARK = "~upstream"  # the "event id" of what a session's upstream record says


def merge_remote(summary: Summary, remote: dict[str, Any]) -> None:
    """Merge a session as the upstream service describes it (part 2's single-session form)
    into summary, the way fold() takes an event: each field set by the record is marked
    with its updatedAt, so newer events received here win over an older record and the
    other way round; counts take the larger; a stop is for good. Merging the same record
    twice changes nothing.
    """
    ts = _instant(remote.get("updatedAt")) or _instant(remote.get("startedAt"))
    if ts is None:
        return
    mark = f"{ts} {UPSTREAM_MARK}"
    user, score = _text(remote.get("userId")), _number(remote.get("score"))
    context, status = _text(remote.get("context")), remote.get("status")
    if user is not None and mark > summary.user_mark:
        summary.user_id, summary.user_mark = user, mark
    if score is not None and mark > summary.score_mark:
        summary.score, summary.score_mark = score, mark
    if context is not None and mark > summary.context_mark:
        summary.context, summary.context_mark = context, mark
    if status == "stopped":
        summary.stopped = True
    elif status in ("dropped", "active") and mark > summary.trend_mark:
        summary.trend, summary.trend_mark = status, mark
    signals, interventions = remote.get("signals"), remote.get("interventions")
    if isinstance(signals, int) and not isinstance(signals, bool) and mark > summary.signals_mark:
        summary.signals_sent, summary.signals_mark = signals, mark
    if isinstance(interventions, int) and not isinstance(interventions, bool):
        summary.interventions = max(summary.interventions, interventions)
    started = _instant(remote.get("startedAt"))
    if started is not None and (summary.started_sent is None or started < summary.started_sent):
        summary.started_sent = started
    for instant in (started, ts):
        if instant is None:
            continue
        if summary.first_ts is None or instant < summary.first_ts:
            summary.first_ts = instant
        if summary.last_ts is None or instant > summary.last_ts:
            summary.last_ts = instant


# The columns of the sessions table, in Summary's field order.
COLUMNS = tuple(f.name for f in fields(Summary))


def _score(value: float | None) -> float | int | None:
    """A score as the service writes it: an integer when it is a whole number."""
    if value is None:
        return None
    return int(value) if value.is_integer() else value


def fold_all(summaries: dict[str, Summary], facts: list[Fact]) -> dict[str, Summary]:
    """Fold facts into the summaries of their sessions (creating those missing); the
    summaries that changed, by session id."""
    changed: dict[str, Summary] = {}
    for fact in facts:
        summary = summaries.get(fact.session_id)
        if summary is None:
            summary = summaries[fact.session_id] = Summary(id=fact.session_id)
        summary.fold(fact)
        changed[fact.session_id] = summary
    return changed


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One group of GET /v1/scores: its sessions' scores as a histogram (score -> sessions)."""

    key: str
    histogram: dict[float, int]

    @property
    def sessions(self) -> int:
        return sum(self.histogram.values())

    @property
    def avg(self) -> float:
        total = sum(score * n for score, n in self.histogram.items())
        return round(total / self.sessions, 2)

    def percentile(self, percent: float) -> float | int | None:
        """Nearest rank: the smallest score with at least percent% of the sessions at or
        below it."""
        rank = max(1, math.ceil(percent / 100 * self.sessions))
        seen = 0
        for score in sorted(self.histogram):
            seen += self.histogram[score]
            if seen >= rank:
                return _score(score)
        return None

    def as_dict(self, *, p95: bool) -> dict[str, Any]:
        group: dict[str, Any] = {
            "key": self.key,
            "avg": self.avg,
            "p50": self.percentile(50),
            "sessions": self.sessions,
        }
        if p95:
            group["p95"] = self.percentile(95)
        return group
