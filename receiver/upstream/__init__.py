"""The upstream service, as a client (RECEIVER_UPSTREAM_URL, _KEY, _PLAN, _TIMEOUT): its API
within the plan's budget (client), enrichment of notifications (enrich) and the backfill
of the session projection (sync). Without the URL and the key, none of it runs."""

from __future__ import annotations

from receiver.settings import Settings
from receiver.store import Store
from receiver.upstream.client import LocalBudget, StoreBudget, UpstreamClient


def client_for(
    settings: Settings, store: Store | None, *, timeout: float = 10.0
) -> UpstreamClient | None:
    """The upstream client the settings describe, drawing on the store's shared budget
    (without a store, on one of this process only); None when RECEIVER_UPSTREAM_URL or
    RECEIVER_UPSTREAM_KEY is not set."""
    if not settings.upstream_configured:
        return None
    assert settings.upstream_url is not None and settings.upstream_key is not None
    return UpstreamClient(
        settings.upstream_url,
        settings.upstream_key,
        budget=(
            StoreBudget(store, settings.upstream_plan)
            if store is not None
            else LocalBudget(settings.upstream_plan)
        ),
        timeout=timeout,
    )
