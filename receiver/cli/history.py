"""`receiver backtest` and `receiver report`: what a rules file would have done with last
week's events, and what the notifications of last week were."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from receiver import rules
from receiver.backtest import parallel
from receiver.backtest import replay as bt
from receiver.backtest import report as noise
from receiver.backtest.period import run as run_period
from receiver.cli._common import (
    db_option,
    echo,
    echo_lines,
    env_notes,
    load_rules,
    no_env_option,
    with_store,
)
from receiver.durations import MAX_SPAN, parse_duration
from receiver.store import Store

SHOWN = 20  # alerts listed as missed or added


def parse_time(text: str) -> float:
    """Epoch seconds from ISO 8601 ("2026-11-17", "2026-11-17T09:00Z"; UTC unless it says
    otherwise) or a number of epoch seconds."""
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(
                f"{text!r} is not a time; give ISO 8601 (2026-11-17T09:00Z) or epoch seconds"
            ) from None
        value = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    try:  # the report prints it as a date: a time no date can show is refused here
        datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        raise click.BadParameter(
            f"{text!r} is not a time a date can show (years 1 to 9999)"
        ) from None
    return value


def period(since: str, start: str | None, end: str | None) -> tuple[float, float]:
    """[start, end) from --from/--to, else the last --since up to now."""
    now = time.time()
    try:
        back = parse_duration(since, limit=MAX_SPAN)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    until = parse_time(end) if end else now
    begin = parse_time(start) if start else until - back
    if begin >= until:
        raise click.BadParameter("the period is empty: --from must be before --to")
    return begin, until


def utc(ts: float, fmt: str = "%Y-%m-%d %H:%M UTC") -> str:
    return datetime.fromtimestamp(ts, UTC).strftime(fmt)


period_options = [
    click.option(
        "--since",
        default="7d",
        show_default=True,
        help="How far back from now (or from --to): 90m, 24h, 7d.",
    ),
    click.option("--from", "start", help="Start of the period (ISO 8601 or epoch seconds)."),
    click.option("--to", "end", help="End of the period (default: now)."),
]


def with_period(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(period_options):
        fn = option(fn)
    return fn


# -- receiver backtest ----------------------------------------------------------------------


@click.command()
@click.argument("new_rules", type=click.Path(path_type=Path, dir_okay=False))
@with_period
@click.option(
    "--against",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="RECEIVER_RULES",
    help="The rules to compare with [RECEIVER_RULES, else ./rules.yaml if it exists, else the"
    " built-in rules: what `receiver serve` runs].",
)
@db_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of tables.")
@click.option(
    "--render",
    is_flag=True,
    help="Render every title and body too, and count the templates that fail (slower; the"
    " counts are the same without: a failed template still sends its fallback).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    help="Processes to replay in: the two rules files each in its own (the default where"
    " this may use two cores or more), or 1 for both in one process (the same report).",
)
@no_env_option
def backtest(
    new_rules: Path,
    since: str,
    start: str | None,
    end: str | None,
    against: Path | None,
    db: str,
    as_json: bool,
    render: bool,
    jobs: int | None,
    no_env: bool,
) -> None:
    """Replay the stored events of a period through NEW_RULES, sending nothing.

    Each event goes through the whole pipeline (matching, throttles, silences,
    hold, digests, repeats, active windows, resolved messages, the heartbeat) at
    the time it arrived, on a scratch copy in memory with a virtual clock; the
    database is only read. Prints, per rule and per notifier, the notifications
    that would have been sent, those suppressed and why, the busiest hour and
    the alerts notified about, beside the same for the rules the server runs now
    (--against), and the alerts one would have notified about and the other not.

    Example:

    \b
        receiver backtest rules.new.yaml                 # the last 7 days
        receiver backtest rules.new.yaml --from 2026-11-16 --to 2026-11-23
        receiver backtest rules.new.yaml --since 24h --against rules.yaml --json
    """
    start_at, end_at = period(since, start, end)
    candidate = load_rules(new_rules, no_env=no_env)
    current = load_rules(against, no_env=no_env)
    notes = env_notes(candidate, no_env=no_env) + env_notes(current, no_env=no_env)

    def replay(rulesets: list[rules.Ruleset], *, shown: bool) -> tuple[list[bt.Result], float]:
        async def go(store: Store) -> tuple[list[bt.Result], float]:
            with _Progress(quiet=as_json or not shown) as progress:
                counting = None
                if progress.shown:  # the bar's length, counted beside the replay (a week: 5 s)
                    counting = asyncio.ensure_future(store.history.count_between(start_at, end_at))
                    counting.add_done_callback(progress.total_from)
                try:
                    return await run_period(
                        store,
                        rulesets,
                        start=start_at,
                        end=end_at,
                        progress=progress.advance,
                        texts=render,
                    )
                finally:
                    if counting is not None:
                        await asyncio.wait([counting])  # not left running as the store closes

        return with_store(db, go)

    # The current rules in a process of their own; from a process with other threads
    # running (a program calling this one), both in this process: the same report.
    if (jobs or parallel.cores()) >= 2 and parallel.can_fork():
        beside = parallel.Forked(lambda: replay([current], shown=False))
        try:
            (cand,), took = replay([candidate], shown=True)
            (cur,), took_beside = beside.result()
        finally:
            beside.cancel()  # gone already, unless this process failed first
        took = max(took, took_beside)
    else:
        (cand, cur), took = replay([candidate, current], shown=True)
    diff = bt.compare(cand, cur, shown=SHOWN)
    if as_json:
        click.echo(json.dumps(_backtest_json(diff, took), indent=2))  # JSON escapes
    else:
        echo_lines(_backtest_text(diff, took))
    for note in dict.fromkeys(notes):
        echo(note, err=True)


class _Progress:
    """A progress bar on stderr while events are replayed (a terminal only); its length
    is set when the count of the period's events arrives."""

    def __init__(self, *, quiet: bool) -> None:
        self.bar: Any = None
        self._task: Any = None
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(console=Console(stderr=True), transient=True)

    @property
    def shown(self) -> bool:
        return self.bar is not None

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
            self._task = self.bar.add_task("replaying events", total=None)
        return self

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.advance(self._task, n)

    def total_from(self, counted: asyncio.Future[int]) -> None:
        if self.bar is not None and not counted.cancelled() and counted.exception() is None:
            self.bar.update(self._task, total=counted.result())

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _busiest(tally: bt.Tally | None) -> str:
    found = tally.busiest() if tally is not None else None
    return "-" if found is None else f"{utc(found[0], '%m-%d %H:00')} ({found[1]:,})"


def _suppressed(tally: bt.Tally | None) -> str:
    if tally is None or not tally.suppressed:
        return "-"
    return ", ".join(f"{reason} {n:,}" for reason, n in sorted(tally.suppressed.items()))


def _count(tally: bt.Tally | None, what: Callable[[bt.Tally], int]) -> str:
    return "-" if tally is None else f"{what(tally):,}"


def _side_by_side(title: str, cand: dict[str, bt.Tally], cur: dict[str, bt.Tally]) -> list[str]:
    """One row per name: sent by each ruleset and the difference, then the candidate's
    suppressions, notifications still held at the end, alerts and busiest hour."""
    header = [title, "sent new", "sent now", "diff", "alerts new", "alerts now", "held new"]
    header += ["busiest hour (new)", "suppressed (new)"]
    rows = []
    for name in sorted(set(cand) | set(cur)):
        c, n = cand.get(name), cur.get(name)
        change = (c.sent if c else 0) - (n.sent if n else 0)
        rows.append(
            [
                name,
                _count(c, lambda t: t.sent),
                _count(n, lambda t: t.sent),
                f"{change:+,}",
                _count(c, lambda t: t.alerts),
                _count(n, lambda t: t.alerts),
                _count(c, lambda t: t.held),
                _busiest(c),
                _suppressed(c),
            ]
        )
    return noise.table(header, rows)


def _paged_lines(title: str, paged: list[bt.Paged], total: int) -> list[str]:
    if not paged:
        return [f"{title}: none"]
    more = f" (first {SHOWN})" if total > SHOWN else ""
    lines = [f"{title}: {total:,}{more}"]
    rows = [
        [utc(p.at, "%Y-%m-%d %H:%M:%S"), p.alert, f"#{p.episode}", p.session or "-", p.user or "-"]
        for p in paged[:SHOWN]
    ]
    return lines + noise.table(["first notified", "alert", "episode", "session", "user"], rows)


def _backtest_text(diff: bt.Comparison, took: float) -> list[str]:
    cand, cur = diff.candidate, diff.current
    rate = f", {cand.events / took:,.0f} events/s" if took > 0 and cand.events else ""
    lines = [
        f"backtest of {cand.source} (new) against {cur.source} (now)",
        f"period {utc(cand.start)} .. {utc(cand.end)}: {cand.events:,} events, replayed in"
        f" {took:.1f} s{rate}",
        f"alerts opened: {cand.alerts_opened:,}; notifications sent: new {cand.sent:,},"
        f" now {cur.sent:,} ({cand.sent - cur.sent:+,})",
        "",
        *_side_by_side("rule", cand.rules, cur.rules),
        "",
        *_side_by_side("notifier", cand.notifiers, cur.notifiers),
        "",
        *_paged_lines("alerts the new rules would have missed", diff.missed, diff.missed_count),
        "",
        *_paged_lines("alerts only the new rules notify about", diff.added, diff.added_count),
    ]
    if cand.steps:
        lines += ["", "escalation steps of the new rules (pages, by whom):"]
        for (policy, step), who in sorted(cand.steps.items()):
            paged = ", ".join(f"{name} {n:,}" for name, n in who.most_common())
            lines.append(f"  {policy} step {step}: {sum(who.values()):,} ({paged})")
    if cand.inhibited:
        lines += ["", "inhibited by the new rules (notifications muted, by inhibition rule):"]
        lines += [f"  {name}: {n:,}" for name, n in sorted(cand.inhibited.items())]
    if cand.flapping or cand.flap_periods:
        lines += ["", _flap_line(cand)]
    if cand.maintenance:
        lines += ["", *_maintenance_lines(cand)]
    if cand.template_failures:
        lines.append(f"template failures (fallback sent): {cand.template_failures:,}")
    return lines


def _flap_line(result: bt.Result) -> str:
    """What flap detection would have saved: "flap: 212 messages held, 31 flapping periods,
    top sessions: sess_1 ×40, ..." (an alert of a session by the session's id)."""
    held, periods = sum(result.flapping.values()), len(result.flap_periods)
    top = ", ".join(
        f"{alert.removeprefix('session:')} ×{n:,}" for alert, n in result.flapping.most_common(5)
    )
    return (
        f"flap: {held:,} message{'s' if held != 1 else ''} held, {periods:,} flapping"
        f" period{'s' if periods != 1 else ''}" + (f", top sessions: {top}" if top else "")
    )


def _maintenance_lines(result: bt.Result) -> list[str]:
    """What the maintenance windows would have held: "weekly-deploy would have held 37
    notifications in the last 28 days", and the first of them."""
    days = max(1, round((result.end - result.start) / 86400))
    lines = [
        f"{name} would have held {n:,} notification{'s' if n != 1 else ''} in the last"
        f" {days:,} day{'s' if days != 1 else ''}"
        for name, n in sorted(result.maintenance.items())
    ]
    rows = [[utc(at, "%Y-%m-%d %H:%M:%S"), name, rule, what] for at, name, rule, what in
            result.maintenance_held[:SHOWN]]  # fmt: skip
    return lines + noise.table(["held at", "window", "rule", "alert"], rows)


def _result_json(result: bt.Result) -> dict[str, Any]:
    def tallies(found: dict[str, bt.Tally]) -> dict[str, Any]:
        return {
            name: {
                "sent": t.sent,
                "suppressed": dict(sorted(t.suppressed.items())),
                "held_at_end": t.held,
                "alerts": t.alerts,
                "busiest_hour": None
                if (b := t.busiest()) is None
                else {"start": utc(b[0], "%Y-%m-%dT%H:00:00Z"), "sent": b[1]},
            }
            for name, t in sorted(found.items())
        }

    return {
        "rules_file": result.source,
        "sent": result.sent,
        "alerts_opened": result.alerts_opened,
        "alerts_notified": len(result.paged),
        "template_failures": result.template_failures,
        "rules": tallies(result.rules),
        "notifiers": tallies(result.notifiers),
        "inhibited": dict(sorted(result.inhibited.items())),
        "flap": {
            "held": sum(result.flapping.values()),
            "periods": len(result.flap_periods),
            "top": dict(result.flapping.most_common(5)),
        },
        "maintenance": {
            "held": dict(sorted(result.maintenance.items())),
            "first": [
                {"at": utc(at, "%Y-%m-%dT%H:%M:%SZ"), "window": name, "rule": rule, "alert": what}
                for at, name, rule, what in result.maintenance_held
            ],
        },
        "escalations": [
            {"policy": policy, "step": step, "pages": dict(who.most_common())}
            for (policy, step), who in sorted(result.steps.items())
        ],
    }


def _paged_json(paged: list[bt.Paged]) -> list[dict[str, Any]]:
    return [
        {
            "alert": p.alert,
            "episode": p.episode,
            "first_notified": utc(p.at, "%Y-%m-%dT%H:%M:%SZ"),
            "session": p.session,
            "user": p.user,
        }
        for p in paged[:SHOWN]
    ]


def _backtest_json(diff: bt.Comparison, took: float) -> dict[str, Any]:
    cand = diff.candidate
    return {
        "from": utc(cand.start, "%Y-%m-%dT%H:%M:%SZ"),
        "to": utc(cand.end, "%Y-%m-%dT%H:%M:%SZ"),
        "events": cand.events,
        "seconds": round(took, 3),
        "candidate": _result_json(cand),
        "current": _result_json(diff.current),
        "missed_count": diff.missed_count,
        "added_count": diff.added_count,
        "missed": _paged_json(diff.missed),
        "added": _paged_json(diff.added),
    }


# -- receiver report ------------------------------------------------------------------------


@click.command()
@with_period
@click.option(
    "--flapping",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="An alert opened more times than this is flapping.",
)
@db_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of tables.")
def report(
    since: str, start: str | None, end: str | None, flapping: int, db: str, as_json: bool
) -> None:
    """The noise report: what the notifications of a period were.

    Notifications per rule, per notifier and per day (sent and suppressed), the
    sessions and users that caused most, flapping alerts, dead notifications per
    target, and the time from an event's arrival to its notification's delivery
    (p50, p99). The same report is the admin page's Report tab.

    Example:

    \b
        receiver report                  # the last 7 days
        receiver report --since 24h --json
    """
    start_at, end_at = period(since, start, end)
    found = with_store(db, lambda store: store.history.noise(start_at, end_at, flapping=flapping))
    if as_json:
        click.echo(json.dumps(noise.as_json(found, flapping), indent=2))  # JSON escapes
    else:
        echo_lines(noise.text(found, flapping))
