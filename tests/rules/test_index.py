"""Ruleset.matching's index (receiver.rules.index): the rules it tries are narrowed by a field
most of them test for exact strings, and its verdicts are those of trying every rule."""

from __future__ import annotations

import functools
import json
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from receiver import rules
from receiver.rules import templates
from receiver.rules.index import MIN_KEYED, TypeIndex

PAGES = ["checkout", "home", "search", "cart", "p.1"]
USERS = ["u_1", "u_2", "u_3"]

# What a rule's `match:` entry on a field may be: exact strings, a list of them, a glob, a
# regex, a number, a comparison; some on dotted paths.
MATCH_VALUES = st.one_of(
    st.sampled_from(PAGES),
    st.lists(st.sampled_from(PAGES), min_size=1, max_size=3),
    st.sampled_from(["check*", "~^ho", 3, {"lt": 50}]),
    st.lists(st.sampled_from(["home", "c*t"]), min_size=2, max_size=2),
)
RULE = st.fixed_dictionaries(
    {"type": st.sampled_from(["score.drop", "score.*", "score.recover"])},
    optional={
        "page": MATCH_VALUES,
        "userId": st.sampled_from(USERS),
        "meta.page": st.sampled_from(PAGES),
        "score": st.sampled_from([{"lt": 30}, 40]),
    },
)
# What a payload's page may be: a string (known or not), a list, a number, missing.
PAYLOAD_VALUES = st.one_of(
    st.sampled_from([*PAGES, "other", ""]),
    st.lists(st.sampled_from([*PAGES, "x"]), max_size=3),
    st.sampled_from([3, 3.0, True, None, {"a": 1}]),
)
PAYLOAD = st.fixed_dictionaries(
    {"type": st.sampled_from(["score.drop", "score.recover"]), "score": st.sampled_from([20, 40])},
    optional={
        "page": PAYLOAD_VALUES,
        "userId": st.sampled_from([*USERS, 7]),
        "meta": st.fixed_dictionaries({}, optional={"page": st.sampled_from(PAGES)}),
    },
)


# Every rule here has the default templates, and Jinja compiles each of the four again for
# every rule loaded (about 30 ms a rule on a busy 2-core machine: nine tenths of the property
# test's time). A compiled Template is never changed after compile_template returns, so each
# source is compiled once and the same object shared; templates play no part in matching.
_compile_once = functools.lru_cache(maxsize=None)(templates.compile_template)


def ruleset(matches: list[dict[str, Any]], cont: bool = True) -> rules.Ruleset:
    notifiers = 'notifiers:\n  out: "json://localhost/x"\n'
    body = "".join(
        f"  - name: r{i}\n    match: {json.dumps(m)}\n    notify: out\n"
        + ("    continue: true\n" if cont else "")
        for i, m in enumerate(matches)
    )
    with mock.patch.object(templates, "compile_template", _compile_once):
        return rules.load_text(f"{notifiers}rules:\n{body}", env={})


@settings(max_examples=300, deadline=None)
@given(st.lists(RULE, min_size=1, max_size=12), st.lists(PAYLOAD, min_size=1, max_size=8))
def test_matching_is_every_rule_tried_in_order(
    matches: list[dict[str, Any]], payloads: list[dict[str, Any]]
) -> None:
    rs = ruleset(matches)
    for payload in payloads:
        expected = [r.name for r in rs.rules if r.matches(payload)]
        assert [r.name for r in rs.matching(payload)] == expected, payload


def names(index: TypeIndex, payload: dict[str, Any]) -> list[str]:
    return [r.name for r, _ in index.candidates(payload)]


def test_the_index_narrows_to_the_rules_of_the_values() -> None:
    rs = ruleset(
        [{"type": "score.drop", "page": p} for p in PAGES]  # r0-r4: keyed on page
        + [{"type": "score.drop", "page": ["home", "cart"], "userId": "u_1"}]  # r5
        + [{"type": "score.drop", "userId": [u, "u_9"]} for u in USERS]  # r6-r8
        + [{"type": "score.drop", "userId": "~^u_", "score": {"lt": 30}}]  # r9: a regex
        + [{"type": "score.drop", "userId": "u_2"}],  # r10
        cont=True,
    )
    index = TypeIndex((r, r.conditions_besides_type) for r in rs.rules)
    assert [field for field, _ in index.levels] == ["page", "userId"]
    # home: its own rule and the list rule wanting home; u_2's rules; the regex rule.
    assert names(index, {"page": "home", "userId": "u_2"}) == ["r1", "r5", "r7", "r9", "r10"]
    # A value no rule names, another type, or none: only the rules no field keys.
    assert names(index, {"page": "nowhere", "userId": 7}) == names(index, {}) == ["r9"]
    assert names(index, {"userId": "u_9"}) == ["r6", "r7", "r8", "r9"]
    # a list holds when any item does: every rule is tried.
    assert len(names(index, {"page": ["home"]})) == len(rs.rules)
    # The keyed condition is known to hold; the others of the rule are still tried, the
    # cheapest first (the score before the regex).
    tried = dict(index.candidates({"page": "home", "userId": "u_2"}))
    assert [c.field for c in tried[rs.by_name["r5"]]] == ["userId"]
    assert [c.field for c in tried[rs.by_name["r9"]]] == ["score", "userId"]
    payload = {"type": "score.drop", "page": "home", "score": 50, "userId": "u_2"}
    assert [r.name for r in rs.matching(payload)] == ["r1", "r7", "r10"]


def test_too_few_keyed_rules_build_no_index() -> None:
    rs = ruleset([{"type": "score.drop", "page": p} for p in PAGES[: MIN_KEYED - 1]])
    index = TypeIndex((r, r.conditions_besides_type) for r in rs.rules)
    assert index.levels == []
    assert len(index.candidates({"page": "home"})) == MIN_KEYED - 1
