"""Fault scenarios (kill -9, SIGTERM, outage, slow notifier) and `make chaos`."""
