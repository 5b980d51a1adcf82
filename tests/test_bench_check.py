"""`make bench-check`'s verdict: the worst stream shape's ratio to the ceiling against the
committed one."""

from typing import Any

from bench.check import floor, verdict


def figures(worst: float | None, shape: str = "many") -> dict[str, Any]:
    return {
        "ratio": 0.40,  # the throughput part's: not what the guard compares
        "streams": {
            "written": "2026-11-27 06:00 UTC",
            "worst": {"shape": shape, "ratio": worst},
            "shapes": {shape: {"ratio": worst}},
            "runs": [],
        },
    }


def test_a_drop_of_the_worst_shape_within_the_tolerance_passes_and_beyond_it_fails() -> None:
    ok, line = verdict(figures(0.40), figures(0.35), 0.15)  # -12.5%
    assert ok and "-12.5%" in line
    ok, line = verdict(figures(0.40), figures(0.33), 0.15)  # -17.5%
    assert not ok and "-17.5%" in line
    assert verdict(figures(0.40), figures(0.52), 0.15)[0]  # faster is fine


def test_the_floor_is_compared_whichever_shape_sets_it() -> None:
    ok, line = verdict(figures(0.30, "simulator"), figures(0.24, "backfill"), 0.15)  # -20%
    assert not ok and "backfill" in line and "simulator" in line


def test_figures_from_before_the_streams_part_compare_the_throughput_ratio() -> None:
    old = {"ratio": 0.40, "written": "2026-11-26 07:59 UTC", "rounds": []}
    assert floor(old) == ("current (throughput part)", 0.40)
    assert verdict(old, figures(0.38), 0.15)[0]


def test_a_run_without_a_ratio_fails_rather_than_passing_silently() -> None:
    ok, line = verdict(figures(0.40), figures(None), 0.15)
    assert not ok and "no ratio" in line
    ok, line = verdict(figures(0.40), figures(0.0), 0.15)  # a shape never all routed
    assert not ok
