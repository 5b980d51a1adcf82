"""Every pair of a rule's lifecycle keys (the table in tests/dispatch/key_pairs.py): either
`receiver check` refuses the pair, saying why, or a small stream routed through it loses no
alert (every alert opened is paged, or has rows that say why not) and explain says what the
rows say. In process: the real Router on a real SQLite file, on a clock the test drives."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.events import iso_epoch, sample
from receiver.rules import load_text
from receiver.store.records import SENT_STATES, OutboxRow
from receiver.why import DECISIONS
from tests.dispatch.key_pairs import KEYS, T0, Built, at, rules_of, same_key
from tests.dispatch.routed import Routed

# The pairs that do not combine (docs/rules.md, "Which keys combine"). escalate with repeat
# is a rule that only escalates (no notify) and repeats: nothing of its own to repeat.
REFUSED = {
    frozenset(pair)
    for pair in [
        ("group", "storm"), ("group", "escalate"), ("group", "hold"), ("group", "resolve"),
        ("group", "repeat"), ("group", "throttle"), ("escalate", "throttle"),
        ("escalate", "repeat"), ("group", "flap"), ("flap", "throttle"),
    ]
}  # fmt: skip
PAIRS = [
    pytest.param(a, b, id=f"{a}+{b}")
    for a, b in itertools.combinations(KEYS, 2)
    if not same_key(a, b)
]
OPENERS = [f"d{i}" for i in range(5)]  # the drops that open alerts s0..s4
UNPAGED = ("stale", "silenced", "muted", "inhibited", "storm", "flapping")


def run_stream(routed: Routed, built: Built) -> list[str]:
    """Five alerts and what befalls them over an hour; the ids of the events sent."""
    start = T0.timestamp()
    sent: list[str] = []

    def send(kind: str, event_id: str, session: str, ts: float | None = None, **more: Any) -> None:
        stamp = at((routed.now if ts is None else ts) - start)
        routed.send(sample(kind, id=event_id, sessionId=session, timestamp=stamp, **more))
        sent.append(event_id)

    if built.silence:
        routed.silence({"sessionId": "s4"}, 20 * 60, "pairs")
    send("intervention.fired", "i1", "s1", interventionId="iv1")  # inhibits drops of s1
    for i, event_id in enumerate(OPENERS):
        routed.now += 1
        send("score.drop", event_id, f"s{i}", userId=f"u{i}")
    routed.advance(120)
    send("score.drop", "d0-again", "s0", userId="u0")  # the open alert again
    routed.advance(60)
    send("intervention.fired", "i3", "s3", interventionId="iv3")  # a target of "boss"
    send("score.recover", "r2", "s2")  # resolves s2
    routed.advance(540)
    send("intervention.resolved", "i1-end", "s1", interventionId="iv1")  # "covers" ends
    routed.advance(18 * 60)  # the silence ends at 20m
    send("score.drop", "d2-late", "s2", ts=start + 2)  # older than the recover: late
    routed.advance(30 * 60)
    return sent


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_every_pair_of_keys_is_refused_with_its_reason_or_loses_no_alert(
    tmp_path: Path, first: str, second: str
) -> None:
    built = rules_of(first, second)
    if frozenset({first, second}) in REFUSED:
        with pytest.raises(ConfigError) as refused:
            load_text(built.text, env={})
        said = [p for p in refused.value.problems if p.startswith('rule "r": ')]
        assert len(said) == 1 and any(f": {k}: " in said[0] for k in (first, second)), said
        path = tmp_path / "rules.yaml"
        path.write_text(built.text)
        checked = CliRunner().invoke(cli, ["check", str(path)])
        assert checked.exit_code == 1 and said[0] in " ".join(checked.output.split())
        return
    routed = Routed(tmp_path, built.text, T0.timestamp())
    try:
        sent = run_stream(routed, built)
        rows = routed.rows()
        no_alert_vanished(routed, rows)
        for event_id in sent:
            explained_as_recorded(routed, event_id, [r for r in rows if r.event_id == event_id])
    finally:
        routed.close()


def no_alert_vanished(routed: Routed, rows: list[OutboxRow]) -> None:
    """Each rule's rows of the opening of each alert still open: some, and each paged (or
    about to be: held) or kept with its reason."""
    rules = [name for name in ("r", "after") if name in routed.ruleset.by_name]
    still_open = {a.opened_event for a in routed.alerts()}
    assert still_open >= {"d0", "d1", "d3", "d4"}  # s2 recovered
    for event_id in OPENERS:
        if event_id not in still_open:
            continue
        for rule in rules:
            own = [r for r in rows if r.event_id == event_id and r.rule == rule]
            assert own, f"{event_id} (rule {rule}): no row at all, paged nor kept"
            if not any(r.state in (*SENT_STATES, "held") for r in own):
                assert all(r.reason for r in own), [(r.state, r.reason) for r in own]


def explained_as_recorded(routed: Routed, event_id: str, rows: list[OutboxRow]) -> None:
    found = routed.explain(event_id)
    routed_at = found["routedAt"]
    assert routed_at is not None, event_id
    for entry in found["rules"]:
        mine = [r for r in rows if r.rule == entry["rule"]]
        if "decision" not in entry:  # not matched, and nothing of the rule's came of it
            assert not entry["matched"] and not mine, (event_id, entry)
            continue
        assert [n["id"] for n in entry["notifications"]] == [str(r.id) for r in mine]
        decision, reason = entry["decision"], entry["reason"]
        assert not reason.startswith((f"{decision}:", f"{entry['rule']}:")), entry
        assert entry["states"][0]["decision"] == decision, entry
        if not entry["matched"]:  # the resolved messages of the event that closed an alert
            assert {r.kind for r in mine} == {"resolved"} and "resolved alert" in reason
            continue
        decided = [
            r
            for r in mine
            if iso_epoch(r.created_at) <= routed_at
            and (r.kind == "event" or (r.kind == "escalation" and r.state in UNPAGED))
        ]
        if decided:  # held rows stay held here: no notify worker releases them
            states = {"held" if r.state == "cancelled" else DECISIONS[r.state] for r in decided}
            assert decision in states, (event_id, entry, states)
        else:  # a rule that only escalates: its chain started then, or was running already
            rule = routed.ruleset.by_name[entry["rule"]]
            assert rule.escalate is not None and not rule.notify, (event_id, entry)
            alert = f"session:s{event_id[1]}"  # the stream's drops: d3, d3-again are s3's
            started = [iso_epoch(c.started_at) for c in routed.chains(alert) if c.rule == rule.name]
            if decision == "deduplicated":
                assert any(s < routed_at for s in started), (event_id, entry, started)
            else:
                assert decision in ("sent", "held") and routed_at in started, (event_id, entry)
        later = [r for r in mine if r.kind == "event" and iso_epoch(r.created_at) > routed_at]
        shown = [(s["decision"], s["at"]) for s in entry["states"]]
        for r in later:  # sent when what held it ended: a state of its own, with its time
            assert (DECISIONS[r.state], iso_epoch(r.created_at)) in shown, (entry, r)
