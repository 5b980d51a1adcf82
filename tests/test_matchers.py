"""Matching: every form a `match:` value takes, with the reason explain shows for it."""

from __future__ import annotations

import copy
import json
import pickle
import time
from typing import Any

import pytest
import yaml

from receiver import rules
from receiver.matchers import compile_match, lookup
from tests.samples import sample

EVENT = sample(
    **{
        "ratio": 0.5,
        "flagged": True,
        "note": None,
        "tags": ["urgent", "mobile"],
        "meta": {"page": "/checkout", "step": 3, "items": [{"sku": "a1"}]},
        "a.b": "literal dotted key",
    }
)


def verdicts(match_yaml: str, payload: dict[str, Any] = EVENT) -> list[tuple[bool, str]]:
    conditions, problems = compile_match(yaml.safe_load(match_yaml))
    assert problems == []
    return [c.test(payload) for c in conditions]


def one(ok: bool, reason: str) -> list[tuple[bool, str]]:
    return [(ok, reason)]


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        # exact strings
        pytest.param(
            "type: score.drop",
            one(True, 'type: "score.drop" is "score.drop"'),
            id="exact-string-matches",
        ),
        pytest.param(
            "type: score.recover",
            one(False, 'type: "score.drop" is not "score.recover"'),
            id="exact-string-differs",
        ),
        pytest.param(
            "type: Score.Drop",
            one(False, 'type: "score.drop" is not "Score.Drop"'),
            id="exact-string-is-case-sensitive",
        ),
        pytest.param(
            "score: '20'",
            one(False, "score: 20 is not a string"),
            id="string-never-matches-a-number",
        ),
        # globs
        pytest.param(
            "type: score.*", one(True, 'type: "score.drop" matches glob "score.*"'), id="glob-star"
        ),
        pytest.param(
            "type: session.*",
            one(False, 'type: "score.drop" does not match glob "session.*"'),
            id="glob-star-differs",
        ),
        pytest.param(
            "userId: user_4?",
            one(True, 'userId: "user_42" matches glob "user_4?"'),
            id="glob-question-mark",
        ),
        pytest.param(
            "userId: 'user_[0-3]*'",
            one(False, 'userId: "user_42" does not match glob "user_[0-3]*"'),
            id="glob-character-class",
        ),
        # regexes
        pytest.param(
            "userId: '~^user_(4|5)'",
            one(True, 'userId: "user_42" matches regex "^user_(4|5)"'),
            id="regex-matches",
        ),
        pytest.param(
            "userId: '~_4'",
            one(True, 'userId: "user_42" matches regex "_4"'),
            id="regex-searches-anywhere",
        ),
        pytest.param(
            "userId: '~(?i)^USER_'",
            one(True, 'userId: "user_42" matches regex "(?i)^USER_"'),
            id="regex-inline-flags",
        ),
        pytest.param(
            "userId: '~^user_(1|3)'",
            one(False, 'userId: "user_42" does not match regex "^user_(1|3)"'),
            id="regex-differs",
        ),
        # numbers and booleans
        pytest.param("score: 20", one(True, "score: 20 is 20"), id="number-equal"),
        pytest.param("score: 20.0", one(True, "score: 20 is 20.0"), id="int-equals-float"),
        pytest.param("score: 21", one(False, "score: 20 is not 21"), id="number-differs"),
        pytest.param("flagged: true", one(True, "flagged: true is true"), id="bool-equal"),
        pytest.param(
            "flagged: 1", one(False, "flagged: true is not 1"), id="true-is-not-the-number-1"
        ),
        pytest.param(
            "userId: 42",
            one(False, 'userId: "user_42" is not 42'),
            id="number-never-matches-a-string",
        ),
        # operators
        pytest.param("score: {lt: 30}", one(True, "score: 20 is lt 30"), id="lt"),
        pytest.param("score: {lt: 20}", one(False, "score: 20 is not lt 20"), id="lt-is-strict"),
        pytest.param("score: {lte: 20}", one(True, "score: 20 is lte 20"), id="lte"),
        pytest.param("score: {gt: 20}", one(False, "score: 20 is not gt 20"), id="gt-is-strict"),
        pytest.param("score: {gte: 20}", one(True, "score: 20 is gte 20"), id="gte"),
        pytest.param("score: {eq: 20}", one(True, "score: 20 is eq 20"), id="eq"),
        pytest.param("ratio: {lt: 0.75}", one(True, "ratio: 0.5 is lt 0.75"), id="float"),
        pytest.param(
            "score: {between: [20, 30]}",
            one(True, "score: 20 is between 20 and 30"),
            id="between-is-inclusive",
        ),
        pytest.param(
            "score: {between: [21, 30]}",
            one(False, "score: 20 is not between 21 and 30"),
            id="between-outside",
        ),
        pytest.param(
            "score: {gte: 10, lt: 30}",
            one(True, "score: 20 is gte 10 and lt 30"),
            id="several-operators-all-hold",
        ),
        pytest.param(
            "score: {gte: 10, lt: 15}",
            one(False, "score: 20 is not lt 15"),
            id="several-operators-one-fails",
        ),
        pytest.param(
            "userId: {lt: 30}",
            one(False, 'userId: "user_42" is not a number'),
            id="operator-on-a-string-never-matches",
        ),
        pytest.param(
            "flagged: {eq: 1}",
            one(False, "flagged: true is not a number"),
            id="operator-on-a-boolean-never-matches",
        ),
        pytest.param(
            "note: {lt: 1}",
            one(False, "note: null is not a number"),
            id="operator-on-null-never-matches",
        ),
        # lists: any of
        pytest.param(
            "type: [score.recover, score.drop]",
            one(True, 'type: "score.drop" is "score.drop"'),
            id="list-any-item",
        ),
        pytest.param(
            "score: [{lt: 10}, {gt: 90}, 20]", one(True, "score: 20 is 20"), id="list-mixes-forms"
        ),
        pytest.param(
            "type: [session.*, '~^intervention']",
            one(
                False,
                'type: none of the alternatives holds: "score.drop" does not match glob '
                '"session.*"; "score.drop" does not match regex "^intervention"',
            ),
            id="list-no-item-holds",
        ),
        # fields
        pytest.param(
            "sessionId: sess_1\nuserId: '~^user_'",
            [
                (True, 'sessionId: "sess_1" is "sess_1"'),
                (True, 'userId: "user_42" matches regex "^user_"'),
            ],
            id="every-condition-is-tested",
        ),
        pytest.param("missing: x", one(False, "missing: field missing"), id="missing-field"),
        pytest.param(
            "missing: {lt: 1}",
            one(False, "missing: field missing"),
            id="missing-field-under-operator",
        ),
        pytest.param(
            "meta.page: /check*",
            one(True, 'meta.page: "/checkout" matches glob "/check*"'),
            id="dotted-path",
        ),
        pytest.param(
            "meta.step: {gte: 3}", one(True, "meta.step: 3 is gte 3"), id="dotted-path-number"
        ),
        pytest.param(
            "meta.items.0.sku: a1",
            one(True, 'meta.items.0.sku: "a1" is "a1"'),
            id="dotted-path-list-index",
        ),
        pytest.param(
            "meta.nope: x", one(False, "meta.nope: field missing"), id="dotted-path-missing"
        ),
        pytest.param(
            "a.b: literal*",
            one(True, 'a.b: "literal dotted key" matches glob "literal*"'),
            id="literal-dotted-key-wins",
        ),
        pytest.param(
            "tags: urgent", one(True, 'tags: item "urgent" is "urgent"'), id="list-field-any-item"
        ),
        pytest.param(
            "tags: desktop",
            one(False, 'tags: no item of ["urgent", "mobile"] matches'),
            id="list-field-no-item",
        ),
        pytest.param(
            "meta: x",
            one(
                False,
                'meta: {"page": "/checkout", "step": 3, "items": [{"sku": "a1"}]} is not a string',
            ),
            id="object-field-is-not-a-string",
        ),
    ],
)
def test_match_value_forms(match: str, expected: list[tuple[bool, str]]) -> None:
    assert verdicts(match) == expected


def test_literal_tilde_string_is_matched_with_an_escaped_regex() -> None:
    assert verdicts("note: '~^~home$'", {"note": "~home"}) == [
        (True, 'note: "~home" matches regex "^~home$"')
    ]


def test_lookup_reads_nested_fields_and_reports_missing_ones() -> None:
    assert lookup(EVENT, "meta.page") == "/checkout"
    assert lookup(EVENT, "meta.items.0.sku") == "a1"
    assert lookup(EVENT, "meta.items.5") is lookup(EVENT, "nope")


@pytest.mark.parametrize(
    ("match_block", "routed"),
    [
        pytest.param("", True, id="absent-match-matches-everything"),
        pytest.param("    match: {}\n", True, id="empty-match-matches-everything"),
        pytest.param("    match:\n", True, id="null-match-matches-everything"),
        pytest.param("    match: {type: score.drop, score: {lt: 30}}\n", True, id="all-hold"),
        pytest.param("    match: {type: score.drop, score: {lt: 10}}\n", False, id="one-fails"),
    ],
)
def test_rule_matches_only_when_every_condition_holds(match_block: str, routed: bool) -> None:
    rs = rules.load_text(f"rules:\n  - name: r\n    notify: console\n{match_block}", env={})
    assert bool(rs.route(EVENT)) is routed


# The fast path (Matcher.ok, Condition.holds, Rule.matches) must give exactly the
# verdict test() gives: every matcher form against a spread of values and shapes.
FAST_PATH_FORMS = [
    "score.drop",  # exact
    "Score.Drop",
    "''",
    "'20'",
    "score.*",  # glob
    "'*'",
    "'[a-c]?'",
    "'~^user_[0-9]+$'",  # regex
    "'~^.$'",
    "'~^~home$'",
    "20",  # equality
    "0",
    "1",
    "0.5",
    "-3",
    "true",
    "false",
    "{lt: 30}",  # operators
    "{lte: 20}",
    "{gt: 20}",
    "{gte: 20.5}",
    "{eq: 1}",
    "{between: [10, 30]}",
    "{between: [0.5, 0.5]}",
    "{gt: 0, lt: 100, between: [10, 50]}",
    "[score.recover, score.drop]",  # any-of
    "[{lt: 10}, {gt: 90}, 20]",
    "[session.*, '~^intervention', true, 0.5]",
]
FAST_PATH_VALUES: list[Any] = [
    "score.drop",
    "score.recover",
    "Score.Drop",
    "",
    "20",
    "user_42",
    "user_x",
    "ab",
    "~home",
    "~",
    "*",
    20,
    20.0,
    20.5,
    0,
    0.0,
    1,
    1.0,
    0.5,
    -3,
    10,
    30,
    50,
    100,
    10**30,
    float("nan"),
    float("inf"),
    -float("inf"),
    True,
    False,
    None,
    {},
    {"score": 20},
    [],
    ["urgent", "score.drop"],
    [5, 95],
    [True, 0],
    [[20], ["score.drop"]],
    [None, "x", 40.0],
]
_ABSENT: Any = object()
FAST_PATH_FIELDS = ("f", "meta.f", "meta.items.0")


def _payload(field: str, value: Any) -> dict[str, Any]:
    if value is _ABSENT:
        return {"meta": {"items": []}}
    if field == "f":
        return {"f": value}
    if field == "meta.f":
        return {"meta": {"f": value}}
    return {"meta": {"items": [value]}}


@pytest.mark.parametrize("form", FAST_PATH_FORMS)
def test_fast_path_agrees_with_test(form: str) -> None:
    for field in FAST_PATH_FIELDS:
        conditions, problems = compile_match(yaml.safe_load(f"{field}: {form}"))
        assert problems == []
        (condition,) = conditions
        rule = rules.Rule("r", conditions, ("console",), "t", "b")
        for value in [*FAST_PATH_VALUES, _ABSENT]:
            payload = _payload(field, value)
            verdict, reason = condition.test(payload)
            where = f"{field}: {form} against {payload!r} ({reason})"
            assert condition.holds(payload) is verdict, where
            assert rule.matches(payload) is verdict, where
            if value is not _ABSENT:
                assert condition.matcher.ok(value) is condition.matcher.test(value)[0], where


def test_rule_matches_agrees_with_explain_on_multi_condition_rules() -> None:
    forms = ["type: score.*", "score: {lt: 30}", "tags: urgent", "meta.step: 3", "nope: x"]
    for mask in range(1 << len(forms)):
        block = "\n".join(f for bit, f in enumerate(forms) if mask >> bit & 1)
        conditions, problems = compile_match(yaml.safe_load(block) if block else None)
        assert problems == []
        rule = rules.Rule("r", conditions, ("console",), "t", "b")
        for payload in (EVENT, {**EVENT, "score": 45}, {**EVENT, "tags": "urgent"}, {}):
            assert rule.matches(payload) is all(ok for ok, _ in rule.test(payload))


# -- regexes run on RE2: linear time, and what it cannot run is refused ---------------------

BACKTRACKS = "a" * 28 + "!"  # (a+)+$ tried 2**28 ways on Python's re: about 20 s


@pytest.mark.parametrize(
    ("pattern", "value", "verdict"),
    [
        pytest.param("(a+)+$", BACKTRACKS, False, id="nested-quantifier-no-match"),
        pytest.param("(a+)+$", "a" * 28, True, id="nested-quantifier-match"),
        pytest.param("(a|aa)*c", "a" * 40, False, id="overlapping-alternation"),
        pytest.param("(.*a){12}", "a" * 11 + "b" * 30, False, id="repeated-dot-star"),
        pytest.param("^(\\w+\\s?)*$", "word " * 20 + "!", False, id="words-then-a-stray-char"),
    ],
)
def test_regex_takes_linear_time_on_catastrophic_patterns(
    pattern: str, value: str, verdict: bool
) -> None:
    (condition,), problems = compile_match({"userId": f"~{pattern}"})
    assert problems == []
    started = time.perf_counter()
    for _ in range(100):
        assert condition.holds({"userId": value}) is verdict
    assert time.perf_counter() - started < 1.0  # 100 searches; one took 20 s on re


@pytest.mark.parametrize(
    ("pattern", "value", "verdict"),
    [
        pytest.param("_4", "user_42", True, id="searches-anywhere"),
        pytest.param("^_4", "user_42", False, id="anchored-start"),
        pytest.param("42$", "user_42", True, id="anchored-end"),
        pytest.param("(?i)^USER", "user_42", True, id="inline-flag"),
        pytest.param("^é+$", "éé", True, id="non-ascii-by-character"),
        pytest.param("^.{2}$", "éé", True, id="dot-is-one-character"),
        pytest.param("\\pL+_\\d", "user_42", True, id="re2-unicode-class"),
        pytest.param("x", "\ud800x", True, id="lone-surrogate-in-value"),
    ],
)
def test_regex_semantics(pattern: str, value: str, verdict: bool) -> None:
    (condition,), problems = compile_match({"f": f"~{pattern}"})
    assert problems == []
    assert condition.holds({"f": value}) is verdict


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        pytest.param("(a)\\1", "\\1: backreferences are not supported", id="backreference"),
        pytest.param("(?P<x>a)(?P=x)", "backreferences are not supported", id="named-backref"),
        pytest.param("user(?=_4)", "(?=: lookahead is not supported", id="lookahead"),
        pytest.param("(?<!x)user", "(?<!: lookbehind is not supported", id="lookbehind"),
        pytest.param("a++", "possessive quantifiers are not supported", id="possessive"),
        pytest.param("(?>a+)", "atomic groups are not supported", id="atomic"),
        pytest.param("a\\Z", "write \\z for the end of the value", id="backslash-Z"),
        pytest.param("(?x) a", "only the flags i, m, s and U are supported", id="verbose-flag"),
        pytest.param("a{1001}", "repetition counts above 1000", id="big-count"),
        pytest.param("(a{100}){100}", "repetition counts above 1000", id="nested-counts"),
    ],
)
def test_regex_that_needs_backtracking_is_refused_naming_why(pattern: str, why: str) -> None:
    _, problems = compile_match({"userId": f"~{pattern}"})
    [problem] = problems
    assert problem.startswith(f"match.userId: invalid regex {json.dumps(pattern)}: ")
    assert why in problem
    assert problem.endswith("(regexes run on RE2, which never backtracks)")


def test_invalid_regex_keeps_pythons_message() -> None:
    _, problems = compile_match({"userId": "~^user_("})
    assert problems == [
        'match.userId: invalid regex "^user_(": missing ), unterminated subpattern at position 6'
    ]


def test_a_condition_pickles_and_copies_with_its_fast_path() -> None:
    # holds() of a plain field is made per instance (_plain_holds); a copy makes its own.
    # (A regex does not pickle: RE2's program is not Python's to pickle.)
    for form in ("score.drop", "[a, b]", "{lt: 30}", "'*.drop'", "'~^x'"):
        (condition,), _ = compile_match(yaml.safe_load(f"f: {form}"))
        twins = [copy.deepcopy(condition)]
        if not form.startswith("'~"):
            twins.append(pickle.loads(pickle.dumps(condition)))
        for twin in twins:
            assert twin == condition
            for value in FAST_PATH_VALUES:
                assert twin.holds({"f": value}) is condition.holds({"f": value}), (form, value)
