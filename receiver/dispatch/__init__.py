"""Dispatch: the router loop (router.py) takes stored events through the rules and the alert
lifecycle (pipeline.py) to outbox rows, in the store's transactions."""
