"""`receiver keys create|list|revoke`: the API keys of the /v1 read API."""

from __future__ import annotations

import json
import time

import click

from receiver.api.auth import PREFIX, hash_key, new_key
from receiver.cli._common import db_option, echo, when, with_store
from receiver.events import iso_epoch
from receiver.logs import escape
from receiver.store import Store
from receiver.store.records import PLANS, ROLES, ApiKey


@click.group()
def keys() -> None:
    """API keys for the /v1 read API (Authorization: Bearer <key>).

    A key is shown once, when it is made; the store keeps only its hash.
    Roles: reader reads; writer also manages webhook subscriptions; admin also
    manages keys and signs in to the admin page. Plans: free 60, pro 600,
    enterprise unlimited requests a minute, counted per key across replicas.
    """


# A key's name is shown in listings, logs and the admin page, and typed to revoke it.
NAME_MAX = 64


def _name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--name: 1 to NAME_MAX characters once trimmed, none of them a control character."""
    name = value.strip()
    if not name:
        raise click.BadParameter("must not be empty")
    if len(name) > NAME_MAX:
        raise click.BadParameter(f"must be at most {NAME_MAX} characters; got {len(name)}")
    if escape(name) != name:
        raise click.BadParameter(f"must not contain control characters; got {escape(name)!r}")
    return name


@keys.command("create")
@db_option
@click.option(
    "--name",
    required=True,
    callback=_name,
    help=f"A name to list and revoke the key by (1 to {NAME_MAX} characters).",
)
@click.option("--plan", type=click.Choice(list(PLANS)), required=True)
@click.option("--role", type=click.Choice(ROLES), default="reader", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The key and its record as JSON.")
def create(db: str, name: str, plan: str, role: str, as_json: bool) -> None:
    """Make a key and print it, once.

    Example:

        receiver keys create --name dashboard --plan pro
    """
    key = new_key()

    async def add(store: Store) -> ApiKey:
        return await store.keys.add(
            name=name,
            key_hash=hash_key(key),
            prefix=key[:PREFIX],
            plan=plan,
            role=role,
            now=time.time(),
        )

    try:
        record = with_store(db, add, create=True)
    except KeyError:
        raise click.ClickException(
            f"a key named {name!r} exists already; choose another name"
        ) from None
    if as_json:
        echo(json.dumps({"key": key, **_public(record)}))
        return
    echo(key)
    echo(
        f"key {name!r} made ({role}, {plan} plan). It is shown only now: keep it somewhere"
        " safe. Use it as: Authorization: Bearer <key>",
        err=True,
    )


@keys.command("list")
@db_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def list_keys(db: str, as_json: bool) -> None:
    """List the keys (their names and first characters, never the keys)."""
    found = with_store(db, lambda store: store.keys.all())
    if as_json:
        for record in found:
            echo(json.dumps(_public(record)))
        return
    if not found:
        echo("no API keys; make one with: receiver keys create --name NAME --plan free")
        return
    for k in found:
        state = f"revoked {when(k.revoked_at)}" if k.revoked_at else "active"
        echo(
            f"{k.name}  {k.prefix}...  {k.role}, {k.plan} plan, made {when(k.created_at)}; {state}"
        )


@keys.command("revoke")
@db_option
@click.argument("name")
def revoke(db: str, name: str) -> None:
    """Revoke a key by name: refused from the next request on, on every replica."""
    if not with_store(db, lambda store: store.keys.revoke(name, now=time.time())):
        raise click.ClickException(f"no active key named {name!r} (see: receiver keys list)")
    echo(f"key {name!r} revoked")


def _public(k: ApiKey) -> dict[str, object]:
    return {
        "name": k.name,
        "prefix": k.prefix,
        "role": k.role,
        "plan": k.plan,
        "createdAt": iso_epoch(k.created_at),
        "revokedAt": None if k.revoked_at is None else iso_epoch(k.revoked_at),
    }
