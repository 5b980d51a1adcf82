"""`make bench`'s stream shapes (bench/streams.py): valid signed events of the shape each
claims, and the simulator shape the very events `receiver simulate`'s engine sends."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench import load, stream_part, streams
from receiver import events, rules, signature
from receiver.simulator.walk import timestamp
from tests.simulator.test_sender import START, FakeReceiver, _run
from tests.simulator.test_simulate import Options as SimOptions


@pytest.mark.parametrize("shape", streams.SHAPES, ids=streams.NAMES)
def test_every_shape_writes_signed_events_the_receiver_accepts(
    shape: streams.Shape, tmp_path: Path
) -> None:
    sent = shape.deliveries(3000, 1, "t")
    path = tmp_path / "stream.tsv"
    streams.write(path, sent, "bench-secret")
    now = datetime.now(UTC)
    lines = path.read_text().splitlines()
    assert len(lines) == len(sent) == 3000
    for line in lines:
        header, body = line.split("\t")
        signature.verify([b"bench-secret"], body.encode(), header)
        event = events.parse(body.encode())
        age = now - event.timestamp
        assert timedelta(0) < age < timedelta(days=7)  # RECEIVER_MAX_EVENT_AGE's default


def test_many_cycles_thousands_of_sessions_hundreds_of_users_and_every_type() -> None:
    sent = streams.cycling_events(20_000, 1, "t")
    assert len({e["sessionId"] for e in sent}) == 5000
    assert len({e["userId"] for e in sent}) == 700
    kinds = Counter(e["type"] for e in sent)
    assert set(kinds) == set(events.EVENT_TYPES) and len(set(kinds.values())) == 1
    one_session = [e["type"] for e in sent if e["sessionId"] == "sess_t_0003"]
    assert len(set(one_session)) == 4  # each session goes through the types in turn


def test_backfill_is_days_old_in_time_order() -> None:
    sent = streams.backfill_events(5000, 1, "t")
    when = [datetime.fromisoformat(e["timestamp"]) for e in sent]
    assert when == sorted(when)
    now = datetime.now(UTC)
    assert now - when[0] > timedelta(days=5.9) and now - when[-1] > timedelta(days=0.9)


def test_most_shared_type_rules_share_score_drop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_SINK_PORT", "9")
    ruleset = rules.load_file(streams.BENCH / "rules-shared-type.yaml")
    on_drop = [r for r in ruleset.rules if r.may_match_type("score.drop")]
    assert len(on_drop) == 24 and len(ruleset.rules) == 30
    sent = streams.shared_type_events(20_000, 1, "t")
    matching = sum(1 for e in sent if ruleset.route(e))
    assert 0 < matching < 0.01 * len(sent)


def test_the_simulator_shape_is_what_the_engine_sends() -> None:
    options = SimOptions(sessions=5, duration=30, tick=1, duplicates=0.25)
    sim, _ = _run(FakeReceiver(), options, seed=7)
    sent = [json.loads(item.body) for item in sim.tracked.values()]
    emitted, deliveries = streams.simulate(7, "t", sessions=5, duration=30, duplicates=0.25)
    ours = [{**e, "timestamp": timestamp(START + timedelta(seconds=at))} for at, e in emitted]
    assert [{**e, "timestamp": ""} for e in ours] == [{**e, "timestamp": ""} for e in sent]
    for mine, theirs in zip(ours, sent, strict=True):
        gap = datetime.fromisoformat(mine["timestamp"]) - datetime.fromisoformat(
            theirs["timestamp"]
        )
        assert abs(gap) <= timedelta(milliseconds=1)
    twice = {event["id"] for event, n in _counts(deliveries) if n == 2}
    assert twice and twice == {item.id for item in sim.tracked.values() if item.duplicate}


def _counts(deliveries: list[dict[str, object]]) -> list[tuple[dict[str, object], int]]:
    counted = Counter(id(event) for event in deliveries)
    unique = {id(event): event for event in deliveries}
    return [(unique[key], n) for key, n in counted.items()]


def _row(shape: str, ratio: float | None) -> dict[str, Any]:
    return {
        "shape": shape,
        "round": 1,
        "ceiling_rps": 10_000,
        "ceiling_runs": [9_000, 11_000],
        "accepted_rps": 4_000,
        "sustained_rps": None if ratio is None else round(ratio * 10_000),
        "ratio": ratio,
        "p99_ms": 12.0,
        "lag_max_s": None if ratio is None else 0.4,
        "lag_p99_s": None if ratio is None else 0.3,
        "cpu_us": 200.0,
        "errors": "-",
        "load": "load 1.00 1.00 1.00",
        "paced": None,
        "notes": "",
    }


def test_the_worst_shape_is_the_lowest_ratio_and_one_never_routed_is_worse() -> None:
    part = stream_part
    rows = [_row("current", 0.40), _row("many", 0.25), _row("simulator", 0.31)]
    summary = part.summarize(rows)
    assert summary["worst"] == {"shape": "many", "ratio": 0.25}
    args = argparse.Namespace(rounds=1, duration=15, warmup=3, connections=32, paced=0.0)
    text = "\n".join(part.section(args, rows, summary, {}, "Code: commit abc."))
    assert "Worst shape: **many**, 0.25x" in text and "Code: commit abc." in text
    summary = part.summarize([*rows, _row("backfill", None)])
    assert summary["worst"] == {"shape": "backfill", "ratio": 0.0}


def test_the_loop_hold_is_the_runs_cycles_by_bucket() -> None:
    run = load
    before = {0.001: 10.0, 0.01: 20.0, 0.1: 20.0, float("inf"): 20.0}
    # The run's own 1,000 cycles: 980 under 1 ms, 15 under 10 ms, 5 under 100 ms.
    after = {0.001: 990.0, 0.01: 1015.0, 0.1: 1020.0, float("inf"): 1020.0}
    assert run.hold_ms(before, after) == (10.0, 100.0)
    assert run.hold_ms(after, after) is None  # no cycle in the run
    assert run.hold_ms(after, before) is None  # another worker's figures: not comparable
    part = stream_part
    rows = [
        {**_row("current", 0.4), "hold_ms": [10.0, 100.0]},
        {**_row("current", 0.4), "round": 2, "hold_ms": [20.0, 50.0]},
    ]
    summary = part.summarize(rows)
    assert summary["shapes"]["current"]["hold_ms"] == [20.0, 100.0]
