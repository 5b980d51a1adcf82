"""The noise report, as `receiver report` prints it and the admin page's Report shows it: one
reading of the store (Store.noise) summed per rule and per notifier, with a bar per day.

    found = await store.history.noise(since, until)
    print("\\n".join(text(found, flapping=3)))
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from receiver.store.records import SENT_STATES, Noise

BAR = 40  # characters of the longest bar in a terminal
WAITING = ("held",)


@dataclass(frozen=True)
class Line:
    """A rule's or a notifier's notifications of the period: sent (or on their way),
    waiting (held), dead, and suppressed by reason."""

    name: str
    sent: int
    waiting: int
    dead: int
    suppressed: dict[str, int]

    @property
    def suppressed_text(self) -> str:
        return ", ".join(f"{k} {v:,}" for k, v in sorted(self.suppressed.items())) or "-"


@dataclass(frozen=True)
class Bar:
    day: float  # its start, epoch seconds (UTC)
    label: str
    count: int
    share: float  # of the longest bar, 0..1


def lines(found: Noise, part: int) -> list[Line]:
    """The outbox counts summed per rule (part 0) or per notifier (part 1)."""
    states: dict[str, Counter[str]] = {}
    for row in found.outbox:
        states.setdefault(str(row[part]), Counter())[row[3]] += row[4]
    result = []
    for name, counts in sorted(states.items()):
        other = {
            s: n for s, n in counts.items() if s not in SENT_STATES + WAITING + ("dead",) and n
        }
        result.append(
            Line(
                name,
                sum(counts[s] for s in SENT_STATES),
                sum(counts[s] for s in WAITING),
                counts["dead"],
                other,
            )
        )
    return result


def days(found: Noise) -> list[Bar]:
    """Notifications sent per UTC day, every day of the period (none: an empty bar)."""
    counts = dict(found.per_day)
    first = found.since - found.since % 86400
    bars: list[tuple[float, int]] = []
    day = first
    while day < found.until and len(bars) < 400:
        bars.append((day, counts.get(day, 0)))
        day += 86400
    top = max((n for _, n in bars), default=0) or 1
    return [
        Bar(d, datetime.fromtimestamp(d, UTC).strftime("%a %m-%d"), n, n / top) for d, n in bars
    ]


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell: the first left-aligned, numbers right."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            numeric = i > 0 and cell.replace(",", "").lstrip("+-").isdigit()
            out.append(cell.rjust(widths[i]) if numeric else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def text(found: Noise, flapping: int) -> list[str]:
    """The whole report for a terminal."""
    out = [
        f"noise report {_when(found.since)} .. {_when(found.until)}: {found.events:,} events",
        "",
    ]
    for title, part in (("rule", 0), ("notifier", 1)):
        rows = [
            [x.name, f"{x.sent:,}", f"{x.waiting:,}", f"{x.dead:,}", x.suppressed_text]
            for x in lines(found, part)
        ]
        out += table([title, "sent", "held", "dead", "suppressed"], rows) if rows else []
        out += [f"no notifications by {title}"] if not rows else []
        out.append("")
    out.append("sent per day (UTC)")
    for bar in days(found):
        out.append(f"  {bar.label}  {'█' * round(bar.share * BAR):<{BAR}}  {bar.count:,}")
    out.append("")
    for title, top in (("session", found.top_sessions), ("user", found.top_users)):
        rows = [[name, f"{n:,}"] for name, n in top]
        out += table([f"top {title}s", "notifications"], rows) if rows else [f"top {title}s: -"]
        out.append("")
    rows = [[alert, f"{n:,}", state] for alert, n, state in found.flapping]
    out += (
        table([f"flapping (opened > {flapping} times)", "opened", "now"], rows)
        if rows
        else [f"flapping alerts (opened > {flapping} times): none"]
    )
    out.append("")
    rows = [[f"{notifier}[{target}]", f"{n:,}"] for notifier, target, n in found.dead]
    out += table(["dead per target", "notifications"], rows) if rows else ["dead: none"]
    out.append("")
    out.append(
        f"event to delivery: p50 {seconds(found.latency.get('p50'))},"
        f" p99 {seconds(found.latency.get('p99'))} ({found.delivered:,} delivered)"
    )
    return out


def as_json(found: Noise, flapping: int) -> dict[str, Any]:
    def part(n: int) -> dict[str, Any]:
        return {
            x.name: {"sent": x.sent, "held": x.waiting, "dead": x.dead, "suppressed": x.suppressed}
            for x in lines(found, n)
        }

    return {
        "from": _when(found.since),
        "to": _when(found.until),
        "events": found.events,
        "rules": part(0),
        "notifiers": part(1),
        "per_day": {
            datetime.fromtimestamp(bar.day, UTC).strftime("%Y-%m-%d"): bar.count
            for bar in days(found)
        },
        "top_sessions": dict(found.top_sessions),
        "top_users": dict(found.top_users),
        "flapping": [
            {"alert": alert, "opened": n, "state": state} for alert, n, state in found.flapping
        ],
        "flapping_over": flapping,
        "dead": [{"notifier": a, "target": t, "count": n} for a, t, n in found.dead],
        "latency_seconds": found.latency,
        "delivered": found.delivered,
    }
