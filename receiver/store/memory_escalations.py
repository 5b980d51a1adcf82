"""tx.escalations in memory, for `receiver backtest` (receiver.store.memory): a scratch
store has no acknowledgements, so a chain runs until its alert resolves or it runs out."""

from __future__ import annotations

import copy
import heapq

from receiver.store.escalations import kept_log
from receiver.store.memory_tables import Tables
from receiver.store.records import Chain, Waiting, waiting_key


class MemoryEscalations:
    def __init__(self, t: Tables) -> None:
        self.t = t

    def start(self, chain: Chain) -> None:
        key = (chain.alert, chain.episode, chain.rule)
        found = self.t.chains.get(key)
        if found is None:
            self._put(copy.deepcopy(chain))
        elif found.next_at is None and found.suppressed_since is not None and chain.next_at:
            found.next_at, found.step = chain.next_at, 0
            self._put(found)

    def due(self, now: float, limit: int = 100) -> list[Chain]:
        popped: list[tuple[float, tuple[str, int, str]]] = []
        keys: dict[tuple[str, int, str], None] = {}
        while len(keys) < limit and (at := self.t.next_chain()) is not None and at <= now:
            popped.append(heapq.heappop(self.t.chain_due))
            keys[popped[-1][1]] = None
        for entry in popped:  # a read: they stay due until saved
            heapq.heappush(self.t.chain_due, entry)
        return [copy.deepcopy(self.t.chains[key]) for key in keys]

    def suppressed(self, after: Waiting | None, limit: int = 200) -> list[Chain]:
        waiting = sorted(
            (c for c in self.t.chains.values() if c.next_at is None and c.suppressed_since),
            key=waiting_key,
        )
        if after is not None:
            waiting = [c for c in waiting if waiting_key(c) > after]
        return [copy.deepcopy(c) for c in waiting[:limit]]

    def save(self, chain: Chain) -> None:
        chain = copy.deepcopy(chain)
        chain.log = kept_log(chain.log)
        self._put(chain)

    def of(self, alert: str, episode: int) -> list[Chain]:
        # By the episode's rules (t.keyed), not by a scan of every chain: routing asks this
        # for each event of a rule that escalates with a storm guard.
        chains = self.t.chains
        keys = ((alert, episode, rule) for rule in sorted(self.t.keyed.get((alert, episode), ())))
        return [copy.deepcopy(chains[key]) for key in keys if key in chains]

    def end(self, alert: str, episode: int, now: float, why: str) -> None:
        for chain in self.of(alert, episode):
            if chain.log and chain.log[-1].get("event") == "ended":
                continue
            chain.next_at = chain.suppressed_since = chain.suppressed_why = None
            chain.log.append({"at": now, "event": "ended", "note": why})
            self.save(chain)

    def next_due(self) -> float | None:
        return self.t.next_chain()

    def acked(self, alert: str, episode: int) -> tuple[str, float] | None:
        return None

    def unack(self, alert: str, episode: int, now: float, why: str) -> None:
        return None

    def paged(self, alert: str, episode: int, rule: str) -> list[tuple[str, int]]:
        return sorted(self.t.paged.get((alert, episode, rule), ()))

    def _put(self, chain: Chain) -> None:
        key = (chain.alert, chain.episode, chain.rule)
        self.t.chains[key] = chain
        self.t.keyed.setdefault(key[:2], set()).add(chain.rule)
        if chain.next_at is not None:
            heapq.heappush(self.t.chain_due, (chain.next_at, key))
