"""The apprise channel: the rules' notifiers (chat, email, any apprise URL), one lane a URL,
retried with exponential backoff."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from receiver import tracing
from receiver.notify.channel import Kind, Parts, Result, Schedule
from receiver.notify.targets import DeliveryError, Exchange, Targets, prepare_apprise
from receiver.store import OutboxRow

Enrich = Callable[[OutboxRow], Awaitable[tuple[str, str] | None]]

NAME = "notify"  # the label the dashboards and deploy/prometheus-rules.yaml know
CONSOLE = "console"  # our own scheme: the notification in the log, for trying rules out
SERVICES_DOC = "https://appriseit.com/services/"
NATIVE = frozenset({"http", "https"})


class Rules(Protocol):
    """What the channel reads of the rules (receiver.rules.Ruleset): the notifiers."""

    @property
    def notifiers(self) -> Mapping[str, Any]: ...


class AppriseChannel:
    """Sends a row's title and body to its notifier's URL (receiver.notify.targets). It
    handles every notifier no other channel claims: the rules' own, and those no longer in
    the rules (each such send fails, naming the notifier)."""

    name = NAME

    def __init__(
        self,
        targets: Targets,
        rules: Callable[[], Rules],
        *,
        schedule: Schedule,
        enrich: Enrich | None = None,
    ) -> None:
        self.targets = targets
        self.rules = rules
        self.schedule = schedule
        # Renders a row's texts again just before it is sent (receiver.upstream.enrich);
        # None: the stored texts as they are.
        self.enrich = enrich

    async def lanes(self) -> list[tuple[str, int]]:
        return lanes_of(self.rules(), self.name)

    def describe(self, row: OutboxRow) -> str:
        return f"{row.label} for event {row.event_id} (rule {row.rule})"

    async def send(self, row: OutboxRow) -> Result:
        exchange = Exchange() if tracing.recording() else None
        try:
            url = self._url(row)
            title, body = await self._texts(row)
            status = await self.targets.send(
                url,
                title=title,
                body=body,
                label=row.label,
                headers=tracing.current_headers(),
                exchange=exchange,
            )
        except DeliveryError as exc:
            if exchange is not None:
                failure = "timeout" if exc.timed_out else exchange.error_type or "_OTHER"
                _traced(exchange, failure)
            return Result.retry(str(exc), status=exc.status)
        if exchange is not None:
            _traced(exchange)
        return Result.delivered(status=status)

    async def _texts(self, row: OutboxRow) -> tuple[str, str]:
        """The title and body to send: enriched when the rule asks for it and the upstream
        answers in time (enrich never raises), else the ones stored at routing."""
        enriched = await self.enrich(row) if self.enrich is not None else None
        return enriched if enriched is not None else (row.title, row.body)

    def _url(self, row: OutboxRow) -> str:
        notifier = self.rules().notifiers.get(row.notifier)
        if notifier is None:
            raise DeliveryError(
                f'notifier "{row.notifier}" is no longer defined in the rules', label=row.label
            )
        if row.target >= len(notifier.urls):
            raise DeliveryError(
                f'notifier "{row.notifier}" no longer has target {row.target}', label=row.label
            )
        return str(notifier.urls[row.target])


def _traced(exchange: Exchange, failure: str | None = None) -> None:
    """The send's span gets its last HTTP request (the notifier's URL, without secrets, for
    a target apprise reaches by other means: no method then), and failure as its
    error.type (the worker puts an answer's status there instead)."""
    tracing.describe(None, tracing.client_request(exchange.method, exchange.url, failure))


def lanes_of(rules: Rules, channel: str) -> list[tuple[str, int]]:
    """The (notifier, url index) lanes of the rules' urls that channel sends to."""
    return [
        (name, i)
        for name, notifier in rules.notifiers.items()
        for i in range(len(notifier.urls))
        if notifier.channel(i) == channel
    ]


@functools.cache
def _known() -> frozenset[str]:
    """The schemes apprise has a plugin for (loading them once: 0.5 s of CPU)."""
    from apprise.manager_plugins import NotificationManager

    prepare_apprise()
    schemes = NotificationManager().schemas()  # type: ignore[no-untyped-call]
    return frozenset(s.lower() for s in schemes)


def knows(scheme: str) -> bool:
    """Whether apprise may take a url of scheme: one of its plugins', or a service's own
    https:// address (a Discord or Teams webhook URL, which apprise recognizes as is)."""
    return scheme in NATIVE or scheme in _known()


def check(url: str, scheme: str) -> str | None:
    """Whether apprise can build a notification target from url (console:// is ours)."""
    if url.strip().lower() == f"{CONSOLE}://":
        return None
    import apprise

    # Apprise imports its plugins lazily, and one of them imports the deprecated
    # imghdr module; keep that warning from becoming an error under -W error.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if apprise.Apprise.instantiate(url, suppress_exceptions=True) is not None:
            return None
    return f"apprise cannot parse this url (scheme {scheme}); see {SERVICES_DOC}"


def _build(parts: Parts) -> AppriseChannel:
    return AppriseChannel(parts.targets, parts.rules, schedule=parts.backoff, enrich=parts.enrich)


KIND = Kind(
    NAME,
    frozenset({CONSOLE}),
    _build,
    check=check,
    knows=knows,
    takes=f"every scheme apprise knows, see {SERVICES_DOC}",
)
