"""`receiver simulate`: the sender (receiver.simulator.sender) towards a receiver URL,
with a progress line and a summary; or, with --serve-api, the fake upstream
(receiver.simulator.serve)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import click

from receiver.settings import signing_secret
from receiver.simulator.sender import (
    Options,
    Simulation,
    Summary,
)
from receiver.simulator.walk import (
    DEFAULT_URL,
)


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from receiver.rules import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _share(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not 0 <= value <= 1:
        raise click.BadParameter(f"must be between 0 and 1, got {value}")
    return value


async def _with_progress(sim: Simulation, console: Any) -> Summary:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    duration = sim.options.duration
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("sessions", total=duration, counts="")
        runner = asyncio.ensure_future(sim.run())
        try:
            while not runner.done():
                s = sim.stats
                elapsed = sim._now() if sim.t0 else 0.0
                waiting = "" if elapsed < duration else f" [retry wait {s.waiting}]"
                progress.update(
                    bar,
                    completed=min(elapsed, duration),
                    description="sessions" if elapsed < duration else "draining",
                    counts=f"sent {s.sent}  accepted {s.accepted}  dup {s.duplicates}  "
                    f"retried {s.retried}  errors {sum(s.errors.values())}{waiting}",
                )
                await asyncio.wait({runner}, timeout=0.2)
        except asyncio.CancelledError:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        return runner.result()


def _print_summary(summary: Summary, console: Any) -> None:
    from rich.table import Table

    table = Table("", "", show_header=False, box=None)
    rows = [
        ("events", summary.events),
        ("sent", summary.sent),
        ("accepted", summary.accepted),
        ("duplicates", f"{summary.duplicates} (of {summary.duplicate_deliveries} deliberate)"),
        ("retried", summary.retried),
        ("acknowledged", summary.acknowledged),
        ("failed", summary.failed + summary.pending),
        ("latency p50", f"{summary.p50_ms:.1f} ms"),
        ("latency p99", f"{summary.p99_ms:.1f} ms"),
        ("elapsed", f"{summary.elapsed_s:.1f} s"),
    ]
    if summary.errors:
        rows.append(("errors", ", ".join(f"{k}: {v}" for k, v in summary.errors.items())))
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    if summary.interrupted:
        console.print("interrupted: events still pending count as failed")


_POSITIVE = click.FloatRange(min=0, min_open=True)


@click.command()
@click.option(
    "--url",
    envvar="RECEIVER_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Where to deliver [RECEIVER_URL].",
)
@click.option(
    "--secret",
    envvar="RECEIVER_SIGN_SECRET",
    help="Signing secret [RECEIVER_SIGN_SECRET, else the first of RECEIVER_SECRETS, "
    "else the development secret]. Never printed.",
)
@click.option(
    "--sessions",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Sessions running at once.",
)
@click.option(
    "--duration",
    default="30s",
    show_default=True,
    callback=_duration,
    help="How long the sessions run (90s, 2m, 1h30m).",
)
@click.option(
    "--tick",
    type=_POSITIVE,
    default=1.0,
    show_default=True,
    help="Seconds between two score updates of a session; smaller means more events.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    help="At most this many deliveries a second (retries included); 0 = no cap.",
)
@click.option(
    "--duplicates",
    type=float,
    default=0.0,
    show_default=True,
    callback=_share,
    help="Share of events (0..1) delivered a second time after they were acknowledged.",
)
@click.option(
    "--speed",
    type=_POSITIVE,
    default=1.0,
    show_default=True,
    help="Divide the retry schedule (1m, 5m, 30m, 2h, 8h) by this.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Deliveries in flight at most.",
)
@click.option(
    "--timeout",
    type=_POSITIVE,
    default=10.0,
    show_default=True,
    help="Seconds before a delivery counts as failed (and is retried).",
)
@click.option(
    "--max-wait",
    default=None,
    callback=_duration,
    help="After the sessions end, wait at most this long for retries "
    "[the whole retry schedule divided by --speed].",
)
@click.option("--seed", type=int, help="Seed of the random walks, for a repeatable run.")
@click.option(
    "--threshold",
    type=float,
    default=40.0,
    show_default=True,
    help="Score threshold the sessions drop below and recover above.",
)
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one line per event: id, outcome, attempts, type (tab-separated).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--serve-api",
    is_flag=True,
    help="Be the whole service instead: serve its API (sessions, scores, webhook"
    " registration) on --listen and deliver events to the webhooks registered there.",
)
@click.option(
    "--listen",
    default="127.0.0.1:4100",
    show_default=True,
    metavar="HOST:PORT",
    help="With --serve-api: where to serve.",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    envvar="RECEIVER_SIMULATE_KEYS",
    metavar="KEY[:PLAN]",
    help="With --serve-api: a Bearer key it accepts, on --plan unless :free, :pro or"
    " :enterprise follows; repeatable [RECEIVER_SIMULATE_KEYS, space-separated; else one"
    " made up and printed].",
)
@click.option(
    "--plan",
    type=click.Choice(["free", "pro", "enterprise"]),
    default="free",
    show_default=True,
    help="With --serve-api: the plan of keys given without one.",
)
@click.option(
    "--population",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="With --serve-api: sessions in all, --sessions of them live, the rest finished"
    " over the past day.",
)
@click.pass_context
def simulate(
    ctx: click.Context,
    url: str,
    secret: str | None,
    sessions: int,
    duration: float,
    tick: float,
    rate: float,
    duplicates: float,
    speed: float,
    concurrency: int,
    timeout: float,
    max_wait: float | None,
    seed: int | None,
    threshold: float,
    record: Path | None,
    as_json: bool,
    no_progress: bool,
    serve_api: bool,
    listen: str,
    api_keys: tuple[str, ...],
    plan: str,
    population: int,
) -> None:
    """Behave like the Attention Scoring Service towards a receiver: signed events, retries.

    Sessions' scores wander and cross the threshold (score.drop, score.recover),
    interventions fire and resolve, each session ends with session.stopped. A
    delivery answered non-2xx or timed out is retried at 1m, 5m, 30m, 2h, 8h
    divided by --speed. Ends with a summary; exits 1 unless every event was
    acknowledged with a 2xx in the end.

    Example:

    \b
        receiver simulate --sessions 20 --duration 30s
        receiver simulate --duplicates 0.1 --speed 600 --record outcomes.tsv --json
        receiver simulate --serve-api --api-key ar_test:pro --speed 60

    With --serve-api it serves the service's API from a generated population
    until stopped (or for --duration when given): `receiver upstream register`
    points it at a receiver, and the live sessions' events are delivered there.
    """
    if serve_api:
        from receiver.simulator.serve import serve_fake

        given = ctx.get_parameter_source("duration") is not click.core.ParameterSource.DEFAULT
        serve_fake(
            listen=listen,
            keys=api_keys,
            plan=plan,
            live=sessions,
            population=population,
            tick=tick,
            speed=speed,
            threshold=threshold,
            seed=seed,
            duration=duration if given else None,
        )
        return

    options = Options(
        sessions=sessions,
        duration=duration,
        tick=tick,
        rate=rate,
        duplicates=duplicates,
        speed=speed,
        concurrency=concurrency,
        threshold=threshold,
        timeout=timeout,
        max_wait=max_wait,
    )
    ok = _run(url, signing_secret(secret), options, seed, record, as_json, progress=not no_progress)
    sys.exit(0 if ok else 1)


def _run(
    url: str,
    secret: bytes,
    options: Options,
    seed: int | None,
    record: Path | None,
    as_json: bool,
    *,
    progress: bool,
) -> bool:
    """Send the simulation's events to `url`, print its summary; True when every event was
    acknowledged with a 2xx in the end."""
    from rich.console import Console

    err = Console(stderr=True)
    sim = Simulation(
        url,
        secret,
        options,
        seed=seed,
        on_warning=lambda message: err.print(f"warning: {message}"),
    )
    show = progress and err.is_terminal

    async def main() -> Summary:
        return await (_with_progress(sim, err) if show else sim.run())

    summary = asyncio.run(main())
    if record is not None:
        sim.write_record(record)
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
    else:
        _print_summary(summary, Console())
    return summary.ok
