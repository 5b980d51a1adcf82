"""Shared fixtures: real local servers that catch notifications."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import HTTPSink, SMTPSink


@pytest.fixture
def http_sink() -> Iterator[HTTPSink]:
    """A running HTTPSink on a free port, stopped after the test."""
    sink = HTTPSink().start()
    try:
        yield sink
    finally:
        sink.stop()


@pytest.fixture
def smtp_sink() -> Iterator[SMTPSink]:
    """A running SMTPSink (plain SMTP, optional AUTH) on a free port, stopped after the test."""
    sink = SMTPSink().start()
    try:
        yield sink
    finally:
        sink.stop()
