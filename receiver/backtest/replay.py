"""`receiver backtest`: what a rules file would have done with a stored period of events.

The period's events are read from the store in order of arrival (received_at, as the
router took them), in pages, and routed one by one through the router's own pipeline
(receiver.dispatch: matching, throttles, silences, active windows, hold,
digests, resolved messages, repeats, the heartbeat) on a scratch store in memory
(receiver.store.scratch), with a virtual clock: each event is routed at the time it
arrived, and between two events the timers run at the moments they fall due (a held
row or digest is sent, a repeat fires, the heartbeat goes off). Nothing is sent and the
real store is only read.

    replay = Backtest(ruleset, start=start, end=end, silences=silences)
    for event in events:          # StoredEvent, oldest first
        replay.route(event)
    result = replay.finish()
    # or, reading the period from a store (receiver.backtest.period):
    # results, seconds = await period.run(store, rulesets, ...)

What a backtest cannot know: the real store's state at the start of the period (alerts
open before it, throttle windows, digests), acknowledgements (they stop repeats) and
the notify worker's failures (a dead notification counts as sent here). It starts empty.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from receiver.backtest.result import HOUR, Comparison, Paged, Result, Tally, compare
from receiver.dispatch import flap, inhibition
from receiver.dispatch.alerts import Transition, apply
from receiver.dispatch.pipeline import UNTITLED, Pipeline
from receiver.dispatch.silences import active_silences
from receiver.events import load_stored
from receiver.rules import Decision, Ruleset
from receiver.store import MemoryTx, ScratchRow
from receiver.store.records import Alert, Silence, StoredEvent

MAX_KEYED = 100_000  # throttle keys whose decisions are kept (the sender's to make up)
_UNSEEN: Any = object()  # a row _collect() has not seen waiting

__all__ = [
    "Backtest", "Comparison", "Paged", "Result", "Tally", "compare", "route_all",
    "untitled_decisions",
]  # fmt: skip


class Backtest:
    """One rules file replayed over a period on its own scratch store and virtual clock."""

    def __init__(
        self,
        ruleset: Ruleset,
        *,
        start: float,
        end: float,
        silences: Sequence[Silence] = (),
        texts: bool = False,
    ) -> None:
        self.ruleset = ruleset
        self.tx = MemoryTx(lean=True)  # receiver.store.scratch(), its timers' heaps seen
        self.result = Result(ruleset.source, start, end)
        self.pipeline = Pipeline(self.tx, ruleset, start)
        self.texts = texts
        self.pipeline.texts = texts
        self._boundaries = self._copy_silences(silences)
        # A maintenance window's end wakes what it held, as a silence's does (advance()).
        ends = {e for w in ruleset.maintenance for _, e in w.spans(start, end) if e > start}
        self._boundaries = sorted({*self._boundaries, *ends}, reverse=True)
        self._last_event = start  # the heartbeat's "last arrival" before the first event
        self._firing = False  # the heartbeat fired, and no event has arrived since
        self._openers: dict[str, str] = {}  # alert -> the event that opened its episode
        # alert -> later events of its episode whose notification a silence holds (kept())
        self._waiting_on: dict[str, list[str]] = {}
        # Rows not sent yet (pending, held) -> the alert episode of the event that made them.
        self._waiting: dict[int, tuple[str, int] | None] = {}
        self._current: Alert | None = None  # the alert of the event routed
        self._leader: Backtest | None = None  # whose store keeps the events and alerts
        self._untitled: dict[Any, list[Decision]] = {}  # untitled_decisions()'s, by rule (and key)
        self._tallies: dict[tuple[str, str], tuple[Tally, Tally]] = {}  # result.tallies()
        self._lifecycle = any(rule.follows_alert for rule in ruleset.rules)
        self._windows = any(rule.active for rule in ruleset.rules)  # _window_opens()
        # No timer falls due before this (timers() found so): until the pipeline adds or
        # changes rows, the events before it need no look at the timers.
        self._quiet_until = -math.inf

    def _copy_silences(self, silences: Sequence[Silence]) -> list[float]:
        """The real store's silences, each active over the same span; the times at which
        the set of active silences changes."""
        times: set[float] = set()
        for s in silences:
            sid = self.tx.silences.add(s.matchers, s.reason, s.starts_at, s.ends_at)
            times.update((s.starts_at, s.ends_at))
            if s.expired_at is not None:
                self.tx.silences.expire(sid, s.expired_at)
                times.add(s.expired_at)
        return sorted(times, reverse=True)  # popped from the end, earliest first

    def advance(self, now: float) -> bool:
        """Move the virtual clock to now (never back); whether the silences changed."""
        refresh = False
        while self._boundaries and self._boundaries[-1] <= now:
            self._boundaries.pop()
            refresh = True
        self.pipeline.now = now
        if refresh:
            self.pipeline.silences = active_silences(self.tx.silences.active(now))
            self.pipeline.wake()  # what a silence or quiet hours that ended held
            if self._windows:  # what a silence held, and quiet hours hold now
                held = self.tx.notices.suppressed(None, 1_000_000)
                chains = self.tx.escalations.suppressed(None, 1_000_000)
                self._window_opens({n.rule for n in held} | {c.rule for c in chains}, now)
        return refresh

    def _window_opens(self, rules: Iterable[str], at: float) -> None:
        """Quiet hours muted what these rules hold: each one's active window's next opening
        is a boundary too, where what it muted is woken (as the server's timers do)."""
        for name in rules:
            rule = self.ruleset.by_name.get(name)
            opens = rule.active.next_open(at) if rule and rule.active else at
            if opens > at and opens not in self._boundaries:
                bisect.insort(self._boundaries, opens, key=lambda t: -t)

    # -- events and timers ------------------------------------------------------------------

    def arrive(self, now: float) -> None:
        """An event arrives at now: the timers due by then run, the clock moves to it."""
        if now >= self._quiet_until:
            self.timers(now)
        if self._boundaries and self._boundaries[-1] <= now:
            self.advance(now)
        else:
            self.pipeline.now = now
        self.result.events += 1

    def route(self, event: StoredEvent, payload: Mapping[str, Any] | None = None) -> None:
        """Route one event at the time it arrived, after the timers due by then."""
        if payload is None:
            payload = load_stored(event.body)
        route_all([self], event.id, event.received_at, event.body, payload)

    def follow(self, leader: Backtest) -> None:
        """Replay the leader's events beside it (route_all): its store keeps the events
        and alerts, and applies each event to its alert once for both."""
        self.tx.scratch.follow(leader.tx.scratch)
        self.result.people = leader.result.people
        self._leader = leader

    def place(
        self, event_id: str, received_at: float, payload: Mapping[str, Any], transition: Transition
    ) -> None:
        """The event's notifications by this rules file, its alert already moved on. An
        event no rule matches does nothing here unless it resolves an alert (which cancels
        held rows and sends resolved messages)."""
        if self.texts:
            decisions = self.ruleset.route(payload)
        else:
            decisions = untitled_decisions(self.ruleset, payload, self._untitled)
        alert, what = transition.alert, transition.what
        if what == "open":
            assert alert is not None
            self.tx.scratch.episode_over(alert)
        if self.ruleset.inhibit and inhibition.track(
            self.tx, self.ruleset, payload, transition, event_id
        ):
            self.pipeline.now = received_at
            self.pipeline.wake()  # what the source inhibited, still open, is notified now
        # A resolve answers only what lifecycle rules left of the episode (held rows, or
        # notices: resolved messages, repeats and chains end); else it changes nothing.
        if decisions or (
            what == "resolve"
            and alert is not None
            and (
                (self._lifecycle and self.tx.scratch.answers(alert))
                or (self.ruleset.flaps and bool(self.tx.flaps.of(alert.id)))
            )
        ):
            self.pipeline.event(event_id, payload, decisions, transition=transition)
            self._quiet_until = -math.inf
        self._current = alert
        if self.tx.tables.journal:
            self._collect()
        if self.ruleset.heartbeat is not None:
            self._last_event = received_at
            if self._firing:  # an arrival does nothing to a heartbeat that is not firing
                self._beat(arrived=True)

    def kept(
        self, event_id: str, payload: Mapping[str, Any], transition: Transition,
        backtests: Sequence[Backtest] = (),
    ) -> None:  # fmt: skip
        """The leader, once every rules file has placed the event: an episode's opener is
        kept (route_all) until the alert's next episode opens. Only for an event that opened
        its alert's episode."""
        alert = transition.alert
        if alert is None or self._openers.get(alert.id) == event_id:
            return
        self.result.alerts_opened += 1
        previous = self._openers.get(alert.id)
        self._openers[alert.id] = event_id
        # A flapping period settles under the rule's last counted opener (flaps.opened),
        # judged by its fields (a silence, a maintenance window): kept while one may.
        if previous is not None and not any(
            f.opened == previous
            for b in backtests
            if b.ruleset.flaps
            for f in b.tx.flaps.of(alert.id)
        ):
            self.tx.scratch.forget_event(previous)
        for waited in self._waiting_on.pop(alert.id, ()):
            self.tx.scratch.forget_event(waited)
        user = payload.get("userId")
        session = payload.get("sessionId")
        self.result.people[alert.id] = (session, user if isinstance(user, str) else None)

    def waited_on(self, event: StoredEvent, alert: Alert) -> None:
        """The leader keeps an update whose notification a rules file's silence holds: the
        notification that wakes is rendered and judged from it (as the server does), until
        the alert's next episode opens."""
        if self.tx.scratch.put(event):
            self.tx.events.mark_routed([event.id], event.received_at)
            self._waiting_on.setdefault(alert.id, []).append(event.id)

    def timers(self, until: float) -> None:
        """Run what falls due up to until, each at its own time: held rows and digests are
        sent (the notify worker's part), repeats fire, the heartbeat goes off."""
        if until < self._quiet_until:
            return
        # The earliest time a timer may fall due, cheaply (stale heap entries included):
        # most events after the pipeline wrote rows find nothing due yet.
        silent = self._silent_at()
        settles = self._settles()
        soonest = min(
            self.tx.scratch.earliest(),
            self._boundaries[-1] if self._boundaries else math.inf,
            math.inf if silent is None else silent,
            math.inf if settles is None else settles,
        )
        if until < soonest:
            self._quiet_until = soonest
            return
        scratch = self.tx.scratch
        while True:
            due, repeat, chain = scratch.next_due(), scratch.next_repeat(), scratch.next_chain()
            silent = self._silent_at()  # moves only as events arrive (or the heartbeat beats)
            boundary = self._boundaries[-1] if self._boundaries else None
            now, settles = None, self._settles()
            for at in (due, repeat, chain, boundary, silent, settles):
                if at and (now is None or at < now):
                    now = at
            if now is None or now > until:
                # The heartbeat's time only moves later as events arrive; rows and repeats
                # come from the pipeline, which resets this.
                self._quiet_until = math.inf if now is None else now
                return
            if self.advance(now):  # what a silence held may be due now
                due, repeat, chain = scratch.next_due(), scratch.next_repeat(), None
            if due is not None and due <= now:
                scratch.deliver_due(now)
            if settles is not None and settles <= now:
                self.pipeline.flaps()  # a settled-open alert may start its chain now
                chain = None
            if repeat is not None and repeat <= now:
                self.pipeline.repeats()
                chain = None
            if chain is None:  # looked at again after what may have started a chain
                chain = scratch.next_chain()
            if chain is not None and chain <= now:
                self.pipeline.escalations()
            self._current = None
            if silent is not None and silent <= now:
                self._beat(arrived=False)
            self._collect()

    def _settles(self) -> float | None:
        """When the next flapping period settles, if any does (rules with flap only)."""
        return self.tx.flaps.next_due() if self.ruleset.flaps else None

    def _silent_at(self) -> float | None:
        """When the heartbeat would fire, if it has not yet."""
        beat = self.ruleset.heartbeat
        if beat is None or self._firing:
            return None
        return self._last_event + beat.silent_for

    def _beat(self, *, arrived: bool) -> None:
        """The heartbeat after an arrival or a silence; whether it is firing now (kept here,
        not read from the store's JSON for every event)."""
        self.pipeline.heartbeat(self._last_event, arrived=arrived)
        self._firing = bool((self.tx.state.get("heartbeat") or {}).get("firing"))
        self._collect()

    def finish(self) -> Result:
        """Run the timers to the end of the period; what is still held is counted so."""
        self.timers(self.result.end)
        for row in self.tx.scratch.rows():
            if row.state == "held":
                for tally in self.result.tallies(row.rule, row.notifier):
                    tally.held += 1
        self.result.template_failures = sum(n for n, _ in self.pipeline.failed.values())
        if self._leader is not None:
            self.result.alerts_opened = self._leader.result.alerts_opened
        return self.result

    # -- counting ---------------------------------------------------------------------------

    def _collect(self) -> None:
        """Count the outbox rows written or changed since the last look."""
        changes = self.tx.scratch.changes()
        if not changes:
            return
        self._quiet_until = -math.inf
        result, waiting, tallies = self.result, self._waiting, self._tallies
        for row, state in changes:
            kind = row.kind
            if kind == "webhook":
                continue
            if kind == "escalation" and state in ("pending", "silenced", "muted"):
                self._step(row, state)
            if state == "muted":
                self._window_opens((row.rule,), row.updated_at)
            if state == "inhibited" and row.reason:  # "inhibited by NAME (EVENT, ...)"
                result.inhibited[row.reason.removeprefix("inhibited by ").split(" ")[0]] += 1
            elif state == "maintenance" and row.reason:
                result.held_in_maintenance(
                    row.created_at, row.reason, row.rule, row.alert or row.event_id
                )
            elif state == "flapping":
                result.flapping[row.alert or "?"] += 1
            elif kind == flap.KIND and (row.reason or "").startswith(flap.STARTED):
                result.flap_periods.add((row.rule, row.alert or "?", row.created_at))
            if state == "pending" or state == "held":  # sent when deliver_due() gets to it
                if row.id not in waiting:
                    waiting[row.id] = self._episode(row)
                continue
            where = waiting.pop(row.id, _UNSEEN)
            if where is _UNSEEN:
                where = self._episode(row)
            pair = tallies.get((row.rule, row.notifier))
            if pair is None:
                pair = tallies[(row.rule, row.notifier)] = result.tallies(row.rule, row.notifier)
            if state == "delivered":
                notified = kind not in ("digest", "heartbeat", "resolved")
                hour = row.updated_at - row.updated_at % HOUR
                for tally in pair:
                    tally.sent += 1
                    tally.hours[hour] += 1
            else:
                notified = state == "grouped"  # the alert is in the digest that goes out
                for tally in pair:
                    tally.suppressed[state] += 1
            if notified and where is not None:
                for tally in pair:
                    tally.notified(*where)
                if where not in result.paged:
                    result.paged[where] = row.updated_at

    def _step(self, row: ScratchRow, state: str) -> None:
        """Count an escalation page (or a skipped one) under its policy and step."""
        chain = self.tx.scratch.chain(row.alert or "", row.episode or 0, row.rule)
        entry = next((e for e in reversed(chain.log) if "step" in e), None) if chain else None
        if chain is not None and entry is not None:
            where = (str(chain.policy["name"]), int(entry["step"]))
            who = row.notifier if state == "pending" else f"({state})"
            self.result.steps.setdefault(where, Counter())[who] += 1

    def _episode(self, row: ScratchRow) -> tuple[str, int] | None:
        if row.alert is not None and row.episode is not None:
            return (row.alert, row.episode)
        current = self._current
        return None if current is None else (current.id, current.episode)


def untitled_decisions(
    ruleset: Ruleset,
    payload: Mapping[str, Any],
    untitled: dict[Any, list[Decision]] | None = None,
) -> list[Decision]:
    """Ruleset.route() without the titles and bodies, which a backtest never reads: the
    same rules match in the same order, and a throttle key is rendered as route() does
    (it decides what is throttled). A template that fails goes unnoticed (texts=True
    renders everything, and counts the fallbacks). untitled: the decisions of each rule
    without a throttle by its name, made once (they are the same for every event), and of
    a throttled rule by (name, key); pass the same dict for every event of a replay."""
    decisions: list[Decision] = []
    if untitled is None:
        untitled = {}
    for rule in ruleset.matching(payload):
        if rule.throttle_every is not None:
            # The same for every event of the same key: made once a key (while not too many).
            rendered = rule.render_key(payload)
            keyed = (rule.name, rendered.throttle_key)
            if (made := untitled.get(keyed)) is None:
                made = rule.decisions(rendered, ruleset.notifiers)
                if len(untitled) < MAX_KEYED:
                    untitled[keyed] = made
            decisions.extend(made)
        else:
            if (made := untitled.get(rule.name)) is None:
                made = untitled[rule.name] = rule.decisions(UNTITLED, ruleset.notifiers)
            decisions.extend(made)
        if not rule.continue_:
            break
    return decisions


def route_all(
    backtests: Sequence[Backtest],
    event_id: str,
    received_at: float,
    body: str | bytes,
    payload: Mapping[str, Any],
) -> None:
    """Route one event through every backtest of a period at the time it arrived: first
    each one's timers due by then, then the event applied to its alert once (by the first,
    the leader, whose store the others follow), then each rules file's notifications."""
    for backtest in backtests:
        backtest.arrive(received_at)
    leader = backtests[0]
    transition = apply(leader.tx, payload, event_id, received_at)
    if transition.what == "open":
        # Only an episode's opening event is read back (tx.events.body: repeats, resolved
        # messages and escalations quote the opener), and an update a silence held or that
        # started a waiting chain again (below): so only those are kept.
        text = body if isinstance(body, str) else body.decode()
        leader.tx.scratch.put(StoredEvent(event_id, str(payload.get("type")), text, received_at))
        leader.tx.events.mark_routed([event_id], received_at)
    for backtest in backtests:
        backtest.place(event_id, received_at, payload, transition)
    if transition.what == "open":
        leader.kept(event_id, payload, transition, backtests)
    elif transition.what == "update" and transition.alert is not None:
        alert = transition.alert
        if any(b.tx.scratch.waits_on(alert, event_id) for b in backtests):
            text = body if isinstance(body, str) else body.decode()
            kept = StoredEvent(event_id, str(payload.get("type")), text, received_at)
            leader.waited_on(kept, alert)
