"""Templates: the context and filters a title, body or throttle key sees, and the fallback."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2 import UndefinedError

from receiver import rules
from receiver.rules import templates
from tests.samples import sample

EVENT = sample(meta={"page": "/checkout"}, flagged=True, note=None, elapsed=5400)


def render(body: str, payload: dict[str, Any] = EVENT) -> rules.Decision:
    text = (
        "rules:\n  - name: r\n    notify: console\n"
        f"    title: {_yaml(body)}\n    body: {_yaml(body)}\n"
    )
    [decision] = rules.load_text(text, env={}).route(payload)
    return decision


def _yaml(template: str) -> str:
    return "'" + template.replace("'", "''") + "'"


@pytest.mark.parametrize(
    ("template", "text"),
    [
        pytest.param("{{ userId }} at {{ score }}", "user_42 at 20", id="payload-fields-by-name"),
        pytest.param("{{ meta.page }}", "/checkout", id="nested-field"),
        pytest.param(
            "{{ event.id }} {{ event['type'] }}", "evt_1 score.drop", id="event-is-the-payload"
        ),
        pytest.param("{{ rule }}", "r", id="rule-name"),
        pytest.param("{{ delta }}", "20", id="delta-is-threshold-minus-score"),
        pytest.param("{{ timestamp | time }}", "2026-11-21 10:00 UTC", id="time-default-format"),
        pytest.param('{{ timestamp | time("%H:%M UTC") }}', "10:00 UTC", id="time-custom-format"),
        pytest.param(
            '{{ "2026-11-21T12:00:00+02:00" | time("%H:%M") }}', "10:00", id="time-converts-to-utc"
        ),
        pytest.param('{{ 0 | time("%Y") }}', "1970", id="time-from-epoch-seconds"),
        pytest.param("{{ elapsed | duration }}", "1h30m", id="duration-filter"),
        pytest.param("{{ meta | json }}", '{"page": "/checkout"}', id="json-filter"),
        pytest.param("{{ flagged }}/{{ note }}", "true/", id="booleans-and-null-as-in-json"),
        pytest.param("{{ missing | default('-') }}", "-", id="default-filter-for-optional-fields"),
        pytest.param(
            "{% if missing is defined %}x{% else %}y{% endif %}", "y", id="is-defined-test"
        ),
        pytest.param("<b>{{ '&' }}</b>", "<b>&</b>", id="no-html-escaping"),
        pytest.param("  {{ score }}  ", "20", id="surrounding-whitespace-stripped"),
    ],
)
def test_template_renders(template: str, text: str) -> None:
    decision = render(template)
    assert (decision.title, decision.body, decision.fallback) == (text, text, False)


@pytest.mark.parametrize(
    ("payload", "delta"),
    [
        pytest.param({"score": 20.5, "threshold": 40.7}, "20.2", id="float-delta-rounded"),
        pytest.param({"score": 45, "threshold": 40}, "-5", id="negative-delta"),
        pytest.param({"score": 20, "threshold": 40, "delta": 1}, "20", id="computed-delta-wins"),
        pytest.param({"score": 20, "delta": 1}, "1", id="payload-delta-without-threshold"),
    ],
)
def test_delta(payload: dict[str, Any], delta: str) -> None:
    assert render("{{ delta }}", payload).body == delta


def test_rule_with_only_name_and_notify_gets_default_texts() -> None:
    [decision] = rules.load_text("rules:\n  - name: r\n    notify: console\n", env={}).route(EVENT)
    assert decision.title == "[r] score.drop for sess_1"
    assert decision.body == (
        "user user_42, session sess_1\nscore 20 (threshold 40)\nevent evt_1 at 2026-11-21T10:00:00Z"
    )
    assert decision.fallback is False


def test_default_texts_work_for_events_without_score_or_user() -> None:
    payload = {
        "id": "evt_9",
        "type": "session.stopped",
        "sessionId": "sess_9",
        "timestamp": "2026-11-21T10:00:00Z",
    }
    [decision] = rules.load_text("rules:\n  - name: r\n    notify: console\n", env={}).route(
        payload
    )
    assert decision.title == "[r] session.stopped for sess_9"
    assert decision.body == "session sess_9\nevent evt_9 at 2026-11-21T10:00:00Z"
    assert decision.fallback is False


@pytest.mark.parametrize(
    ("template", "error"),
    [
        pytest.param("{{ userld }}", "'userld' is undefined", id="undefined-name-is-an-error"),
        pytest.param("{{ meta.nope.deeper }}", "has no attribute 'nope'", id="undefined-attribute"),
        pytest.param(
            "{{ userId | time }}",
            'time: "user_42" is not an ISO-8601 timestamp',
            id="filter-raises",
        ),
        pytest.param("{{ score / 0 }}", "division by zero", id="arithmetic-error"),
        pytest.param("{{ ''.__class__.__mro__ }}", "", id="sandbox-blocks-internals"),
        pytest.param("{{ event.clear() }}", "", id="sandbox-blocks-mutation"),
    ],
)
def test_failing_template_sends_the_fallback(template: str, error: str) -> None:
    decision = render(template)
    assert decision.fallback is True
    assert decision.title == "[r] score.drop for sess_1"
    assert decision.body.startswith('the title template of rule "r" failed: ')
    assert error in decision.body
    assert "sessionId: sess_1\nuserId: user_42\nscore: 20\nthreshold: 40" in decision.body


def test_body_rendering_empty_sends_the_fallback() -> None:
    text = "rules:\n  - name: r\n    notify: console\n    body: '{{ note }}'\n"
    [decision] = rules.load_text(text, env={}).route(EVENT)
    assert decision.fallback is True
    assert decision.body.startswith('the body template of rule "r" failed: it rendered empty text')


def test_fallback_survives_a_payload_without_the_usual_fields() -> None:
    text = "rules:\n  - name: r\n    notify: console\n    title: '{{ userId }}'\n"
    [decision] = rules.load_text(text, env={}).route({"odd": [1, 2]})
    assert decision.title == "[r] event for unknown session"
    assert decision.fallback is True


@pytest.mark.parametrize(
    ("throttle", "key"),
    [
        pytest.param("{key: '{{ sessionId }}', every: 15m}", "sess_1", id="rendered-key"),
        pytest.param(
            "{key: '{{ userId }}:{{ meta.page }}', every: 1h}",
            "user_42:/checkout",
            id="composite-key",
        ),
        pytest.param("{every: 15m}", rules.RULE_WIDE_KEY, id="no-key-means-one-key-per-rule"),
    ],
)
def test_throttle_key_is_rendered(throttle: str, key: str) -> None:
    text = f"rules:\n  - name: r\n    notify: console\n    throttle: {throttle}\n"
    [decision] = rules.load_text(text, env={}).route(EVENT)
    assert decision.throttle_key == key
    assert decision.fallback is False


def test_failing_throttle_key_throttles_rule_wide_and_says_so() -> None:
    text = (
        "rules:\n  - name: r\n    notify: console\n    throttle: {key: '{{ nope }}', every: 2h}\n"
    )
    [decision] = rules.load_text(text, env={}).route(EVENT)
    assert (decision.throttle_key, decision.throttle_seconds) == ("*", 7200.0)
    assert decision.fallback is True
    assert decision.body.startswith('the throttle key template of rule "r" failed: ')


def test_unthrottled_rule_has_no_key_and_no_period() -> None:
    [decision] = rules.load_text("rules:\n  - name: r\n    notify: console\n", env={}).route(EVENT)
    assert (decision.throttle_key, decision.throttle_seconds) == (None, None)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@given(value=JSONISH | st.text(alphabet=" \n\tx", max_size=6), present=st.booleans())
@settings(max_examples=300, deadline=None)
def test_a_one_name_template_prints_what_jinja_prints(value: Any, present: bool) -> None:
    """`{{ userId }}` is rendered without Jinja (templates.ONE_NAME): the same text, and
    the same error for a missing name."""
    fast = templates.compile_template("{{ userId }}")
    assert getattr(fast, templates.ONE_NAME) == "userId"
    slow = templates.compile_template("{{ userId }}{{ '' }}")  # the same, through Jinja
    assert not hasattr(slow, templates.ONE_NAME)
    ctx = templates.context({"userId": value} if present else {}, "r")
    if present:
        assert templates.render(fast, ctx) == templates.render(slow, ctx)
    else:
        with pytest.raises(UndefinedError) as fast_error:
            templates.render(fast, ctx)
        with pytest.raises(UndefinedError) as slow_error:
            templates.render(slow, ctx)
        assert str(fast_error.value) == str(slow_error.value)


def test_a_one_name_template_is_cut_as_any_other() -> None:
    fast = templates.compile_template("{{ userId }}")
    text = templates.render(fast, {"userId": "x" * (templates.MAX_OUTPUT + 10)})
    assert text == "x" * templates.MAX_OUTPUT + templates.TRUNCATED.format(
        limit=f"{templates.MAX_OUTPUT:,}"
    )
