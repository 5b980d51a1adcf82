"""Dispatch: the router loop (router.py) takes stored events through the rules and the alert
lifecycle to outbox rows, in the store's transactions: alerts.py (the alert state machine),
pipeline.py (where each notification goes), digests.py, silences.py, timers.py (repeats and
the heartbeat), explain.py (`receiver explain`), fanout.py (the subscribers' deliveries)."""
