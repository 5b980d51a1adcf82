"""`receiver sign` and `receiver send`: sign a body, or a sample event, and POST it."""

from __future__ import annotations

import sys
from typing import Any

import click
import httpx

from receiver import signature
from receiver.cli._common import (
    DEFAULT_URL,
    build_body,
    echo,
    event_options,
    secret_option,
)
from receiver.settings import signing_secret


@click.command()
@click.argument("file", type=click.File("rb"), default="-")
@secret_option
def sign(file: Any, secret: str | None) -> None:
    """Print the X-Service-Signature header for the body in FILE (default: stdin).

    Example:

        receiver sign event.json
        curl -H "$(receiver sign event.json)" --data-binary @event.json localhost:4000/v1/events
    """
    body = file.read()
    echo(f"{signature.SIGNATURE_HEADER}: {signature.sign(signing_secret(secret), body)}")


@click.command()
@event_options
@click.option(
    "--url",
    envvar="RECEIVER_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Where to POST [RECEIVER_URL].",
)
@secret_option
@click.option("--unsigned", is_flag=True, help="Send without a signature header (to test 401).")
@click.option(
    "--save",
    type=click.File("wb"),
    help="Also write the body sent to this file, to send the same bytes again with --file.",
)
def send(url: str, secret: str | None, unsigned: bool, save: Any, **event_args: Any) -> None:
    """Sign a sample event and POST it; print the status and the answer.

    Exits 1 unless the answer is 2xx. Each sample gets the time now as its
    timestamp, so sending --id evt_1 twice sends two different bodies under one
    id: the second is answered 200 duplicate, and the server logs it as a
    conflict. To resend as the service does (the same bytes), --save the first
    and send it again with --file.

    Example:

    \b
        receiver send --type score.drop --id evt_1 --score 12 --field context=checkout
        receiver send --id evt_2 --save evt_2.json && receiver send --file evt_2.json
    """
    body = build_body(**event_args)
    if save is not None:
        save.write(body)
        save.close()
    headers = {"content-type": "application/json"}
    if not unsigned:
        headers[signature.SIGNATURE_HEADER] = signature.sign(signing_secret(secret), body)
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc
    echo(f"{response.status_code} {response.text}")
    if not response.is_success:
        sys.exit(1)
