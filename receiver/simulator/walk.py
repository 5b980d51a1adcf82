"""The sender's sessions: scores that wander (a random walk with sudden drops and
recoveries) and the events they emit when they cross the threshold (``score.drop`` /
``score.recover``), open and close interventions, and end (``session.stopped``); the
service's retry schedule, and the plain event stream the benchmarks send.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from receiver.events import SENDER_RETRIES, iso

DEFAULT_URL = "http://127.0.0.1:4000/v1/events"

# The walk. A tick moves the score by a small gaussian step; now and then it
# drops suddenly; below the threshold it drifts back up (the user re-engages).
DROP_CHANCE = 0.06
DROP_SIZE = (15.0, 40.0)
STEP = 4.0
RECOVERY_DRIFT = 3.0
INTERVENTION_CHANCE = 0.5


def retry_delays(speed: float = 1.0) -> tuple[float, ...]:
    """The service's retry delays in seconds, divided by speed.

    >>> retry_delays(60)
    (1.0, 5.0, 30.0, 120.0, 480.0)
    """
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    return tuple(d / speed for d in SENDER_RETRIES)


def timestamp(when: datetime) -> str:
    """ISO 8601 UTC with milliseconds, as the service writes it: 2024-05-01T12:00:00.123Z."""
    return iso(when, digits=3)


# -- sessions: the pure part ----------------------------------------------------------------


@dataclass
class Walk:
    """One session's score: a random walk that emits events when it crosses the threshold.

    ``move_to(score)`` holds the crossing logic and is deterministic given the rng;
    ``step()`` draws the next score and moves there.
    """

    session_id: str
    user_id: str
    threshold: float
    score: float
    rng: random.Random
    below: bool = False
    intervention: str | None = None
    _interventions: int = 0

    def step(self) -> list[dict[str, Any]]:
        """Advance one tick; the event fields (without id/timestamp) it produced."""
        rng = self.rng
        if self.below:
            delta = rng.gauss(RECOVERY_DRIFT, STEP)
        elif rng.random() < DROP_CHANCE:
            delta = -rng.uniform(*DROP_SIZE)
        else:
            # A gentle pull towards 70 keeps healthy sessions from wandering off forever.
            delta = rng.gauss((70.0 - self.score) * 0.05, STEP)
        return self.move_to(self.score + delta)

    def move_to(self, score: float) -> list[dict[str, Any]]:
        """Set the score; emit drop/recover on a crossing, and open/close an intervention."""
        self.score = round(min(100.0, max(0.0, score)), 1)
        out: list[dict[str, Any]] = []
        if not self.below and self.score < self.threshold:
            self.below = True
            out.append(self._score_event("score.drop"))
            if self.intervention is None and self.rng.random() < INTERVENTION_CHANCE:
                self._interventions += 1
                self.intervention = f"int_{self.session_id[5:]}_{self._interventions}"
                out.append(
                    self._base(
                        "intervention.fired",
                        interventionId=self.intervention,
                        kind=self.rng.choice(["nudge", "break", "checkin"]),
                    )
                )
        elif self.below and self.score >= self.threshold:
            self.below = False
            if self.intervention is not None:
                out.append(self._resolve(self.rng.choice(["answered", "dismissed"])))
            out.append(self._score_event("score.recover"))
        return out

    def stop(self) -> list[dict[str, Any]]:
        """The session ends: close an open intervention, then session.stopped."""
        out = [self._resolve("expired")] if self.intervention is not None else []
        out.append(self._base("session.stopped", score=self.score))
        return out

    def _resolve(self, outcome: str) -> dict[str, Any]:
        event = self._base(
            "intervention.resolved", interventionId=self.intervention, outcome=outcome
        )
        self.intervention = None
        return event

    def _score_event(self, kind: str) -> dict[str, Any]:
        return self._base(kind, score=self.score, threshold=_number(self.threshold))

    def _base(self, event_type: str, **fields: Any) -> dict[str, Any]:
        return {"type": event_type, "sessionId": self.session_id, "userId": self.user_id, **fields}


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def new_walk(index: int, *, run: str, threshold: float, rng: random.Random) -> Walk:
    """Session number index of run, starting comfortably above the threshold."""
    start = rng.uniform(max(threshold + 10, 55.0), 95.0)
    return Walk(
        session_id=f"sess_{run}_{index:03d}",
        user_id=f"user_{rng.randrange(1, 500)}",
        threshold=threshold,
        score=round(min(start, 100.0), 1),
        rng=rng,
    )


def event_stream(
    *,
    seed: int,
    sessions: int,
    threshold: float,
    run: str = "bench",
    start: datetime | None = None,
    tick: float = 1.0,
) -> Iterator[dict[str, Any]]:
    """An endless stream of complete, valid events from `sessions` walks ticking in turn.

    Sessions are stopped and replaced now and then, so every event type appears.
    Used by bench/ to pre-generate a request file; ids are unique within a run.
    """
    rng = random.Random(seed)
    clock = start or datetime.now(UTC)
    count = itertools.count(1)
    walks = [new_walk(i, run=run, threshold=threshold, rng=rng) for i in range(sessions)]
    fresh = itertools.count(sessions)
    while True:
        clock += timedelta(seconds=tick)
        for slot, walk in enumerate(walks):
            produced = walk.step()
            if rng.random() < 0.002:
                produced += walk.stop()
                walks[slot] = new_walk(next(fresh), run=run, threshold=threshold, rng=rng)
            for fields in produced:
                yield {
                    "id": f"evt_{run}_{next(count):07d}",
                    **fields,
                    "timestamp": timestamp(clock),
                }


def wants_duplicate(rng: random.Random, share: float) -> bool:
    """Whether the next event is delivered twice, for a share between 0 and 1."""
    return share > 0 and rng.random() < share
