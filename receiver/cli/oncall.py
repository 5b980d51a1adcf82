"""`receiver oncall`: who of a rules.yaml schedule is on call, and the next handoffs."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import click

from receiver.cli._common import echo, echo_lines, load_rules, no_env_option, rules_option
from receiver.cli.history import parse_time
from receiver.rules.schedules import Schedule, handoffs, who

NEXT = 3  # handoffs shown after who is on call


@click.command()
@click.argument("schedule", required=False)
@click.option(
    "--at",
    "at_text",
    metavar="TIME",
    help="When to ask about: ISO 8601 (UTC unless it says otherwise) or epoch seconds "
    "[default: now].",
)
@click.option("-n", "count", type=click.IntRange(0, 100), default=NEXT, show_default=True,
              help="How many handoffs to list.")  # fmt: skip
@rules_option
@no_env_option
def oncall(
    schedule: str | None, at_text: str | None, count: int, rules_path: Path | None, no_env: bool
) -> None:
    """Who is on call in SCHEDULE (default: every schedule in the rules) now or --at TIME,
    and the next handoffs, in the schedule's own timezone. Overrides count.

    Example:

    \b
        receiver oncall
        receiver oncall primary --at 2026-12-24T10:00+01:00
    """
    ruleset = load_rules(rules_path, no_env=no_env)
    at = time.time() if at_text is None else parse_time(at_text)
    if schedule is not None and schedule not in ruleset.schedules:
        defined = ", ".join(ruleset.schedules) or "(none)"
        raise click.ClickException(
            f'unknown schedule "{schedule}" in {ruleset.source}; defined: {defined}'
        )
    chosen = [ruleset.schedules[schedule]] if schedule else list(ruleset.schedules.values())
    if not chosen:
        echo(f"{ruleset.source}: no schedules")
        return
    for index, item in enumerate(chosen):
        if index:
            echo()
        try:
            lines = _report(item, at, count)
        except OverflowError:  # the local time or a handoff past year 9999 (or before year 1)
            raise click.ClickException(
                f'--at {at_text}: in schedule "{item.name}" ({item.zone.key}) that time or its '
                "next handoffs fall outside the years a date can show (1 to 9999)"
            ) from None
        echo_lines(lines)


def _report(schedule: Schedule, at: float, count: int) -> list[str]:
    moment = datetime.fromtimestamp(at, schedule.zone)
    lines = [
        f"{schedule.name} ({schedule.rotation} at {schedule.handoff}, {schedule.zone.key}): "
        f"{who(schedule, at)} on call at {_when(moment)}"
    ]
    upcoming = handoffs(schedule, at, count)
    lines.extend(f"  {_when(h.at)}  -> {h.member}" for h in upcoming)
    if count and not upcoming:
        lines.append("  no handoff ahead (one member)")
    return lines


def _when(moment: datetime) -> str:
    return moment.strftime("%a %Y-%m-%d %H:%M %Z")
