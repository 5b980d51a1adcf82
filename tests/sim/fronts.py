"""The front ends an operator's ack, resolve or snooze comes through, in process and on the
virtual clock: each action of a scenario names one (Op.data["via"], drawn by
generate.action_fronts), and the invariants stay what they are.

- engine: receiver.dispatch.actions.perform, the engine every front end calls;
- link: a real one-click link (receiver.links, signed with the store's own key, for the
  alert's episode as a message would carry it; now and then for an episode that is over,
  a stale link) POSTed to the /act page (receiver.admin.act.ActPages);
- api: POST /v1/alerts/:id/ack, /resolve, /snooze (receiver.api.alerts.AlertsAPI) with a
  writer key made in the store;
- cli: `receiver alerts ack|resolve|snooze` (receiver.cli.alerts) through click's
  CliRunner, on the run's SQLite file, in a thread (the CLI runs its own event loop) while
  the runner waits for it, its clock the virtual one.

The link and API requests go through an in-process ASGI client (httpx.ASGITransport) to a
Starlette app of those routes and the server's exception handlers: no socket, no server.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from click.testing import CliRunner
from starlette.applications import Starlette

from receiver.admin.act import ActPages
from receiver.api.alerts import AlertsAPI
from receiver.api.auth import PREFIX, Access, hash_key
from receiver.dispatch import actions
from receiver.edge.asgi import EXCEPTION_HANDLERS
from receiver.links import LinkSource
from receiver.metrics import Metrics

if TYPE_CHECKING:
    from tests.sim.run import Run

FRONTS = ("engine", "link", "api", "cli")
BASE = "http://sim.invalid"  # RECEIVER_PUBLIC_URL of the run: never dialled
KEY = "ar_sim-writer-key-" + "x" * 24  # the API key the run makes (its hash is stored)
TTL = 7 * 86400.0
# The module (receiver.cli's attribute of that name is its click group).
cli_alerts = importlib.import_module("receiver.cli.alerts")


class Fronts:
    """One run's front ends; the app is made again for each action (the store may have
    been reopened by a crash since)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.keyed = False

    async def act(self, kind: str, data: dict[str, Any]) -> str:
        """Do the action through its front end; what it answered, for the trace."""
        via = data.get("via", "engine")
        if via == "link":
            return await self._link(kind, data)
        if via == "api":
            return await self._api(kind, data)
        if via == "cli":
            return await self._cli(kind, data)
        run = self.run
        assert run.store is not None
        outcome = await actions.perform(
            run.store, run.ruleset, data["alert"], kind, source="sim", by="sim",
            now=run.now, seconds=data.get("seconds"),
        )  # fmt: skip
        return outcome.result

    def _app(self) -> httpx.AsyncClient:
        run = self.run
        store = run.store
        assert store is not None
        clock = run.clock
        links = LinkSource(store, base=BASE, ttl=TTL, clock=clock)
        routes = [
            *AlertsAPI(
                store, Access(store, clock=clock), rules=lambda: run.ruleset, clock=clock,
                links=links,
            ).routes(),
            *ActPages(
                store, links, rules=lambda: run.ruleset, metrics=Metrics(), clock=clock
            ).routes(),
        ]  # fmt: skip
        app = Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)

    async def _link(self, kind: str, data: dict[str, Any]) -> str:
        run = self.run
        assert run.store is not None
        alert = await run.store.alerts.get(data["alert"])
        episode = alert.episode if alert is not None else None
        if episode is not None and data.get("stale") and episode > 1:
            episode -= 1  # a link from a message of an earlier episode
        links = await LinkSource(run.store, base=BASE, ttl=TTL, clock=run.clock).get()
        url = links.url(data["alert"], kind, episode)
        async with self._app() as client:
            answer = await client.post(url.removeprefix(BASE))
        said = "nothing to do" if "Nothing to do" in answer.text else "done"
        return f"{answer.status_code} {said if answer.status_code == 200 else ''}".strip()

    async def _api(self, kind: str, data: dict[str, Any]) -> str:
        run = self.run
        assert run.store is not None
        if not self.keyed:
            await self._key()
        body = {"for": f"{int(data['seconds'])}s"} if kind == "snooze" else None
        async with self._app() as client:
            answer = await client.post(
                f"/v1/alerts/{data['alert']}/{kind}",
                headers={"Authorization": f"Bearer {KEY}"},
                content=json.dumps(body).encode() if body else b"",
            )
        found = answer.json()
        return f"{answer.status_code} {found.get('result') or found['error']['code']}"

    async def _key(self) -> None:
        """The run's writer key, in the store (once: a crash keeps it, it is committed)."""
        store = self.run.store
        assert store is not None
        try:
            await store.keys.add(
                name="sim", key_hash=hash_key(KEY), prefix=KEY[:PREFIX], plan="enterprise",
                role="writer", now=self.run.now,
            )  # fmt: skip
        except KeyError:
            pass  # made before a crash
        self.keyed = True

    async def _cli(self, kind: str, data: dict[str, Any]) -> str:
        run = self.run
        args = [kind, "--db", run.url or str(run.db), data["alert"], "--by", "sim"]
        if kind == "snooze":
            args += ["--for", f"{int(data['seconds'])}s"]
        elif kind == "resolve":
            args += ["--rules", str(self._rules_file())]

        def invoke() -> Any:
            with _cli_clock(run.now):
                return CliRunner().invoke(cli_alerts.alerts, args, catch_exceptions=False)

        done = await asyncio.to_thread(invoke)
        return f"exit {done.exit_code}: {done.output.strip()[:60]}"

    def _rules_file(self) -> Path:
        """The rules in force, as the file the CLI's --rules names."""
        path = self.run.db.parent / f"rules-{self.run.ruleset.digest[:12]}.yaml"
        if not path.exists():
            index = self.run.rulesets.index(self.run.ruleset)
            path.write_text(self.run.scenario.rules[index])
        return path


@contextlib.contextmanager
def _cli_clock(now: float) -> Iterator[None]:
    """The CLI's clock (its `time.time()`) is the run's while it acts: the runner waits for
    it, so nothing else reads that module's clock meanwhile."""
    real = cli_alerts.time
    cli_alerts.time = types.SimpleNamespace(time=lambda: now)  # type: ignore[assignment]
    try:
        yield
    finally:
        cli_alerts.time = real
