"""The boundaries of maintenance windows, on the timers: a window's start and end are each
claimed once in the store (tx.maintenance), whichever replica gets there first, and only
that claim says so to the window's `notify:` targets; an end claimed wakes at once what the
window held (escalations.wake, as an ended silence does). What a window holds is decided
where silences are (Pipeline._state, inhibition.suppression)."""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime

from receiver.rules import Ruleset
from receiver.rules.maintenance import Window, next_boundary
from receiver.store.base import Tx
from receiver.store.records import Notification

log = logging.getLogger("receiver.lifecycle")

Span = tuple[float, float]

RULE = "(maintenance)"  # the rule and alert of a notice's rows
KIND = "maintenance"  # their outbox kind
# How far back an end is still said and woken after a stop: a receiver down over a window's
# end says so when it is back, within a day; later it only wakes (WAKE_EVERY's look).
LOOKBACK = 86400.0
# Claims of stretches that started longer ago are dropped when an end is claimed: the
# table keeps a few rows a window.
KEEP = 60 * 86400.0


# Each window's stretches near the clock when last worked out, and until when they hold
# (its next boundary, or a day on when none lies within 8 days): the timers look every
# turn, and working the stretches out reads 8 days of local times.
_near: weakref.WeakKeyDictionary[Window, tuple[float, float, float | None, list[Span]]] = (
    weakref.WeakKeyDictionary()
)


def _stretches(window: Window, now: float) -> tuple[list[Span], float | None]:
    """window.spans(now - LOOKBACK, now + 1) and the window's next boundary after now,
    worked out again only once the clock passed the boundary found last time: until then
    no stretch starts or ends, and the ones that end LOOKBACK before now drop out."""
    cached = _near.get(window)
    if cached is None or not cached[0] <= now < cached[1]:
        found = next_boundary((window,), now)
        holds = now + 86400.0 if found is None else found
        cached = _near[window] = (now, holds, found, window.spans(now - LOOKBACK, now + 1))
    return [s for s in cached[3] if s[1] > now - LOOKBACK], cached[2]


def boundaries(
    tx: Tx, ruleset: Ruleset, now: float, counts: Counter[str]
) -> tuple[bool, float | None]:
    """Claim the start of each window in force and the end of each that ended within
    LOOKBACK and whose start was claimed; send each claimed one's notices. Whether an end
    was claimed (what the window held is to be woken now), and the next boundary (the
    timers wake then)."""
    ended = False
    upcoming: list[float] = []
    for window in ruleset.maintenance:
        spans, following = _stretches(window, now)
        if following is not None:
            upcoming.append(following)
        for start, end in spans:
            if start <= now < end and tx.maintenance.claim(window.name, start, "start", now):
                log.info("maintenance %s started", window.name)
                _notices(tx, ruleset, window, now, "started", start, end, counts)
            elif end <= now and tx.maintenance.claimed(window.name, start, "start"):
                if tx.maintenance.claim(window.name, start, "end", now):
                    log.info("maintenance %s ended", window.name)
                    _notices(tx, ruleset, window, now, "ended", start, end, counts)
                    ended = True
    if ended:
        tx.maintenance.forget(now - KEEP)
    return ended, min(upcoming, default=None)


def _notices(
    tx: Tx,
    ruleset: Ruleset,
    window: Window,
    now: float,
    what: str,
    start: float,
    end: float,
    counts: Counter[str],
) -> None:
    title = f"Maintenance {window.name} {what}"
    body = (
        f"Maintenance window {window.name} {what}: {_clock(window, start)} to"
        f" {_clock(window, end)}."
        + (
            " Notifications of the events it matches are held until it ends."
            if what == "started"
            else " What it held that is still open is notified now."
        )
    )
    _send(tx, ruleset, now, window.notify, title, body)
    counts["maintenance_notice"] += 1


def _send(
    tx: Tx, ruleset: Ruleset, now: float, names: Sequence[str], title: str, body: str
) -> None:
    for name in dict.fromkeys(ruleset.target(n, now) for n in names):
        for target in range(len(ruleset.notifiers[name].urls)):
            n = Notification(RULE, name, target, title, body, channel=ruleset.channel(name, target))
            tx.outbox.add("-", n, state="pending", now=now, kind=KIND, alert=RULE)


def _clock(window: Window, at: float) -> str:
    local = datetime.fromtimestamp(at, window.tz).strftime("%Y-%m-%d %H:%M %Z")
    return f"{local} ({datetime.fromtimestamp(at, UTC):%H:%MZ})"
