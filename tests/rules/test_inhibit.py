"""rules.yaml `inhibit:`: each bad inhibition rule is refused with a message naming the rule
and the key; Inhibition.key (the equal fields' values, None when one is missing); and what
`receiver check` says of an inhibition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from receiver import rules
from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.rules.inhibit import Inhibition

HEAD = """\
notifiers:
  hook: json://127.0.0.1:9/hook
rules:
  - {name: drop, match: {type: score.drop}, notify: hook}
inhibit:
"""
GOOD = """\
  - name: intervention-covers-drop
    source: {type: intervention.fired}        # any match expression, as in rules
    target: {type: score.drop}
    equal: [sessionId]                         # fields that must be present AND equal on both
"""
SOURCE = "{type: intervention.fired}"
TARGET = "{type: score.drop}"


def one(
    name: str = "covers", source: str = SOURCE, target: str = TARGET, equal: str = "[sessionId]"
) -> str:
    """A file with one inhibition rule, written as a flow mapping."""
    return HEAD + f"  - {{name: {name}, source: {source}, target: {target}, equal: {equal}}}\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        rules.load_text(text)
    return caught.value.problems


def test_the_example_loads() -> None:
    [rule] = rules.load_text(HEAD + GOOD).inhibit
    assert rule.name == "intervention-covers-drop"
    assert rule.equal == ("sessionId",)
    assert rule.is_source({"type": "intervention.fired", "sessionId": "s1"})
    assert not rule.is_source({"type": "score.drop", "sessionId": "s1"})
    assert rule.is_target({"type": "score.drop", "sessionId": "s1"})
    assert not rule.is_target({"type": "intervention.fired", "sessionId": "s1"})


def test_rules_keep_their_file_order() -> None:
    second = GOOD.replace("intervention-covers-drop", "second").replace("[sessionId]", "[userId]")
    found = rules.load_text(HEAD + GOOD + second).inhibit
    assert [r.name for r in found] == ["intervention-covers-drop", "second"]


def test_a_file_without_inhibit_has_none() -> None:
    assert rules.load_text(HEAD.removesuffix("inhibit:\n")).inhibit == ()
    assert rules.load_text(HEAD).inhibit == ()  # `inhibit:` with nothing under it


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            HEAD + "  - {name: c, source: {type: intervention.fired}, target: {type: score.drop},"
            " equal: [sessionId], when: always}\n",
            'inhibit "c": unknown key "when"; allowed: name, source, target, equal',
            id="unknown-key",
        ),
        pytest.param(
            HEAD + "  - {name: c, target: {type: score.drop}, equal: [sessionId]}\n",
            'inhibit "c": missing required key "source"',
            id="missing-source",
        ),
        pytest.param(
            HEAD + "  - {name: c, source: {type: intervention.fired}, equal: [sessionId]}\n",
            'inhibit "c": missing required key "target"',
            id="missing-target",
        ),
        pytest.param(
            HEAD
            + "  - {name: c, source: {type: intervention.fired}, target: {type: score.drop}}\n",
            'inhibit "c": missing required key "equal"',
            id="missing-equal",
        ),
        pytest.param(
            HEAD + "  - {source: {type: intervention.fired}, target: {type: score.drop},"
            " equal: [sessionId]}\n",
            'inhibit #1: missing required key "name"',
            id="missing-name",
        ),
        pytest.param(
            one(name="'-covers'"),
            "inhibit \"-covers\": name: invalid name; allowed: letters, digits, '_', '.', '-',"
            " starting with a letter or digit",
            id="invalid-name",
        ),
        pytest.param(
            one(name="'two words'"),
            'inhibit "two words": name: invalid name;',
            id="name-with-a-space",
        ),
        pytest.param(
            one(name="[x]"),
            "inhibit #1: name: invalid name;",
            id="name-not-text",
        ),
        pytest.param(
            one() + "  - {name: covers, source: {type: intervention.fired},"
            " target: {type: score.drop}, equal: [userId]}\n",
            'inhibit "covers": duplicate inhibition name "covers"; names must be unique',
            id="duplicate-name",
        ),
        pytest.param(
            one(equal="[]"),
            'inhibit "covers": equal: expected a non-empty list of payload fields (such as'
            " [sessionId]) that must be present and equal on both sides",
            id="empty-equal",
        ),
        pytest.param(
            one(equal="''"),
            'inhibit "covers": equal: expected payload field names, got ""',
            id="equal-empty-text",
        ),
        pytest.param(
            one(equal="[sessionId, userId, sessionId]"),
            'inhibit "covers": equal: "sessionId" is listed twice',
            id="equal-listed-twice",
        ),
        pytest.param(
            one(equal="[meta..team]"),
            'inhibit "covers": equal: expected payload field names, got "meta..team"',
            id="equal-empty-path-part",
        ),
        pytest.param(
            one(equal="[sessionId, 3]"),
            'inhibit "covers": equal: expected payload field names, got 3',
            id="equal-not-text",
        ),
        pytest.param(
            one(source=TARGET, target=TARGET),
            'inhibit "covers": source and target match the same events: each alert would mute'
            " the next one like it; make target narrower (or source)",
            id="inhibits-itself",
        ),
        pytest.param(
            one(
                source="{type: score.drop, score: {lt: 10}}",
                target="{score: {lt: 10}, type: score.drop}",
            ),
            'inhibit "covers": source and target match the same events',
            id="inhibits-itself-keys-in-another-order",
        ),
        pytest.param(
            one(source="{type: score.recover}"),
            'inhibit "covers": source: matches no event that opens an alert (score.drop,'
            " intervention.fired); an inhibition lasts while its source alert is open",
            id="source-opens-no-alert",
        ),
        pytest.param(
            one(source="{type: [score.recover, session.stopped]}"),
            'inhibit "covers": source: matches no event that opens an alert',
            id="source-any-of-closers",
        ),
        pytest.param(
            one(source="{type: intervention.fired, score: {lt: x}}"),
            'inhibit "covers": source.score: lt: expected a number, got "x"',
            id="bad-source-expression",
        ),
        pytest.param(
            one(target="{type: score.drop, score: {below: 3}}"),
            'inhibit "covers": target.score: unknown operator "below"; allowed: lt, lte, gt,'
            " gte, eq, between",
            id="bad-target-expression",
        ),
        pytest.param(
            one(source="{}"),
            'inhibit "covers": source: expected a non-empty match expression (as a rule\'s match)',
            id="empty-source",
        ),
        pytest.param(
            one(target="score.drop"),
            'inhibit "covers": target: expected a non-empty match expression',
            id="target-not-a-mapping",
        ),
        pytest.param(
            HEAD.replace("inhibit:\n", "inhibit: {covers: 1}\n"),
            "inhibit: expected a list of inhibition rules, got",
            id="not-a-list",
        ),
        pytest.param(
            HEAD + "  - covers\n",
            'inhibit #1: expected a mapping with keys name, source, target, equal, got "covers"',
            id="rule-not-a-mapping",
        ),
    ],
)
def test_a_bad_inhibition_is_refused_naming_rule_and_key(text: str, message: str) -> None:
    found = problems(text)
    assert any(p.startswith(message) for p in found), found


def test_every_problem_of_a_rule_is_reported_at_once() -> None:
    text = HEAD + "  - {name: c, source: {type: score.recover}, equal: [], when: now}\n"
    assert problems(text) == [
        'inhibit "c": unknown key "when"; allowed: name, source, target, equal',
        'inhibit "c": missing required key "target"',
        'inhibit "c": equal: expected a non-empty list of payload fields (such as [sessionId])'
        " that must be present and equal on both sides",
        'inhibit "c": source: matches no event that opens an alert (score.drop,'
        " intervention.fired); an inhibition lasts while its source alert is open",
    ]


def test_two_bad_sides_are_not_also_called_the_same() -> None:
    """Both sides refused: each says why, and they are not also 'the same events' (two
    empty expressions compare equal, but neither matches anything)."""
    found = problems(one(source="{}", target="[]"))
    assert found == [
        'inhibit "covers": source: expected a non-empty match expression (as a rule\'s match)',
        'inhibit "covers": target: expected a non-empty match expression (as a rule\'s match)',
    ]


def test_a_narrower_target_of_the_same_type_is_allowed() -> None:
    [rule] = rules.load_text(
        one(source="{type: score.drop, score: {lt: 10}}", target="{type: score.drop}")
    ).inhibit
    assert rule.is_target({"type": "score.drop", "score": 30})
    assert not rule.is_source({"type": "score.drop", "score": 30})


def test_a_source_without_a_type_may_open_an_alert() -> None:
    [rule] = rules.load_text(one(source="{userId: u1}", target="{type: score.drop}")).inhibit
    assert rule.is_source({"type": "intervention.fired", "userId": "u1"})


# -- Inhibition.key ----------------------------------------------------------------------------


def rule(*equal: str) -> Inhibition:
    return Inhibition("covers", (), (), equal)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({"userId": "u1"}, id="missing"),
        pytest.param({"sessionId": None, "userId": "u1"}, id="null"),
        pytest.param({"sessionId": "s1"}, id="second-missing"),
        pytest.param({"sessionId": "s1", "userId": None}, id="second-null"),
        pytest.param({}, id="none-at-all"),
    ],
)
def test_a_missing_or_null_field_gives_no_key(payload: dict[str, Any]) -> None:
    assert rule("sessionId", "userId").key(payload) is None


def test_equal_values_give_equal_keys_whatever_else_differs() -> None:
    covers = rule("sessionId", "userId")
    source = {"type": "intervention.fired", "sessionId": "s1", "userId": "u1", "id": "e1"}
    target = {"type": "score.drop", "sessionId": "s1", "userId": "u1", "score": 3, "id": "e2"}
    assert covers.key(source) is not None
    assert covers.key(source) == covers.key(target)
    assert covers.key(source) != covers.key({**target, "userId": "u2"})
    # The fields keep their places: the values swapped are another key.
    assert covers.key({"sessionId": "a", "userId": "b"}) != covers.key(
        {"sessionId": "b", "userId": "a"}
    )


def test_a_dotted_path_reads_nested_fields() -> None:
    covers = rule("meta.team", "items.0")
    payload = {"meta": {"team": "core"}, "items": ["x", "y"]}
    assert covers.key(payload) == covers.key({"meta": {"team": "core", "x": 1}, "items": ["x"]})
    assert covers.key(payload) != covers.key({"meta": {"team": "edge"}, "items": ["x"]})
    assert covers.key({"meta": {"other": "core"}, "items": ["x"]}) is None
    assert covers.key({"meta": "core", "items": ["x"]}) is None  # not a mapping: missing
    assert covers.key({"meta": {"team": "core"}, "items": []}) is None
    assert covers.key({"meta": {"team": None}, "items": ["x"]}) is None


def test_a_key_with_a_dot_in_its_name_wins_over_the_nested_reading() -> None:
    covers = rule("meta.team")
    assert covers.key({"meta.team": "a", "meta": {"team": "b"}}) == covers.key(
        {"meta": {"team": "a"}}
    )


@pytest.mark.parametrize(
    ("one_value", "other"),
    [
        pytest.param(1, "1", id="number-and-text"),
        pytest.param(True, 1, id="true-and-1"),
        pytest.param(False, 0, id="false-and-0"),
        pytest.param(True, "true", id="true-and-text"),
        pytest.param([1], "[1]", id="list-and-text"),
        pytest.param({"a": 1}, '{"a":1}', id="object-and-text"),
        pytest.param([1, 2], [2, 1], id="list-order"),
        pytest.param("", " ", id="empty-and-space"),
    ],
)
def test_values_of_different_json_types_differ(one_value: Any, other: Any) -> None:
    covers = rule("sessionId")
    first, second = covers.key({"sessionId": one_value}), covers.key({"sessionId": other})
    assert first is not None and second is not None
    assert first != second


def test_an_object_value_is_the_same_whatever_its_key_order() -> None:
    covers = rule("sessionId")
    assert covers.key({"sessionId": {"a": 1, "b": [2]}}) == covers.key(
        {"sessionId": {"b": [2], "a": 1}}
    )


def test_false_zero_and_empty_text_are_present() -> None:
    covers = rule("sessionId")
    values: list[Any] = [False, 0, "", [], {}]
    for value in values:
        assert covers.key({"sessionId": value}) is not None, value


# -- receiver check ----------------------------------------------------------------------------


def test_check_lists_the_inhibition(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        HEAD
        + GOOD
        + "  - {name: deep, source: {type: score.drop, score: {lt: 5}},"
        + " target: {type: score.drop, score: {gte: 5}}, equal: [userId, meta.team]}\n"
    )
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert (
        'inhibit intervention-covers-drop: {"type": "score.drop"} muted while'
        ' {"type": "intervention.fired"} is open, equal sessionId'
    ) in lines
    assert (
        'inhibit deep: {"type": "score.drop", "score": {"gte": 5}} muted while'
        ' {"type": "score.drop", "score": {"lt": 5}} is open, equal userId, meta.team'
    ) in lines
    shown = [line for line in lines if line.startswith("inhibit ")]
    assert [line.split(":")[0] for line in shown] == [
        "inhibit intervention-covers-drop",
        "inhibit deep",
    ]


def test_check_reports_a_bad_inhibition(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(one(source="{type: score.recover}", equal="[sessionId, sessionId]"))
    result = CliRunner().invoke(cli, ["check", str(path)])
    assert result.exit_code == 1, result.output
    assert 'inhibit "covers": equal: "sessionId" is listed twice' in result.output
    assert 'inhibit "covers": source: matches no event that opens an alert' in result.output


def test_numbers_equal_as_matching_sees_them_give_equal_keys() -> None:
    """1 and 1.0 are the same value to a match; so to equal (a sender may write either)."""
    covers = rule("level", "meta")
    assert covers.key({"level": 1, "meta": {"n": [2]}}) == covers.key(
        {"level": 1.0, "meta": {"n": [2.0]}}
    )
    assert covers.key({"level": 1, "meta": 0}) != covers.key({"level": 1.5, "meta": 0})
    assert covers.key({"level": True, "meta": 0}) != covers.key({"level": 1, "meta": 0})
