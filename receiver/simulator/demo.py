"""`make demo`: the whole chain on this machine, for a minute, then a summary.

    python -m receiver.simulator.demo [--seconds 60] [--port 4000]

Starts, each on a free loopback port: the fake upstream (`receiver simulate
--serve-api`), a local sink standing in for Slack and email (an HTTP server in this
process: apprise's json:// POSTs land there), and a receiver with a demo rules file and
enrichment from the fake. It registers the receiver upstream (`receiver upstream
register`, whose secret the receiver then verifies with), lets the live sessions' events
flow, stops the receiver for a while (a sender outage: the fake's deliveries fail and are
retried on the service's schedule, sped up), starts it again, and prints as it happens what
arrived, what was routed where and what was delivered. Two scenes end it: an escalation
with an ack link followed (escalation_scene), and a Slack app message updated in place by
a click on Ack, against a Slack Web API stand-in (slack_scene), and a session whose score
hovers around its threshold, with and without flap detection (flap_scene). It ends with a
summary table and stops everything it started, on Ctrl-C too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console
from rich.table import Table

from receiver.simulator import escalation_scene, flap_scene, slack_scene
from receiver.simulator.sink import Sink
from receiver.store import Store, open_store
from receiver.store.records import EventQuery, OutboxQuery

HOST = "127.0.0.1"
KEY = "ar_demo_key"  # the fake upstream's API key for this run; it exists only here
SPEED = 120  # the sender's retries at 0.5s, 2.5s, 15s, 60s, 240s instead of 1m, 5m, ...
POLL = 0.25
STOP_WAIT = 15.0  # seconds a child gets to exit after SIGTERM before it is killed

RULES = """\
# The demo's rules: Slack and email are a local sink (json:// POSTs to this machine).
notifiers:
  slack: "json://{host}:{port}/slack"
  email: "json://{host}:{port}/email"
rules:
  - name: deep-drop
    match:
      type: score.drop
      score: {{lt: 20}}
    notify: [slack, email]
    title: "Deep drop {{{{ userId }}}} {{{{ score }}}} on {{{{ session.context|default('?') }}}}"
    body: >-
      {{{{ sessionId }}}} ({{{{ session.status | default('?') }}}},
      {{{{ session.interventions | default('?') }}}} interventions so far);
      last scores: {{% for p in history[-5:] %}}{{{{ p.score }}}} {{% endfor %}}
  - name: drop
    match:
      type: score.drop
    notify: slack
    title: "{{{{ userId }}}} dropped to {{{{ score }}}} on {{{{ session.context | default('?') }}}}"
    body: "{{{{ sessionId }}}}: {{{{ session.signals | default('?') }}}} signals so far"
  - name: intervention
    match:
      type: intervention.fired
    notify: email
    title: "Intervention {{{{ kind | default('?') }}}} for {{{{ userId }}}}"
    body: "{{{{ sessionId }}}} on {{{{ session.context | default('?') }}}}"
  - name: recovered
    match:
      type: score.recover
      sessionId: "sess_*"  # the live sessions: the flapping scene counts its own messages
    notify: slack
    title: "{{{{ userId }}}} is back: {{{{ score }}}} on {{{{ session.context|default('?') }}}}"
    body: "{{{{ sessionId }}}} after {{{{ history|length }}}} score points"
"""


def free_port(port: int = 0) -> int:
    with socket.socket() as s:
        s.bind((HOST, port))  # OSError for a port taken; 0: any free one
        free: int = s.getsockname()[1]
        return free


# -- children --------------------------------------------------------------------------------


class Children:
    """The processes this demo started; stop_all() ends every one (SIGTERM, then SIGKILL)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "receiver", *args],
                env={**os.environ, **env},
                stdout=log,
                stderr=log,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops them in order
            )
        self.procs[name] = proc
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def wait_until_up(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"{what} exited with status {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=1)
            return
        time.sleep(0.1)
    raise click.ClickException(f"{what} did not start within {timeout:g}s")


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Seen:
    """What the demo has printed so far, and the counts the summary shows."""

    events: set[str] = field(default_factory=set)
    arrived: Counter[str] = field(default_factory=Counter)
    rows: dict[int, str] = field(default_factory=dict)  # outbox id -> state last printed
    routed: Counter[tuple[str, str]] = field(default_factory=Counter)  # (rule, notifier)
    outcomes: Counter[str] = field(default_factory=Counter)
    sink: int = 0
    delivered: Counter[str] = field(default_factory=Counter)
    enriched: int = 0


class Demo:
    def __init__(self, seconds: float, console: Console, workdir: Path, port: int = 0) -> None:
        self.seconds = seconds
        self.console = console
        self.dir = workdir
        self.children = Children(workdir)
        self.sink = Sink()
        self.seen = Seen()
        self.t0 = time.monotonic()
        self.fake_port = free_port()
        self.receiver_port = port or free_port()
        self.db = str(workdir / "receiver.db")
        self.secret = ""
        self.stats: dict[str, Any] = {}
        self._stats_at = 0.0
        self._retried = 0
        self.escalations: dict[str, str] = {}  # the last scene's alerts and what befell them
        self.slack = slack_scene.stand_in()  # the Slack Web API, for the Slack app scene
        self.slack_done: dict[str, str] = {}
        self.flaps: dict[str, str] = {}  # the flapping scene's two sessions and their messages

    def say(self, what: str, text: str, style: str = "") -> None:
        stamp = f"{time.monotonic() - self.t0:5.1f}s"
        self.console.print(f"[dim]{stamp}[/dim]  [{style or 'bold'}]{what:<10}[/]  {text}")

    @property
    def receiver_url(self) -> str:
        return f"http://{HOST}:{self.receiver_port}"

    def messages(self) -> list[tuple[str, dict[str, Any]]]:
        """What reached the sink so far: (channel, message)."""
        return [(channel, message) for _, channel, message in self.sink.since(0)]

    @property
    def upstream_url(self) -> str:
        return f"http://{HOST}:{self.fake_port}/v1"

    def receiver_env(self) -> dict[str, str]:
        return {
            "RECEIVER_HOST": HOST,
            "RECEIVER_PORT": str(self.receiver_port),
            "RECEIVER_DB": self.db,
            "RECEIVER_RULES": str(self.dir / "rules.yaml"),
            "RECEIVER_SECRETS": self.secret,
            "RECEIVER_UPSTREAM_URL": self.upstream_url,
            "RECEIVER_UPSTREAM_KEY": KEY,
            "RECEIVER_UPSTREAM_PLAN": "pro",
            "RECEIVER_UPSTREAM_TIMEOUT": "2s",
            "RECEIVER_RETRY_INITIAL": "1s",
            "RECEIVER_SHUTDOWN_GRACE": "5s",
            "RECEIVER_PUBLIC_URL": self.receiver_url,  # signed one-click links in messages
            **slack_scene.env(self.slack),
        }

    def start_receiver(self) -> None:
        proc = self.children.start("receiver", ["serve"], self.receiver_env())
        wait_until_up(f"http://{HOST}:{self.receiver_port}/healthz", proc, "the receiver")

    def set_up(self) -> None:
        self.sink.start()
        self.say("sink", f"Slack and email stand-in on http://{HOST}:{self.sink.port}")
        scene = escalation_scene.RULES.format(step=escalation_scene.STEP)
        rules = RULES.format(host=HOST, port=self.sink.port).replace("rules:\n", scene, 1)
        (self.dir / "rules.yaml").write_text(flap_scene.rules(slack_scene.rules(rules)))
        fake = self.children.start(
            "upstream",
            [
                "simulate", "--serve-api", "--listen", f"{HOST}:{self.fake_port}",
                "--api-key", f"{KEY}:pro", "--sessions", "12", "--population", "60",
                "--tick", "1", "--speed", str(SPEED), "--threshold", "40", "--seed", "2026",
            ],
            {},
        )  # fmt: skip
        wait_until_up(f"http://{HOST}:{self.fake_port}/_fake/stats", fake, "the fake upstream")
        self.say("upstream", f"fake Attention Scoring Service on {self.upstream_url}")
        registered = subprocess.run(
            [
                sys.executable, "-m", "receiver", "upstream", "register", "--db", self.db,
                "--url", f"http://{HOST}:{self.receiver_port}/v1/events", "--threshold", "40",
                "--json",
            ],
            env={**os.environ, **self.receiver_env()},
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        if registered.returncode != 0:
            raise click.ClickException(f"registering failed: {registered.stderr.strip()}")
        made = json.loads(registered.stdout)
        self.secret = made["secret"]  # kept in this process and the receiver's environment
        self.say("register", f"receiver upstream register -> {made['id']} (secret set)")
        self.start_receiver()
        self.say("receiver", f"listening on http://{HOST}:{self.receiver_port}/v1/events")

    async def watch(self, store: Store) -> None:
        """Print what is new: events arrived, notifications routed and their outcomes,
        messages at the sink."""
        with contextlib.suppress(Exception):  # the receiver may be restarting
            for row in reversed(await store.events.page(EventQuery(limit=200))):
                if row.id not in self.seen.events:
                    self.seen.events.add(row.id)
                    self.seen.arrived[row.type] += 1
                    score = "" if row.score is None else f" score {row.score:g}"
                    self.say("arrived", f"{row.type:<20} {row.session_id} {row.user_id}{score}")
            for out in reversed(await store.outbox.page(OutboxQuery(limit=200))):
                before = self.seen.rows.get(out.id)
                if before is None:
                    self.seen.routed[(out.rule, out.notifier)] += 1
                    self.say("routed", f"rule {out.rule} -> {out.notifier}", "cyan")
                if out.state != before and out.state in ("delivered", "dead"):
                    self.seen.outcomes[out.state] += 1
                self.seen.rows[out.id] = out.state
        for _, channel, message in self.sink.since(self.seen.sink):
            self.seen.sink += 1
            self.seen.delivered[channel] += 1
            title, body = str(message.get("title", "")), str(message.get("message", ""))
            # Every demo rule names session.context; "on ?" is its default, unenriched. The
            # scenes' demo_ sessions are unknown upstream: their resolved, flapping and
            # paging messages name no context, and are not counted as enriched either.
            if "on ?" not in title + body and "demo_" not in title + body:
                self.seen.enriched += 1
            body = re.sub(r"/act/\S+", "/act/***", " ".join(body.split()))  # tokens: capabilities
            short = body if len(body) <= 70 else body[:67] + "..."
            self.say("delivered", f"{channel:<6} {title} [dim]| {short}[/dim]", "green")
        await self._sender()

    async def _sender(self) -> None:
        """Print the sender's failed attempts and retries, from the fake's counts."""
        now = time.monotonic()
        if now - self._stats_at < 1.0 or "upstream" not in self.children.procs:
            return
        self._stats_at = now
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                stats = (await client.get(f"http://{HOST}:{self.fake_port}/_fake/stats")).json()
        except (httpx.HTTPError, ValueError):
            return
        hooks = stats.get("webhooks") or [{}]
        retried, pending = hooks[0].get("retried", 0), hooks[0].get("pending", 0)
        if retried > self._retried:
            self.say(
                "sender",
                f"retried {retried - self._retried} failed deliveries ({pending} in flight)",
                "yellow",
            )
            self._retried = retried

    async def run(self) -> None:
        self.set_up()
        store = open_store(self.db)
        await store.open()
        try:
            # The traffic's clock starts once everything is up, however long that took.
            outage_at, outage_for = self.seconds * 0.35, max(2.0, self.seconds * 0.15)
            down, outage_done = False, False
            begin = time.monotonic()
            for _ in range(int(self.seconds / POLL) + 10_000):
                elapsed = time.monotonic() - begin
                if elapsed >= self.seconds:
                    break
                if not outage_done and not down and elapsed >= outage_at:
                    self.children.stop("receiver")
                    down = True
                    self.say("outage", f"receiver stopped for {outage_for:.0f}s", "bold red")
                elif down and elapsed >= outage_at + outage_for:
                    self.start_receiver()
                    down, outage_done = False, True
                    self.say("outage", "receiver back; the sender retries", "bold red")
                await self.watch(store)
                await asyncio.sleep(POLL)
            try:
                self.escalations = await escalation_scene.play(self)
            except (TimeoutError, httpx.HTTPError) as exc:
                self.escalations = {"escalation scene": f"failed: {exc}"}
            try:
                self.slack_done = await slack_scene.play(self)
            except (TimeoutError, httpx.HTTPError) as exc:
                self.slack_done = {"slack scene": f"failed: {exc}"}
            try:
                self.flaps = await flap_scene.play(self, store)
            except (TimeoutError, httpx.HTTPError) as exc:
                self.flaps = {"flapping scene": f"failed: {exc}"}
            await self.watch(store)
            self.say("stop", "no more traffic; a few seconds to finish sends", "bold")
            self.stats = httpx.get(f"http://{HOST}:{self.fake_port}/_fake/stats", timeout=5).json()
            self.children.stop("upstream")
            for _ in range(int(5 / POLL)):  # let routed notifications finish
                await self.watch(store)
                if all(s in ("delivered", "dead") for s in self.seen.rows.values()):
                    break
                await asyncio.sleep(POLL)
        finally:
            await store.close()

    def summary(self) -> Table:
        seen, hooks = self.seen, self.stats.get("webhooks") or [{}]
        hook = hooks[0]
        table = Table(title="demo summary", show_header=True, header_style="bold")
        table.add_column("stage")
        table.add_column("what")
        table.add_column("count", justify="right")
        rows = [
            ("upstream", "events made by live sessions", self.stats.get("events", 0)),
            ("upstream", "of them sent to our webhook", hook.get("sent", 0)),
            ("upstream", "deliveries delivered (2xx)", hook.get("delivered", 0)),
            ("upstream", "delivery attempts retried", hook.get("retried", 0)),
            ("upstream", "deliveries failed / still retrying",
             f"{hook.get('failed', 0)} / {hook.get('pending', 0)}"),
            ("upstream", "API requests (enrichment)", self.stats.get("requests", 0)),
            ("upstream", "API requests refused 429", self.stats.get("throttled", 0)),
        ]  # fmt: skip
        rows += [("receiver", f"arrived: {kind}", n) for kind, n in sorted(seen.arrived.items())]
        rows += [
            ("routing", f"{rule} -> {notifier}", n)
            for (rule, notifier), n in sorted(seen.routed.items())
        ]
        rows += [("sink", f"delivered to {ch}", n) for ch, n in sorted(seen.delivered.items())]
        rows += [
            ("sink", "of them enriched from upstream", seen.enriched),
            (
                "outbox",
                "delivered / dead",
                f"{seen.outcomes['delivered']} / {seen.outcomes['dead']}",
            ),
        ]
        rows += [("escalation", alert, outcome) for alert, outcome in self.escalations.items()]
        rows += [("slack app", alert, outcome) for alert, outcome in self.slack_done.items()]
        rows += [("flapping", session, outcome) for session, outcome in self.flaps.items()]
        for stage, what, count in rows:
            table.add_row(stage, what, str(count))
        return table


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """Ctrl-C and SIGTERM end the demo at once, through the finally blocks that stop the
    children: KeyboardInterrupt is raised wherever the demo is. Not asyncio.run()'s own
    Ctrl-C handling, which only asks the demo's task to cancel at its next await: once,
    in a test run under load, that request was lost and the demo ran on to its end."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command()
@click.option(
    "--seconds",
    type=click.FloatRange(min=5),
    default=60,
    show_default=True,
    help="How long traffic flows.",
)
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the logs and database in this directory [a temporary one, removed].",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    help="The receiver's port on 127.0.0.1, for its admin page and API [a free one].",
)
def main(seconds: float, keep: Path | None, port: int) -> None:
    """The whole chain for a minute: fake upstream, receiver, Slack/email sink; a summary."""
    if port:
        try:
            free_port(port)
        except OSError as exc:
            taken = f"{HOST}:{port} is taken ({exc.strerror})"
            raise click.BadParameter(taken, param_hint="--port") from None
    console = Console(highlight=False)
    with contextlib.ExitStack() as stack:
        if keep is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="demo-")))
        else:
            keep.mkdir(parents=True, exist_ok=True)
            workdir = keep
        demo = Demo(seconds, console, workdir, port)
        stack.enter_context(_signals_as_interrupt())
        interrupted = False
        try:
            asyncio.run(demo.run())
        except KeyboardInterrupt:
            interrupted = True
            console.print("[bold red]interrupted[/]: stopping everything")
        finally:
            demo.children.stop_all()
            demo.sink.stop()
            demo.slack.stop()
        console.print(demo.summary())
        if interrupted:
            sys.exit(130)


if __name__ == "__main__":
    main()
