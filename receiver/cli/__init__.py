"""The `receiver` command: serve, init, sign, send, check, explain, deliveries, retry, replay,
alerts, silence, db, keys, webhooks, upstream, simulate, backtest, report, oncall, slack. One
module per group of commands; this one gathers them."""

from __future__ import annotations

import click

from receiver import __version__
from receiver.cli._server import server_config
from receiver.cli.alerts import alerts, silence
from receiver.cli.db import db
from receiver.cli.history import backtest, report
from receiver.cli.keys import keys
from receiver.cli.maintenance import maintenance
from receiver.cli.oncall import oncall
from receiver.cli.outbox import deliveries, replay, retry
from receiver.cli.rules import check, explain, init
from receiver.cli.send import send, sign
from receiver.cli.serve import serve
from receiver.cli.simulate import simulate
from receiver.cli.slack import slack
from receiver.cli.upstream import upstream
from receiver.cli.webhooks import webhooks

__all__ = ["cli", "serve", "server_config"]


@click.group()
@click.version_option(__version__, prog_name="attention-receiver")
def cli() -> None:
    """attention-receiver: verify, keep and route the Attention Scoring Service's webhooks.

    Example:

        receiver serve                      # 127.0.0.1:4000, SQLite in ./data
        receiver init                       # write a starter rules.yaml to edit
        receiver send --type score.drop     # sign a sample event and POST it
    """


for command in (
    serve, init, sign, send, check, explain, deliveries, retry, replay, alerts, silence, db,
    keys, webhooks, upstream, simulate, backtest, report, oncall, slack, maintenance,
):  # fmt: skip
    cli.add_command(command)
