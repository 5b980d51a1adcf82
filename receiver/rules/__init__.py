"""rules.yaml: loading and validating it, matching events, rendering templates, explaining.

Pure: no I/O beyond reading the rules file and the environment.

    from receiver import rules
    rs = rules.load_file("rules.yaml")
    decisions = rs.route(event.payload())
    print(rs.explain(event.payload()).format())
"""

from __future__ import annotations

from receiver.durations import format_duration, parse_duration
from receiver.rules.builtin import BUILTIN_SOURCE, load_builtin, starter_text
from receiver.rules.load import load_file, load_text
from receiver.rules.notifiers import CONSOLE, CONSOLE_URL, Notifier
from receiver.rules.rule import RULE_WIDE_KEY, Decision, Rule
from receiver.rules.ruleset import Ruleset
from receiver.rules.verdict import ConditionOutcome, Explanation, RuleOutcome

__all__ = [
    "BUILTIN_SOURCE",
    "CONSOLE",
    "CONSOLE_URL",
    "RULE_WIDE_KEY",
    "ConditionOutcome",
    "Decision",
    "Explanation",
    "Notifier",
    "Rule",
    "RuleOutcome",
    "Ruleset",
    "format_duration",
    "load_builtin",
    "load_file",
    "load_text",
    "parse_duration",
    "starter_text",
]
