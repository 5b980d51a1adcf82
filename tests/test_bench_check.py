"""`make bench-check`'s verdict: the ratio to the ceiling against the committed one."""

from bench.check import verdict


def figures(ratio: float | None) -> dict[str, object]:
    return {"ratio": ratio, "written": "2026-11-23 22:00 UTC", "rounds": []}


def test_a_drop_within_the_tolerance_passes_and_beyond_it_fails() -> None:
    ok, line = verdict(figures(0.40), figures(0.35), 0.15)  # -12.5%
    assert ok and "-12.5%" in line
    ok, line = verdict(figures(0.40), figures(0.33), 0.15)  # -17.5%
    assert not ok and "-17.5%" in line
    assert verdict(figures(0.40), figures(0.52), 0.15)[0]  # faster is fine


def test_a_run_without_a_ratio_fails_rather_than_passing_silently() -> None:
    ok, line = verdict(figures(0.40), figures(None), 0.15)
    assert not ok and "no ratio" in line
