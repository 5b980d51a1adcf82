"""What the two SQL backends share: the roles of a Store and of a routing transaction,
wired once. Each backend subclasses these and brings its own connection handling, and
the few roles it runs its own way (SQLite's read-ahead, PostgreSQL's locks) it passes
in; every other role is the shared one, so a new role is added here, once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from receiver.events import BaseEvent
from receiver.store.alerts import ReadAhead, SQLAlerts, SQLTxNotices
from receiver.store.base import Accepted, OnAccepted, TxAlerts, TxEvents
from receiver.store.digests import SQLTxDigests
from receiver.store.escalations import SQLTxEscalations
from receiver.store.events import SQLEvents
from receiver.store.flaps import SQLTxFlaps
from receiver.store.history import SQLHistory
from receiver.store.inhibitors import SQLTxInhibitors
from receiver.store.keys import SQLKeys
from receiver.store.maintenance import SQLTxMaintenance
from receiver.store.outbox import SQLOutbox, SQLTxOutbox
from receiver.store.sessions import SQLSessions, SQLTxSessions
from receiver.store.silences import SQLTxSilences, StoreSilences, Transact
from receiver.store.state import SQLTxState
from receiver.store.statements import Dialect, Query, Statements
from receiver.store.stats import SQLStats
from receiver.store.storms import SQLTxStorms
from receiver.store.subscribers import SQLTxWebhooks
from receiver.store.threads import SQLThreads
from receiver.store.throttle import SQLTxThrottle
from receiver.store.upstream_state import SQLUpstream
from receiver.store.webhooks import SQLWebhooks

T = TypeVar("T")


class SQLStore:
    """The Store roles over a backend's statements: a backend runs statements (the
    Runner of receiver.store.statements) and passes in what differs, how an event is
    accepted, quarantined, replayed and pruned, how big the database is, and its
    routing transaction."""

    def __init__(
        self,
        dialect: Dialect,
        *,
        on_accepted: OnAccepted | None,
        clock: Callable[[], float],
        transact: Transact[Any],
        accept: Callable[[BaseEvent, bytes, str | None], Awaitable[Accepted]],
        quarantine: Callable[..., Awaitable[None]],
        replay: Callable[..., Awaitable[int | None]],
        prune: Callable[..., Awaitable[dict[str, int]]],
        size: Callable[[], Awaitable[int]],
    ) -> None:
        self.dialect = dialect
        self.on_accepted = on_accepted
        # Told how long each cycle's statements held the event loop (Store.on_cycle).
        self.on_cycle: Callable[[float], None] | None = None
        self.clock = clock
        self.schema_version = 0  # once open: the schema it was migrated to
        self.sessions = SQLSessions(self)
        self.keys = SQLKeys(self)
        self.upstream = SQLUpstream(self)
        self.threads = SQLThreads(self)
        self.history = SQLHistory(self)
        self.events = SQLEvents(
            self, accept=accept, quarantine=quarantine, replay=replay, prune=prune
        )
        self.alerts = SQLAlerts(self)
        self.silences = StoreSilences(transact)
        self.stats = SQLStats(self, size=size)
        self.outbox = SQLOutbox(self)
        self.webhooks = SQLWebhooks(self)

    async def statements(self, fn: Callable[[Query], T], *, write: bool = True) -> T:
        """fn(query) in one transaction of the store (the writer's, on SQLite)."""
        raise NotImplementedError

    async def read(self, fn: Callable[[Query], T]) -> T:
        """fn(query) in a read transaction off the event loop, beside the writer."""
        raise NotImplementedError


class SQLTx:
    """A Tx (receiver.store.base) over one open transaction's statements: its roles share
    them. A backend passes in the roles it runs its own way (events and alerts, each
    backend's: receiver.store.events.SQLTxEvents and receiver.store.alerts.SQLTxAlerts
    leave a part to it); the rest are the shared ones."""

    def __init__(
        self,
        st: Statements,
        ahead: ReadAhead,
        *,
        events: TxEvents,
        alerts: TxAlerts,
        webhooks: SQLTxWebhooks | None = None,
        notices: SQLTxNotices | None = None,
        escalations: SQLTxEscalations | None = None,
        digests: SQLTxDigests | None = None,
        flaps: SQLTxFlaps | None = None,
    ) -> None:
        self.events = events
        self.webhooks = webhooks or SQLTxWebhooks(st)
        self.sessions = SQLTxSessions(st)
        self.outbox = SQLTxOutbox(st, ahead)
        self.alerts = alerts
        self.notices = notices or SQLTxNotices(st, ahead)
        self.escalations = escalations or SQLTxEscalations(st)
        self.inhibitors = SQLTxInhibitors(st)
        self.digests = digests or SQLTxDigests(st)
        self.throttle = SQLTxThrottle(st)
        self.storms = SQLTxStorms(st)
        self.flaps = flaps or SQLTxFlaps(st)
        self.maintenance = SQLTxMaintenance(st)
        self.silences = SQLTxSilences(st)
        self.state = SQLTxState(st)
