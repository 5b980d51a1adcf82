"""Templates cannot escape the Jinja2 sandbox, event data is never a template, YAML is safe,
and a template's work is capped whatever the event holds."""

import json
import re
import time

import pytest
from jinja2.exceptions import SecurityError, UndefinedError

from receiver import rules
from receiver.errors import ConfigError
from receiver.rules import sandbox, templates

EVENT = {"id": "evt_1", "type": "score.drop", "sessionId": "s", "score": 12, "threshold": 40}

ESCAPES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ (1).__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ lipsum.__globals__ }}",
    "{{ lipsum.__module__ }}",
    "{{ self.__init__.__globals__ }}",
    "{{ event.__class__ }}",
    "{{ event|attr('__class__') }}",
    "{{ event.__getitem__('id') }}",
    "{{ '{0.__class__}'.format(event) }}",
    "{{ '%s' % event.__class__ }}",
    "{{ event.items.__self__ }}",
    "{{ ''.join.__self__ }}",
    "{{ rule.__len__() }}",
    "{{ event.update({'id': 'forged'}) }}",
    "{% set x = event.pop('id') %}{{ x }}",
    "{{ event._private }}",
    "{{ range.__self__ }}",
    "{{ config }}",
    "{{ request }}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_template_escapes_fail_without_leaking(source: str) -> None:
    template = templates.compile_template(source)
    with pytest.raises((SecurityError, UndefinedError)):
        templates.render(template, templates.context(EVENT, "r"))


def test_a_huge_constant_range_is_refused_when_the_template_loads() -> None:
    with pytest.raises(ValueError, match=r"range\(\) of 1,000,000,000 items; .* allows 100,000"):
        templates.compile_template("{{ range(10**9) | list | length }}")


def test_a_huge_range_from_event_data_is_refused() -> None:
    template = templates.compile_template("{{ range(score * 10**8) | list | length }}")
    with pytest.raises(OverflowError):
        templates.render(template, templates.context(EVENT, "r"))


@pytest.mark.parametrize(
    "value", ["{{ 7*7 }}", "{% for x in range(3) %}x{% endfor %}", "{{ cycler.__init__ }}"]
)
def test_event_values_are_data_never_templates(value: str) -> None:
    template = templates.compile_template("{{ note }}")
    out = templates.render(template, templates.context({**EVENT, "note": value}, "r"))
    assert out == value


@pytest.mark.parametrize(
    "text",
    [
        "rules: !!python/object/apply:os.system ['true']\n",
        "rules: !!python/object/new:os.system ['true']\n",
        "rules: !!python/name:os.system\n",
        "rules: !!python/module:os\n",
        "rules: !!python/object:receiver.settings.Settings {}\n",
        "rules: !<tag:yaml.org,2002:python/object/apply:os.system> ['true']\n",
    ],
    ids=["apply", "new", "name", "module", "object", "long-tag"],
)
def test_yaml_python_tags_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="yaml"):
        rules.load_text(text, env={})


def test_yaml_alias_bomb_does_not_explode() -> None:
    # "Billion laughs": eight levels of nine aliases. SafeLoader shares aliased nodes,
    # but validation walks the expanded tree; it must be refused quickly.
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    text = "\n".join(lines) + "\nrules:\n  - name: r\n    notify: console\n    match: *a8\n"
    started = time.monotonic()
    with pytest.raises(ConfigError, match="expands to more than 100000 values"):
        rules.load_text(text, env={})
    assert time.monotonic() - started < 2


# -- caps on a template's work, whatever the event holds -------------------------------------

LONG = {**EVENT, "userId": "a" * 28 + "!", "note": "n" * 60_000, "items": list(range(50))}


def rule_with(body: str, title: str = "t") -> rules.Rule:
    [rule] = rules.load_text(
        "rules:\n  - name: r\n    notify: console\n"
        f"    title: {json.dumps(title)}\n    body: {json.dumps(body)}\n",
        env={},
    ).rules
    return rule


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("{% for a in note %}{% for b in note %}x{% endfor %}{% endfor %}", id="2x"),
        pytest.param(
            "{% for a in userId %}{% for b in userId %}{% for c in userId %}"
            "{% endfor %}{% endfor %}{% endfor %}",
            id="3x-no-output",
        ),
        pytest.param("{% for i in range(score * 1000) %}{% endfor %}x", id="range-of-data"),
        pytest.param(
            "{% for i in items %}{% for c in note %}{% endfor %}{% endfor %}x", id="list-and-text"
        ),
    ],
)
def test_loops_over_event_fields_stop_at_the_step_cap(body: str) -> None:
    started = time.perf_counter()
    rendered = rule_with(body).render(LONG)
    assert time.perf_counter() - started < 1.0  # uncapped, the first took seconds
    assert rendered.fallback
    assert rendered.error == "body: stopped after 10,000 loop steps, the most a rule's" + (
        " templates may take for one event"
    )
    assert 'the body template of rule "r" failed: stopped after 10,000' in rendered.body


def test_the_step_cap_holds_for_a_rules_templates_together() -> None:
    loop = "{% for i in range(6000) %}{% endfor %}ok"
    rendered = rule_with(loop, title=loop).render(EVENT)
    assert rendered.fallback and rendered.error is not None
    assert rendered.error.startswith("body: stopped after 10,000 loop steps")


def test_the_time_cap_stops_a_template_busy_on_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "MAX_RENDER_SECONDS", 0.02)
    body = "{% for i in range(9000) %}{{ note.split('n') | length }}{% endfor %}"
    started = time.perf_counter()
    rendered = rule_with(body).render(LONG)
    assert time.perf_counter() - started < 1.0  # 9000 splits of 60 KB: seconds
    assert rendered.error == "body: stopped after 20 ms, the most a rule's templates may" + (
        " take for one event"
    )


def test_output_past_the_cap_is_cut_with_a_marker() -> None:
    rendered = rule_with("{{ note }}{{ note }}").render(LONG)
    assert not rendered.fallback
    assert rendered.body == "n" * templates.MAX_OUTPUT + (
        "\n[cut: the template's output passed 16,384 characters]"
    )


@pytest.mark.parametrize(
    ("source", "error"),
    [
        pytest.param("{{ 'x' * 10**9 }}", "* would build 1,000,000,000", id="repeat"),
        pytest.param("{{ userId * 10**8 }}", "* would build 2,900,000,000", id="repeat-field"),
        pytest.param("{{ 9 ** 99999999 }}", "has about", id="power"),
        pytest.param("{{ '%0999999999d' % 1 }}", "a width or precision", id="percent-width"),
        pytest.param("{{ '%*d' % (10**9, 1) }}", "taken from an argument", id="percent-star"),
        pytest.param("{{ '{:>999999999}'.format(1) }}", "a width or precision", id="format"),
        pytest.param("{{ '{:{}}'.format(1, 10**9) }}", "taken from an argument", id="nested"),
        pytest.param("{{ '%09999999d' | format(1) }}", "a width or precision", id="format-filter"),
        pytest.param("{{ userId.ljust(10**9) }}", "ljust would build", id="ljust"),
        pytest.param("{{ userId | center(10**9) }}", "center would build", id="center"),
        pytest.param("{{ note | replace('', note) }}", "replace would build", id="replace"),
        pytest.param("{{ note.replace('n', note) }}", "replace would build", id="replace-call"),
        pytest.param("{{ items | join(note) }}", "join would build", id="join"),
        pytest.param("{{ note.join(items|map('string')) }}", "join would build", id="join-call"),
        pytest.param("{{ items | batch(10**9, 'x') | list }}", "at most 10,000 parts", id="batch"),
        pytest.param("{{ lipsum(10**6) }}", "lipsum: at most 100 paragraphs", id="lipsum"),
        pytest.param(
            "{% set ns = namespace(s=note) %}{% for i in range(9) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "namespace attribute s would build",
            id="namespace-doubling",
        ),
    ],
)
def test_an_operation_building_a_huge_value_is_refused_before_it_runs(
    source: str, error: str
) -> None:
    template = templates.compile_template(source)
    started = time.perf_counter()
    with pytest.raises(sandbox.TemplateLimitError, match=re.escape(error)):
        templates.render(template, templates.context(LONG, "r"))
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize(
    ("source", "error"),
    [
        pytest.param(
            "{% for i in range(10**9) %}x{% endfor %}",
            "line 1: range() of 1,000,000,000 items; the sandbox allows 100,000",
            id="range-too-long",
        ),
        pytest.param(
            "{% for i in range(20000) %}x{% endfor %}",
            "line 1: a loop over range() of 20,000 steps; a rule's templates may take 10,000"
            " loop steps for one event",
            id="loop-too-long",
        ),
    ],
)
def test_a_constant_range_past_the_caps_is_refused_when_the_rules_load(
    source: str, error: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        rules.load_text(
            f"rules:\n  - name: r\n    notify: console\n    body: {json.dumps(source)}\n", env={}
        )
    assert f'rule "r": body: {error}' in str(refused.value)


@pytest.mark.parametrize(
    ("source", "text"),
    [
        pytest.param("{% for i in items %}{{ i }}{% endfor %}", "".join(map(str, range(50)))),
        pytest.param("{% for i in range(3) %}{{ loop.index }}/{{ loop.length }} {% endfor %}", ""),
        pytest.param("{{ '%5.1f|%-4s|' % (score, 'ab') }}{{ '{:>6,}'.format(12345) }}", ""),
        pytest.param("{{ userId | center(40) | length }} {{ 'ab' * 3 }} {{ 2 ** 10 }}", ""),
        pytest.param(
            "{% set ns = namespace(n=0) %}{% for i in items %}{% set ns.n = ns.n + i %}"
            "{% endfor %}{{ ns.n }}",
            "1225",
        ),
    ],
)
def test_ordinary_templates_are_within_the_caps(source: str, text: str) -> None:
    out = templates.render(templates.compile_template(source), templates.context(LONG, "r"))
    assert out == text or not text
