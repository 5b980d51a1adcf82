"""dispatch.maintenance's stretches near the clock, kept between timer turns: the same as
working them out afresh at every instant, across both DST changes of 2026 in two zones."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from receiver.dispatch import maintenance
from receiver.rules.maintenance import next_boundary
from tests.rules.test_maintenance import ZONES, _window


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize("month, day", [(3, 24), (10, 21)])  # the weeks of both changes
def test_kept_stretches_are_what_a_fresh_look_finds(tz: str, month: int, day: int) -> None:
    window = _window(tz, "seconds")
    t = datetime(2026, month, day, tzinfo=UTC).timestamp()
    end, looks, fresh_looks = t + 9 * 86400, 0, 0
    while t < end:
        before = maintenance._near.get(window)
        spans, following = maintenance._stretches(window, t)
        fresh_looks += maintenance._near.get(window) is not before
        expected = window.spans(t - maintenance.LOOKBACK, t + 1)
        assert (spans, following) == (expected, next_boundary((window,), t)), t
        looks += 1
        t += 613.0  # an odd step: instants on, just before and after boundaries
    # Worked out again only at boundaries (and the first look), not at each turn.
    assert fresh_looks < looks / 4, (fresh_looks, looks)
