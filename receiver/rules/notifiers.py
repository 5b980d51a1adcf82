"""Notifiers: named lists of URLs, ${VAR} substitution, checks that never echo a URL.

Each URL's scheme picks the channel that sends to it (receiver.notify.registry: apprise for
the schemes apprise knows), and that channel checks it. A URL usually carries a token, so
no message, repr or summary here ever shows one: problems name the notifier, the URL's
position and its scheme only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from receiver.notify import registry
from receiver.notify.apprise import CONSOLE, SERVICES_DOC

CONSOLE_URL = f"{CONSOLE}://"
__all__ = ["CONSOLE", "CONSOLE_URL", "SERVICES_DOC", "Notifier", "build_notifier"]

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_VAR_RE = re.compile(r"\$\{([^}]*)\}")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, repr=False)
class Notifier:
    """A named destination; ``urls`` are apprise URLs with ${VAR} already substituted.

    The repr hides the URLs because they carry tokens.
    """

    name: str
    urls: tuple[str, ...]
    # Variables left unset when loaded for `check` and `explain` only (lenient): those urls
    # keep their ${VAR} text and were not checked. Never the case for the server.
    unresolved: tuple[str, ...] = ()
    # The channel that sends to each url (receiver.notify.registry), in the urls' order.
    channels: tuple[str, ...] = ()

    def channel(self, target: int) -> str:
        """The channel of urls[target] ("notify", apprise's, for one out of range)."""
        return self.channels[target] if 0 <= target < len(self.channels) else registry.NOTIFY

    def __repr__(self) -> str:
        count = len(self.urls)
        return f"Notifier(name={self.name!r}, urls=<{count} url{'s' if count != 1 else ''} hidden>)"

    __str__ = __repr__


def build_notifier(
    name: Any, raw: Any, env: Mapping[str, str], *, lenient: bool = False
) -> tuple[Notifier | None, list[str]]:
    """The notifier for one `notifiers:` entry, or None and every problem found.

    lenient (for `receiver check` and `explain`, which send nothing): a variable that is
    unset or empty is not a problem; the url keeps its ${VAR} text, is not checked, and
    the variable is listed in Notifier.unresolved.
    """
    label = f"notifier {_quote(name)}"
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        return None, [
            f"{label}: invalid name; allowed: letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        ]
    templates = [raw] if isinstance(raw, str) else raw
    if not isinstance(templates, list) or not templates:
        return None, [f"{label}: expected an apprise url or a non-empty list of them"]
    problems: list[str] = []
    urls: list[str] = []
    unresolved: list[str] = []
    for number, template in enumerate(templates, start=1):
        where = f"{label}: url #{number}" if len(templates) > 1 else label
        if not isinstance(template, str) or not template.strip():
            problems.append(f"{where}: expected a non-empty apprise url string")
            continue
        unset = _unset(template, env) if lenient else []
        if unset:
            _, missing = substitute(template.strip(), {**env, **dict.fromkeys(unset, "x")})
            problems.extend(f"{where}: {m}" for m in missing)
            unresolved.extend(v for v in unset if v not in unresolved)
            urls.append(template.strip())
            continue
        url, missing = substitute(template.strip(), env)
        problems.extend(f"{where}: {m}" for m in missing)
        if not missing:
            if (problem := registry.problem(url, _scheme(template))) is not None:
                problems.append(f"{where}: {problem}")
            urls.append(url)
    if problems:
        return None, problems
    channels = tuple(registry.channel_of(url) for url in urls)
    return Notifier(name, tuple(urls), tuple(unresolved), channels), []


def _unset(template: str, env: Mapping[str, str]) -> list[str]:
    """The well-formed ${VAR} names in template that env leaves unset or empty."""
    names = (found.group(1) for found in _VAR_RE.finditer(template))
    return [n for n in names if _VAR_NAME_RE.fullmatch(n) and not env.get(n)]


def substitute(template: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """Replace each ${VAR} from env; the problems name variables, never values."""
    problems: list[str] = []

    def replace(found: re.Match[str]) -> str:
        var = found.group(1)
        if not _VAR_NAME_RE.fullmatch(var):
            problems.append(
                f"invalid variable reference {_quote('${' + var + '}')}; "
                "allowed: ${NAME} with letters, digits and '_'"
            )
        elif var not in env:
            problems.append(f"environment variable {var} is not set")
        elif not env[var]:
            problems.append(f"environment variable {var} is empty")
        else:
            return env[var]
        return ""

    return _VAR_RE.sub(replace, template), problems


def _scheme(template: str) -> str:
    # Taken from the text as written in rules.yaml, before substitution, so a
    # secret coming from the environment cannot end up in the message.
    scheme, sep, _ = template.partition("://")
    if not sep:
        return "missing"
    if "$" in scheme or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return "not shown"
    return f'"{scheme.lower()}"'


def _quote(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)
