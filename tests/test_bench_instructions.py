"""bench/instructions.py's pure parts: valgrind's count read, and the table's arithmetic."""

from __future__ import annotations

import pytest

from bench import instructions, streams


def test_the_count_is_valgrinds_last_total() -> None:
    part = instructions
    text = "==1== I   refs:      39,601,328\n==2== I   refs:      1,234\n"
    assert part.refs(text) == 1234
    with pytest.raises(RuntimeError, match="no instruction count"):
        part.refs("valgrind: command not found")


def test_the_table_splits_the_receiver_into_its_parts() -> None:
    part = instructions
    shape = streams.SHAPES[streams.NAMES.index("shared-type")]
    figures = {
        "ceiling": 400_000.0, "receiver": 1_200_000.0, "bare": 1_000_000.0,
        "ingest": 100_000.0, "store": 150_000.0, "route": 450_000.0,
        "route-bare": 300_000.0, "route-noproj": 320_000.0,
    }  # fmt: skip
    text = "\n".join(part.report(shape, 2000, figures))
    assert (
        "| the receiver, whole (`receiver serve`, stored, routed, sent) | 1,200 | 100% | 3.00x |"
        in text
    )
    assert "| - of which the rules (routing less routing with no rule) | 150 |" in text
    assert "| - of which the session projection (routing less routing without it) | 130 |" in text
    # The rest: the whole less ingest, the store and routing.
    assert "| the rest: HTTP, the event loop, sends, timers (whole less the parts) | 500 |" in text
    assert "about 0.33x of the ceiling" in text and "(0.40x)" in text
