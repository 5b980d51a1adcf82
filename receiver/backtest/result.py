"""What a backtest found: each rules file's tallies (Result: by rule, by notifier, the alert
episodes notified about) and two files' results side by side (compare). receiver.backtest.replay
replays the period and fills them; `receiver backtest` prints them."""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

HOUR = 3600
MAINTENANCE_SHOWN = 50  # held notifications a backtest lists
# What happened to a notification, from its outbox row's final state: sent, or why not.
SUPPRESSED = (
    "throttled", "muted", "silenced", "inhibited", "storm", "grouped", "stale", "cancelled",
    "maintenance",
)  # fmt: skip


@dataclass
class Tally:
    """One rule's or one notifier's notifications: sent, suppressed by reason, still held
    at the end, the sends of each hour (epoch hour start -> count), and how many alert
    episodes it notified about."""

    sent: int = 0
    suppressed: Counter[str] = field(default_factory=Counter)
    held: int = 0  # still held (hold, digest or active window) when the period ended
    hours: Counter[float] = field(default_factory=Counter)
    alerts: int = 0
    # Each alert's newest episode counted: episodes of an alert are notified in order (a
    # notification held past the next episode's would count once less).
    _seen: dict[str, int] = field(default_factory=dict, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled once the period is over (a replay process's result): _seen is done with.
        return {**self.__dict__, "_seen": {}}

    def busiest(self) -> tuple[float, int] | None:
        """The hour with most sends: (its start, how many); None if nothing was sent."""
        if not self.hours:
            return None
        return min(self.hours.items(), key=lambda kv: (-kv[1], kv[0]))

    def notified(self, alert: str, episode: int) -> None:
        if self._seen.get(alert, 0) < episode:
            self._seen[alert] = episode
            self.alerts += 1


@dataclass(frozen=True)
class Paged:
    """An alert episode someone was notified about: when first, and whose it was."""

    alert: str
    episode: int
    at: float
    session: str | None
    user: str | None


@dataclass
class Result:
    """What one rules file did over the period. paged: each alert episode notified about
    -> when first; people: each alert -> (session, user) of the event that last opened it."""

    source: str
    start: float
    end: float
    events: int = 0
    alerts_opened: int = 0
    rules: dict[str, Tally] = field(default_factory=dict)
    notifiers: dict[str, Tally] = field(default_factory=dict)
    paged: dict[tuple[str, int], float] = field(default_factory=dict)
    people: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    template_failures: int = 0
    # (policy, step) -> notifier -> pages: who each escalation step paged ("(silenced)": skipped)
    steps: dict[tuple[str, int], Counter[str]] = field(default_factory=dict)
    inhibited: Counter[str] = field(default_factory=Counter)  # by inhibition rule: muted
    # Flap detection: the messages held as flapping, by alert, and the flapping periods
    # (rule, alert, start) that began.
    flapping: Counter[str] = field(default_factory=Counter)
    flap_periods: set[tuple[str, str, float]] = field(default_factory=set)
    # Maintenance windows: the notifications each held, by window, and the first
    # MAINTENANCE_SHOWN of them: (when, window, rule, alert or event).
    maintenance: Counter[str] = field(default_factory=Counter)
    maintenance_held: list[tuple[float, str, str, str]] = field(default_factory=list)

    def held_in_maintenance(self, at: float, reason: str, rule: str, what: str) -> None:
        """Count a row a window held (reason "maintenance: NAME (until ...)")."""
        name = reason.removeprefix("maintenance: ").split(" (", 1)[0]
        self.maintenance[name] += 1
        if len(self.maintenance_held) < MAINTENANCE_SHOWN:
            self.maintenance_held.append((at, name, rule, what))

    def tallies(self, rule: str, notifier: str) -> tuple[Tally, Tally]:
        """The rule's and the notifier's tallies (made on first use)."""
        if rule not in self.rules:
            self.rules[rule] = Tally()
        if notifier not in self.notifiers:
            self.notifiers[notifier] = Tally()
        return self.rules[rule], self.notifiers[notifier]

    @property
    def sent(self) -> int:
        return sum(t.sent for t in self.rules.values())

    def page(self, key: tuple[str, int]) -> Paged:
        session, user = self.people.get(key[0], (None, None))
        return Paged(key[0], key[1], self.paged[key], session, user)


@dataclass
class Comparison:
    """A candidate's result beside the current rules': the alert episodes one notified
    about and the other did not (how many; the first `shown`, earliest first)."""

    candidate: Result
    current: Result
    missed: list[Paged]
    added: list[Paged]
    missed_count: int
    added_count: int


def compare(candidate: Result, current: Result, *, shown: int = 20) -> Comparison:
    missed = current.paged.keys() - candidate.paged.keys()
    added = candidate.paged.keys() - current.paged.keys()

    def first(result: Result, keys: set[tuple[str, int]]) -> list[Paged]:
        earliest = heapq.nsmallest(shown, keys, key=lambda k: (result.paged[k], k))
        return [result.page(k) for k in earliest]

    return Comparison(
        candidate,
        current,
        first(current, missed),
        first(candidate, added),
        len(missed),
        len(added),
    )
