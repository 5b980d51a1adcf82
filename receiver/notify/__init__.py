"""Notifications: the outbox worker and the apprise targets it sends through."""
