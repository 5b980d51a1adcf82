"""The `receiver` command: serve, init, sign, send, check, explain, deliveries, retry, replay,
alerts, silence, db, keys, webhooks, upstream, simulate, backtest, report, oncall, slack. One
module per group of commands; this one gathers them."""

from __future__ import annotations

import importlib
from typing import Any

import click

from receiver import __version__

# Each command: the module under receiver/cli/ that defines it, and the first line of its
# help as `receiver --help` lists it. A command's module is imported only when the command
# runs (or its own --help is asked for), so the store, the rules and the channels it needs
# load for it alone, and `receiver --help` loads none of them. tests/cli/test_cli.py checks
# each line against the command's own help.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve", "Serve the whole receiver on one port."),
    "init": ("rules", "Write a commented starter rules file to PATH (default ./rules.yaml)."),
    "sign": ("send", "Print the X-Service-Signature header for the body in FILE (default: stdin)."),
    "send": ("send", "Sign a sample event and POST it; print the status and the answer."),
    "check": (
        "rules",
        "Validate a rules file with the server's own loader; exit 1 on any problem.",
    ),
    "explain": ("rules", "Show what the rules would do with an event, without sending anything."),
    "deliveries": (
        "outbox",
        "List recent notifications (chat, email, subscriber webhooks), newest first.",
    ),
    "retry": (
        "outbox",
        "Send a failed notification again (its id from `receiver deliveries`), or all of them.",
    ),
    "replay": (
        "outbox",
        "Route a stored event again through the current rules: it notifies again.",
    ),
    "alerts": (
        "alerts",
        "List the alerts open now: sessions whose attention dropped, interventions not resolved.",
    ),
    "silence": ("alerts", "Silence notifications for events that match, for a while."),
    "db": (
        "db",
        "The database: bring its schema up to date, or move a SQLite store to PostgreSQL.",
    ),
    "keys": ("keys", "API keys for the /v1 read API (Authorization: Bearer <key>)."),
    "webhooks": (
        "webhooks",
        "Forward events to subscribers: signed POSTs with the service's retry schedule.",
    ),
    "upstream": (
        "upstream",
        "The upstream service: register this receiver there, check the key, backfill sessions.",
    ),
    "simulate": (
        "simulate",
        "Behave like the Attention Scoring Service towards a receiver: signed events, retries.",
    ),
    "backtest": (
        "history",
        "Replay the stored events of a period through NEW_RULES, sending nothing.",
    ),
    "report": ("history", "The noise report: what the notifications of a period were."),
    "oncall": (
        "oncall",
        "Who is on call in SCHEDULE (default: every schedule in the rules) now or --at "
        "TIME, and the next handoffs, in the schedule's own timezone.",
    ),
    "slack": ("slack", "The Slack app channel (slack-app:// notifiers, buttons that answer back)."),
    "maintenance": (
        "maintenance",
        "List the next maintenance windows of the rules (or of window NAME).",
    ),
}

__all__ = ["COMMANDS", "cli", "server_config"]


def __getattr__(name: str) -> Any:
    """receiver.cli.server_config (bench/ runs the app as `receiver serve` would), imported
    when asked for."""
    if name == "server_config":
        from receiver.cli._server import server_config

        return server_config
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class LazyGroup(click.Group):
    """A group that imports a command's module when the command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module = importlib.import_module(f"receiver.cli.{COMMANDS[cmd_name][0]}")
            self.add_command(getattr(module, cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        # Listed as click lists a loaded command, from the help line alone.
        shown = {name: click.Command(name, help=help) for name, (_, help) in COMMANDS.items()}
        rows = [
            (name, {**shown, **self.commands}[name].get_short_help_str(limit)) for name in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="attention-receiver")
def cli() -> None:
    """attention-receiver: verify, keep and route the Attention Scoring Service's webhooks.

    Example:

        receiver serve                      # 127.0.0.1:4000, SQLite in ./data
        receiver init                       # write a starter rules.yaml to edit
        receiver send --type score.drop     # sign a sample event and POST it
    """
