"""`receiver simulate --serve-api`: the fake upstream (receiver.simulator.fake_service) under
uvicorn, until SIGINT/SIGTERM or for a given duration."""

from __future__ import annotations

import asyncio
import random
import secrets
import signal
from datetime import UTC, datetime

import click
import uvicorn

from receiver.simulator.fake_service import FakeUpstream
from receiver.simulator.population import Population
from receiver.store.records import PLANS


def parse_keys(given: tuple[str, ...], plan: str) -> dict[str, str]:
    """KEY[:PLAN] items (each may hold several, space-separated) as {key: plan}.

    >>> parse_keys(("ar_a ar_b:pro",), "free")
    {'ar_a': 'free', 'ar_b': 'pro'}
    """
    keys: dict[str, str] = {}
    for item in (word for text in given for word in text.split()):
        key, sep, named = item.rpartition(":")
        if not sep or named not in PLANS:
            key, named = item, plan
        keys[key] = named
    return keys


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise click.BadParameter(f"must be HOST:PORT; got {listen!r}", param_hint="--listen")
    return host, int(port)


def serve_fake(
    *,
    listen: str,
    keys: tuple[str, ...],
    plan: str,
    live: int,
    population: int,
    tick: float,
    speed: float,
    threshold: float,
    seed: int | None,
    duration: float | None,
) -> None:
    host, port = split_listen(listen)
    accepted = parse_keys(keys, plan)
    if not accepted:
        made = "ar_fake_" + secrets.token_urlsafe(12)
        accepted[made] = plan
        # A made-up key of a fake service: printed, since nothing else could know it.
        click.echo(f"API key ({plan} plan): {made}", err=True)
    sessions = Population.generate(
        seed=seed if seed is not None else random.randrange(2**32),
        sessions=max(population, live),
        live=live,
        threshold=threshold,
        now=datetime.now(UTC),
    )
    fake = FakeUpstream(keys=accepted, population=sessions, speed=speed, tick=tick)
    config = uvicorn.Config(fake.app(), host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    click.echo(f"fake upstream serving http://{host}:{port}/v1", err=True)

    async def run() -> None:
        if duration is not None:
            loop = asyncio.get_running_loop()
            loop.call_later(duration, lambda: setattr(server, "should_exit", True))
        await server.serve()

    # uvicorn re-raises the stopping signal once it has shut down, under the handlers it
    # found in place; with these ignoring it, a clean stop ends with status 0.
    found = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        asyncio.run(run())
    finally:
        for sig, handler in found.items():
            signal.signal(sig, handler)
