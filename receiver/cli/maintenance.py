"""`receiver maintenance`: the next stretches of the rules.yaml maintenance windows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from receiver.cli._common import echo, load_rules, no_env_option, rules_option
from receiver.cli.history import parse_time
from receiver.rules.maintenance import describe

NEXT = 5  # stretches listed


@click.command()
@click.argument("name", required=False)
@click.option(
    "--at",
    "at_text",
    metavar="TIME",
    help="List from this time: ISO 8601 (UTC unless it says otherwise) or epoch seconds "
    "[default: now].",
)
@click.option("-n", "count", type=click.IntRange(1, 100), default=NEXT, show_default=True,
              help="How many stretches to list, soonest first, over every window.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@rules_option
@no_env_option
def maintenance(
    name: str | None, at_text: str | None, count: int, as_json: bool,
    rules_path: Path | None, no_env: bool,
) -> None:  # fmt: skip
    """List the next maintenance windows of the rules (or of window NAME).

    From now or --at TIME: each one's name, and its start and end in its own timezone and
    in UTC. A window in force at TIME is listed first.

    Example:

    \b
        receiver maintenance
        receiver maintenance weekly-deploy --at 2026-12-24T10:00+01:00 -n 3
    """
    ruleset = load_rules(rules_path, no_env=no_env)
    at = time.time() if at_text is None else parse_time(at_text)
    windows = list(ruleset.maintenance)
    if name is not None:
        windows = [w for w in windows if w.name == name]
        if not windows:
            defined = ", ".join(w.name for w in ruleset.maintenance) or "(none)"
            raise click.ClickException(
                f'unknown maintenance window "{name}" in {ruleset.source}; defined: {defined}'
            )
    if not windows:
        echo(f"{ruleset.source}: no maintenance windows")
        return
    try:
        found = sorted(
            (start, end, window) for window in windows for start, end in window.upcoming(at, count)
        )[:count]
    except (OverflowError, ValueError):
        raise click.ClickException(
            f"--at {at_text}: the windows from then fall outside the years a date can show"
        ) from None
    if not found:
        echo("no maintenance window ahead")
    for start, end, window in found:
        row = describe(window, start, end)
        if as_json:
            echo(json.dumps({**row, "timezone": window.tz.key}))
        else:
            echo(
                f"{row['name']}  {row['start']} - {row['end']}"
                f"  ({row['start_utc']} - {row['end_utc']})"
            )
