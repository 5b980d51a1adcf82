"""The apprise channel: the rules' notifiers (chat, email, any apprise URL), one lane a URL,
retried with exponential backoff."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from receiver import tracing
from receiver.notify.backoff import Backoff
from receiver.notify.channel import Result
from receiver.notify.targets import DeliveryError, Exchange, Targets
from receiver.rules import Ruleset
from receiver.store import OutboxRow

Enrich = Callable[[OutboxRow], Awaitable[tuple[str, str] | None]]


class AppriseChannel:
    """Sends a row's title and body to its notifier's URL (receiver.notify.targets). It
    handles every notifier no other channel claims: the rules' own, and those no longer in
    the rules (each such send fails, naming the notifier)."""

    name = "notify"

    def __init__(
        self,
        targets: Targets,
        rules: Callable[[], Ruleset],
        *,
        schedule: Backoff,
        enrich: Enrich | None = None,
    ) -> None:
        self.targets = targets
        self.rules = rules
        self.schedule = schedule
        # Renders a row's texts again just before it is sent (receiver.upstream.enrich);
        # None: the stored texts as they are.
        self.enrich = enrich

    def handles(self, notifier: str) -> bool:
        return True

    async def lanes(self) -> list[tuple[str, int]]:
        return [
            (name, i)
            for name, notifier in self.rules().notifiers.items()
            for i in range(len(notifier.urls))
        ]

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
        return notifier.urls[row.target]


def _traced(exchange: Exchange, failure: str | None = None) -> None:
    """The send's span gets its last HTTP request (the notifier's URL, without secrets, for
    a target apprise reaches by other means: no method then), and failure as its
    error.type (the worker puts an answer's status there instead)."""
    tracing.describe(None, tracing.client_request(exchange.method, exchange.url, failure))
