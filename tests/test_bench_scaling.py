"""`make bench`'s scaling part (bench/scaling_part.py): its figures from the runs' results,
two workers over one per round, a run never all routed left without a rate."""

from __future__ import annotations

import argparse
from typing import Any

from bench import scaling_part


def _run(sustained: float | None, cpu: float | None = 300.0) -> dict[str, Any]:
    return {
        "sustained_rps": sustained,
        "accepted_rps": 5_000.4,
        "p99_ms": 12.345,
        "cpu_us": cpu,
        "errors": "-",
        "load": "load 1.00 1.00 1.00",
    }


def test_a_run_is_set_against_the_mean_of_its_rounds_ceilings() -> None:
    row = scaling_part.row(2, 1, _run(3_000.0), [5_000.0, 7_000.0])
    assert (row["ceiling_rps"], row["ceiling_runs"], row["ratio"]) == (6_000, [5_000, 7_000], 0.5)
    assert (row["sustained_rps"], row["accepted_rps"], row["p99_ms"]) == (3_000, 5_000, 12.35)
    never_routed = scaling_part.row(2, 1, _run(None, None), [6_000.0])
    assert (never_routed["ratio"], never_routed["sustained_rps"], never_routed["cpu_us"]) == (
        None,
        None,
        None,
    )


def test_two_workers_over_one_is_taken_round_by_round() -> None:
    part = scaling_part
    rows = [
        part.row(1, 1, _run(2_000.0), [6_000.0]),
        part.row(2, 1, _run(3_000.0, 400.0), [6_000.0]),
        part.row(2, 2, _run(2_000.0, 500.0), [4_000.0]),  # round 2 ran two workers first
        part.row(1, 2, _run(2_500.0), [4_000.0]),
    ]
    summary = part.summarize(rows)
    assert summary["scaling"] == {1: 1.5, 2: 0.8}
    assert summary["scaling_mean"] == 1.15
    assert summary["workers"][1] == {
        "sustained_rps": 2_250,
        "ratio": round((2_000 / 6_000 + 2_500 / 4_000) / 2, 3),
        "p99_ms": 12.35,
        "cpu_us": 300,
    }
    assert summary["workers"][2]["cpu_us"] == 450
    args = argparse.Namespace(rounds=2, duration=15, warmup=3, connections=32)
    text = "\n".join(part.section(args, rows, summary, "Code: commit abc."))
    assert "Two workers over one: **1.15x** stored+routed/s (each round 1.50, 0.80)." in text
    assert "| 2 | 2,500 | 0.50x | 12.35 | 450 |" in text and "Code: commit abc." in text


def test_a_run_never_all_routed_leaves_its_count_and_the_round_without_a_figure() -> None:
    part = scaling_part
    rows = [part.row(1, 1, _run(2_000.0), [6_000.0]), part.row(2, 1, _run(None), [6_000.0])]
    summary = part.summarize(rows)
    assert summary["workers"][2]["sustained_rps"] is None and summary["workers"][2]["ratio"] is None
    assert summary["scaling"] == {} and summary["scaling_mean"] is None
    args = argparse.Namespace(rounds=1, duration=15, warmup=3, connections=32)
    text = "\n".join(part.section(args, rows, summary))
    assert "Two workers over one: **-x** stored+routed/s." in text
