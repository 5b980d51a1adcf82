"""Templates cannot escape the Jinja2 sandbox, event data is never a template, YAML is safe."""

import time

import pytest
from jinja2.exceptions import SecurityError, UndefinedError

from receiver import rules
from receiver.errors import ConfigError
from receiver.rules import templates

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


def test_a_huge_range_is_refused() -> None:
    template = templates.compile_template("{{ range(10**9) | list | length }}")
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
