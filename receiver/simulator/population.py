"""The fake upstream's sessions: a generated population, some finished and some live, each
with the fields of part 2 of the document and a score history.

    population = Population.generate(seed=1, sessions=50, threshold=40, now=datetime.now(UTC))
    events = population.tick(datetime.now(UTC))   # live sessions move; the events they made

The live ones are the sender emulator's random walks (receiver.simulator.walk.Walk): drops,
recoveries, interventions fired and resolved, and a stop now and then, after which a new
session starts. Pure and deterministic given the seed and the instants passed in.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from receiver.simulator.walk import Walk, new_walk, timestamp

PAGES = ("/checkout", "/search", "/lesson/1", "/lesson/2", "/dashboard", "/video")
COHORTS = ("a", "b", "control")
HISTORY_STEP = timedelta(seconds=30)  # between two score points of a finished session
STOP_CHANCE = 0.01  # a live session stops at a tick with this chance


@dataclass
class FakeSession:
    """One session the fake upstream serves: its walk, its fields, its score history."""

    walk: Walk
    context: str
    cohort: str
    started: datetime
    updated: datetime
    history: list[tuple[float, str]] = field(default_factory=list)
    signals: int = 0
    interventions: int = 0
    stopped: bool = False

    @property
    def id(self) -> str:
        return self.walk.session_id

    @property
    def status(self) -> str:
        if self.stopped:
            return "stopped"
        return "dropped" if self.walk.below else "active"

    def score(self) -> int | float:
        value = self.walk.score
        return int(value) if float(value).is_integer() else value

    def as_list_item(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "userId": self.walk.user_id,
            "score": self.score(),
            "status": self.status,
            "context": self.context,
            "startedAt": timestamp(self.started),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.as_list_item(),
            "signals": self.signals,
            "interventions": self.interventions,
            "updatedAt": timestamp(self.updated),
        }

    def advance(self, now: datetime, *, stop: bool = False) -> list[dict[str, Any]]:
        """One score update at now (or the stop); the events it made, without id/timestamp."""
        produced = self.walk.stop() if stop else self.walk.step()
        self.stopped = self.stopped or stop
        self.signals += 1
        self.updated = now
        self.interventions += sum(1 for e in produced if e["type"] == "intervention.fired")
        self.history.append((self.walk.score, timestamp(now)))
        return [{**e, "context": self.context, "cohort": self.cohort} for e in produced]


class Population:
    """Every session the fake upstream knows, by id, and which of them are live."""

    def __init__(self, *, seed: int, threshold: float, run: str) -> None:
        self.rng = random.Random(seed)
        self.threshold = threshold
        self.run = run
        self.sessions: dict[str, FakeSession] = {}
        self.live: list[str] = []
        self._numbers = itertools.count()

    @classmethod
    def generate(
        cls,
        *,
        seed: int,
        sessions: int,
        threshold: float,
        now: datetime,
        live: int | None = None,
        run: str = "up",
    ) -> Population:
        """`sessions` sessions: `live` of them (a third by default) running now, the rest
        finished over the past day with 5 to 40 score points each."""
        population = cls(seed=seed, threshold=threshold, run=run)
        live = max(1, sessions // 3) if live is None else min(live, sessions)
        for _ in range(sessions - live):
            population._finished(now)
        for _ in range(live):
            population._start(now - timedelta(seconds=population.rng.uniform(0, 300)))
        return population

    def _new(self, started: datetime) -> FakeSession:
        rng = random.Random(self.rng.getrandbits(64))
        walk = new_walk(next(self._numbers), run=self.run, threshold=self.threshold, rng=rng)
        session = FakeSession(
            walk=walk,
            context=rng.choice(PAGES),
            cohort=rng.choice(COHORTS),
            started=started,
            updated=started,
            history=[(walk.score, timestamp(started))],
        )
        self.sessions[session.id] = session
        return session

    def _finished(self, now: datetime) -> None:
        points = self.rng.randrange(5, 41)
        started = now - timedelta(seconds=self.rng.uniform(3600, 86_400))
        session = self._new(started)
        for n in range(1, points):
            session.advance(started + n * HISTORY_STEP)
        session.advance(started + points * HISTORY_STEP, stop=True)

    def _start(self, started: datetime) -> FakeSession:
        session = self._new(started)
        self.live.append(session.id)
        return session

    def tick(self, now: datetime) -> list[dict[str, Any]]:
        """Every live session moves once (a few stop, and new ones take their place); the
        events made, as payloads without id and timestamp."""
        out: list[dict[str, Any]] = []
        for session_id in list(self.live):
            session = self.sessions[session_id]
            stop = self.rng.random() < STOP_CHANCE
            out.extend(session.advance(now, stop=stop))
            if stop:
                self.live.remove(session_id)
                self._start(now)
        return out

    def newest_first(self) -> list[FakeSession]:
        """All sessions, newest startedAt first (then id, descending): the list order."""
        return sorted(self.sessions.values(), key=lambda s: (s.started, s.id), reverse=True)
