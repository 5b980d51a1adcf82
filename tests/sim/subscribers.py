"""Failing subscribers in the simulation: webhook subscriptions (POST /v1/webhooks) whose
endpoint fails for a while, answers 500 or 410 Gone, and comes back.

A seed with subscribers (drawn from a stream of its own, so its other draws stay what
they were) registers them before its first operation; each has outages, spans of virtual
time its endpoint answers 500 (or 410) in, and an "enable" operation after an outage
brings a disabled one back (POST /v1/webhooks/:id/enable: a test delivery, then
store.webhooks.enable). Its rules files gain a rule for the health events
(webhook.failing, webhook.disabled, webhook.recovered), routed through them like any
event.

The runner sends a subscriber's delivery through the receiver's own channel
(receiver.notify.webhook.WebhookChannel: health, its circuit breaker, 410 disabling) with
only its POST replaced by the outage schedule, and records the outcome as the notify
worker does. Its retries follow a fixed list without jitter (Delays moves each delay at
random), and each health event's id is drawn from what it tells (the receiver's has a
random part), so a seed's trace stays the same run after run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import yaml

from receiver.dispatch.fanout import matches
from receiver.notify import health
from receiver.notify.backoff import MAX_RETRY_AFTER, Delays
from receiver.notify.health import Outcome
from receiver.notify.webhook import WebhookChannel
from receiver.store.records import Attempt, OutboxRow, Webhook
from receiver.store.webhook_health import HEALTH_EVENTS, HealthPolicy
from tests.sim.violation import Violation

if TYPE_CHECKING:
    from tests.sim.generate import Op
    from tests.sim.run import Run

# The subscribers' retries (RECEIVER_WEBHOOK_SCHEDULE's form): short enough that a row
# goes dead within a scenario when its subscriber stays down.
SCHEDULE = (10.0, 60.0, 300.0, 900.0, 1800.0)
HOOK_RULE = "hooks"  # the rule each file gains for the health events


class Steady(Delays):
    """The subscribers' schedule without its jitter (the simulation's runs repeat)."""

    def after(self, attempts: int, now: float, retry_after: float | None) -> float | None:
        if attempts > len(self.delays):
            return None
        return now + max(self.delays[attempts - 1], min(retry_after or 0.0, MAX_RETRY_AFTER))


# -- drawing ----------------------------------------------------------------------------------


def draw(seed: int, ops: list[Op], rules: list[str]) -> tuple[list[dict[str, Any]], float]:
    """A seed's subscribers (none in half the seeds) and when failing ones are disabled;
    their "enable" operations go among ops, and each rules file gains a rule for their
    health events (rules changed in place)."""
    from tests.sim.generate import NOTIFIERS, TYPES, USERS, Op

    r = random.Random(f"subscribers:{seed}")
    if r.random() < 0.5 or not ops:
        return [], 0.0
    end = ops[-1].at
    hooks: list[dict[str, Any]] = []
    for i in range(r.randint(1, 2)):
        hook: dict[str, Any] = {"events": r.sample(list(TYPES), r.randint(1, 3)), "outages": []}
        if r.random() < 0.3:
            hook["filter"] = r.choice([{"userId": r.choice(USERS)},
                                       {"meta.context": {"in": ["checkout", "home"]}}])  # fmt: skip
        for _ in range(r.choice([0, 1, 1, 2]) if i else r.choice([1, 1, 2])):
            start = r.uniform(0.0, max(end - 600.0, 0.0))
            stop = start + r.choice([300.0, 1800.0, 4000.0, 9000.0])
            hook["outages"].append([start, stop, "410" if r.random() < 0.2 else "500"])
            if r.random() < 0.7:
                at = min(stop + r.choice([0.0, 60.0, 600.0]), end)
                ops.append(Op(at, "enable", {"hook": i}))
        hooks.append(hook)
    ops.sort(key=lambda o: o.at)  # stable: what was at one instant keeps its order
    for n, text in enumerate(rules):
        doc = yaml.safe_load(text)
        rule: dict[str, Any] = {"name": HOOK_RULE, "match": {"type": "webhook.*"}}
        rule["notify"] = [r.choice(NOTIFIERS)]
        if r.random() < 0.3:
            rule["continue"] = True
        doc["rules"].insert(r.randint(0, len(doc["rules"])), rule)
        rules[n] = yaml.safe_dump(doc, sort_keys=False)
    return hooks, r.choice([1800.0, 3600.0, 7200.0])


def public_id(index: int) -> str:
    return f"wh_sim{index}"


# -- running ----------------------------------------------------------------------------------


def _event(hook: Webhook, change: str, owner: str | None, now: float) -> tuple[str, dict[str, Any]]:
    """receiver.notify.health.health_event with an id drawn from what it tells."""
    _, body = _REAL_EVENT(hook, change, owner, now)
    tag = hashlib.sha256(f"{change} {hook.public_id} {now:.6f}".encode()).hexdigest()[:12]
    body["id"] = f"{change}:{hook.public_id}:{tag}"
    return body["id"], body


_REAL_EVENT = health.health_event


@contextlib.contextmanager
def steady_ids() -> Iterator[None]:
    """Health events with ids that repeat run after run (see _event)."""
    health.health_event = _event  # type: ignore[assignment]
    try:
        yield
    finally:
        health.health_event = _REAL_EVENT  # type: ignore[assignment]


class Subscribers:
    """A run's subscribers: registered at its start, sent to through the receiver's
    channel, the changes of their health as the runner saw them (for the invariants)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.specs: list[dict[str, Any]] = run.scenario.subscribers
        self.channel: WebhookChannel | None = None
        self.ids: dict[int, int] = {}  # store id -> index in specs
        # What the runner saw: (hook index, change) in order; and (moment, hook index,
        # active) each time a subscription's status changed (run.seen.tick()).
        self.changes: list[tuple[int, str]] = []
        self.status: list[tuple[int, int, bool]] = []

    async def open(self) -> None:
        """Register the subscribers (once: a crash keeps them) and a fresh channel."""
        store = self.run.store
        if not self.specs or store is None:
            return
        policy = HealthPolicy(failing_after=3600.0, disable_after=self.run.scenario.disable_after)
        channel = WebhookChannel(store, clock=lambda: self.run.now, health=policy)
        channel.schedule = Steady(SCHEDULE)
        channel._ssl = object()  # type: ignore[assignment]  # no connection is made
        channel.post = self._post  # type: ignore[method-assign]
        self.channel = channel
        for i, spec in enumerate(self.specs):
            hook = await store.webhooks.get(public_id(i))
            if hook is None:
                hook = await store.webhooks.add(
                    public_id=public_id(i), url=f"https://sub{i}.example/hook",
                    events=list(spec["events"]), threshold=None, format="standard",
                    secret="whsec_" + "c2ltdWxhdGlvbg==", now=self.run.now,
                    filter=spec.get("filter"),
                )  # fmt: skip
                assert hook is not None
                self.status.append((self.run.seen.tick(), i, True))
            self.ids[hook.id] = i

    def news(self) -> int:
        """The health events stored since the last look, taken as accepted events (their
        bodies, for the invariants); how many."""
        if not self.specs:
            return 0
        bodies = self.run.seen.bodies
        fresh = [
            (eid, body)
            for eid, body in self.run.query(
                "SELECT id, body FROM events WHERE type IN (?, ?, ?) ORDER BY received_at, id",
                HEALTH_EVENTS,
            )
            if eid not in bodies
        ]
        for eid, body in fresh:
            bodies[eid] = json.loads(body)
        return len(fresh)

    def answer(self, index: int) -> str:
        """What subscriber index answers now: 204, or its outage's 500 or 410."""
        start = self.run.scenario.start
        for begin, end, status in self.specs[index]["outages"]:
            if start + begin <= self.run.now < start + end:
                return str(status)
        return "204"

    async def _post(self, sub: Webhook, row: OutboxRow) -> Outcome:
        status = int(self.answer(self.ids[sub.id]))
        if status < 300:
            return Outcome(True, status=status, excerpt="")
        reason = "Gone" if status == 410 else "Internal Server Error"
        return Outcome(False, f"HTTP {status} {reason}", status=status, excerpt="")

    async def send(self, row: OutboxRow) -> str:
        """One delivery through the channel, its outcome recorded as the notify worker
        does (mark_delivered, or mark_failed with the schedule's retry or dead)."""
        run, store, channel = self.run, self.run.store, self.channel
        assert store is not None and channel is not None
        index = self.ids.get(row.target)
        before = await store.webhooks.get(public_id(index)) if index is not None else None
        channel.forget()  # read the subscriptions now (their cache runs on real time)
        result = await channel.send(row)
        if index is not None and before is not None:
            after = await store.webhooks.get(public_id(index))
            assert after is not None
            self._saw(index, before, after)
        attempt = Attempt(run.now, 0, result.status, result.error)
        if result.outcome == "delivered":
            await store.outbox.mark_delivered(row.id, now=run.now, attempt=attempt)
            run.seen.delivered.setdefault(row.id, run.now)
            return "delivered"
        retry_at = None
        if result.outcome == "retry":
            retry_at = channel.schedule.retry_at(row, run.now, result.retry_after)
        error = result.error or "failed"
        await store.outbox.mark_failed(
            row.id, error=error, now=run.now, retry_at=retry_at, attempt=attempt
        )
        run.seen.failed.setdefault(row.id, []).append(run.now)
        if retry_at is None:
            run.seen.died.setdefault(row.id, []).append(run.seen.tick())
            return f"dead ({error})"
        return f"retry at {retry_at - run.scenario.start:.3f} ({error})"

    def _saw(self, index: int, before: Webhook, after: Webhook) -> None:
        if after.health != before.health:
            change = {"failing": "webhook.failing", "disabled": "webhook.disabled"}.get(
                after.health, "webhook.recovered"
            )
            self.changes.append((index, change))
            self.run.trace.append(f"  subscriber {public_id(index)} {change}")
        if after.status != before.status:
            self.status.append((self.run.seen.tick(), index, after.status == "active"))

    async def enable(self, index: int) -> str:
        """POST /v1/webhooks/:id/enable: a test delivery now; re-enabled if it succeeds."""
        store = self.run.store
        if store is None or index >= len(self.specs):
            return "no such subscriber"
        answer = self.answer(index)
        if answer != "204":
            return f"test delivery answered {answer}: stays as it is"
        now = self.run.now
        hook = await store.webhooks.enable(
            public_id(index), now=now, make_event=lambda h, c, o: _event(h, c, o, now)
        )
        if hook is None:
            return "not disabled"
        self.changes.append((index, "webhook.recovered"))
        self.status.append((self.run.seen.tick(), index, True))
        return "enabled"


# -- the invariants ---------------------------------------------------------------------------


def health_told_once(run: Run) -> None:
    """Each change of a subscriber's health is exactly one event.

    (webhook.failing, webhook.disabled, webhook.recovered: as many stored, in the order
    the changes came, each naming its subscriber and the health it tells of.)"""
    told: dict[str, list[str]] = {}
    for eid, body in run.query(
        "SELECT id, body FROM events WHERE type IN (?, ?, ?) ORDER BY received_at, id",
        HEALTH_EVENTS,
    ):
        fields = json.loads(body)
        implied = {"webhook.failing": "failing", "webhook.disabled": "disabled"}.get(
            fields["type"], "healthy"
        )
        if fields.get("health") != implied:
            raise Violation("health is told once", f"event {eid} tells of {fields.get('health')}")
        told.setdefault(fields["webhookId"], []).append(fields["type"])
    for index in range(len(run.subscribers.specs)):
        saw = [c for i, c in run.subscribers.changes if i == index]
        stored = told.get(public_id(index), [])
        if saw != stored:
            raise Violation(
                "health is told once",
                f"subscriber {public_id(index)} changed {saw}, its events say {stored}",
            )


def _active_at(run: Run, index: int, moment: int) -> bool:
    active = False
    for at, i, now_active in run.subscribers.status:
        if i == index and at < moment:
            active = now_active
    return active


def subscribers_lose_nothing(run: Run) -> None:
    """Nothing a subscriber matched vanishes: delivered, pending, or dead with its reason.

    (Each event of its types and filter routed while it was active has its delivery;
    one given up on, or cancelled when its subscriber was disabled, says why.)"""
    subs = run.subscribers
    if not subs.specs:
        return
    rows: dict[tuple[str, int], tuple[str, str | None]] = {}
    for eid, target, state, reason, error in run.query(
        "SELECT event_id, target, state, reason, last_error FROM outbox WHERE kind = 'webhook'"
    ):
        rows[(eid, int(target))] = (state, reason or error)
    by_index = {i: hook_id for hook_id, i in subs.ids.items()}
    for eid, moment in run.seen.routed_seq.items():
        body = run.seen.bodies.get(eid)
        if body is None:
            continue
        for index, spec in enumerate(subs.specs):
            if body.get("type") not in spec["events"] or not matches(spec.get("filter") or {},
                                                                     body):  # fmt: skip
                continue
            if not _active_at(run, index, moment):
                continue
            found = rows.get((eid, by_index[index]))
            if found is None:
                raise Violation(
                    "subscribers lose nothing", f"event {eid} matched {public_id(index)}: no row"
                )
            state, why = found
            if state in ("dead", "cancelled") and not why:
                raise Violation(
                    "subscribers lose nothing",
                    f"event {eid} to {public_id(index)} is {state} and says not why",
                )


CHECKS = (health_told_once, subscribers_lose_nothing)
