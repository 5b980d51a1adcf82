"""The built-in rules: the starter rules.yaml that `receiver init` writes, used when there is none.

One text serves both, so a server started without a rules file behaves exactly
as it will once `receiver init` has written that file. It is packaged as
receiver/rules/starter.yaml, a copy of rules.yaml at the top of the repository
(a test keeps the two equal).
"""

from __future__ import annotations

from importlib import resources

from receiver.rules.load import load_text
from receiver.rules.ruleset import Ruleset

BUILTIN_SOURCE = "built-in rules"


def starter_text() -> str:
    """The commented starter rules file: every event to the console, other notifiers commented."""
    return resources.files("receiver.rules").joinpath("starter.yaml").read_text(encoding="utf-8")


def load_builtin() -> Ruleset:
    """The starter file as a Ruleset, named "built-in rules" in summaries and errors.

    The environment is not read: the starter's only notifier is the console.
    """
    return load_text(starter_text(), env={}, source=BUILTIN_SOURCE)
