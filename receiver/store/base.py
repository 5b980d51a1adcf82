"""The store interface: what ingest, the router and the notifier workers need from storage."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from receiver.events import _Event as Event

if TYPE_CHECKING:
    from receiver.store.tx import SQLiteTx

T = TypeVar("T")

OnAccepted = Callable[[], None]
# held: waiting for a hold, an active window (defer) or a digest window to pass.
# The last six are suppressed notifications, kept with their reason.
OUTBOX_STATES = (
    "pending",
    "held",
    "sending",
    "delivered",
    "dead",
    "throttled",
    "cancelled",
    "muted",
    "silenced",
    "grouped",
    "stale",
)


@dataclass(frozen=True)
class StoredEvent:
    id: str
    type: str
    body: str
    received_at: float


@dataclass(frozen=True)
class Notification:
    """One notification the router wants sent: a future outbox row."""

    rule: str
    notifier: str
    target: int
    title: str
    body: str
    throttle_key: str | None = None
    throttle_seconds: float | None = None


@dataclass(frozen=True)
class OutboxRow:
    id: int
    event_id: str
    rule: str
    notifier: str
    target: int
    title: str
    body: str
    state: str
    attempts: int
    next_at: float
    created_at: float
    updated_at: float
    reason: str | None = None
    last_error: str | None = None
    kind: str = "event"

    @property
    def label(self) -> str:
        """A name for logs that never includes the target URL."""
        return f"{self.notifier}[{self.target}]"


class Store(Protocol):
    on_accepted: OnAccepted | None

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def accept(self, event: Event, raw: bytes) -> bool:
        """Keep event durably; True if new, False if its id was already stored."""

    def under_pressure(self) -> bool:
        """Whether ingest is in a burst just now (routing then gives way)."""

    async def quarantine(
        self, raw: bytes, *, reason: str, client: str | None, event_id: str | None
    ) -> None: ...
    async def check_writable(self) -> None:
        """Raise StorageUnavailableError unless a write transaction can start."""

    async def prune(self, before: float, *, limit: int) -> dict[str, int]:
        """Delete one batch (at most limit rows a table) received before `before`; the
        counts deleted by table: events, outbox, quarantine."""

    async def transact(self, fn: Callable[[SQLiteTx], T]) -> T:
        """Run fn in one write transaction: all of its writes commit, or none."""

    async def claim_due(
        self,
        *,
        now: float,
        limit: int,
        lease: float,
        lanes: Mapping[tuple[str, int], int] | None = None,
    ) -> list[OutboxRow]:
        """Lease due rows, oldest due first: up to lanes[(notifier, target)] of each target
        named, and up to limit of all other targets (of every target when lanes is None)."""

    async def release(self, row_ids: Sequence[int], *, now: float) -> int:
        """Give back claimed rows that were never sent: pending, due now, attempt uncounted."""

    async def next_due(self) -> float | None: ...
    async def mark_delivered(self, row_id: int, *, now: float) -> None: ...
    async def mark_failed(
        self, row_id: int, *, error: str, now: float, retry_at: float | None
    ) -> None: ...
    async def deliveries(
        self, *, state: str | None = None, event_id: str | None = None, limit: int = 50
    ) -> list[OutboxRow]: ...
    async def retry_dead(self, row_id: int | None, *, now: float) -> int: ...
    async def replay(self, event_id: str) -> bool: ...
