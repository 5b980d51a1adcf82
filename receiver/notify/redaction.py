"""Keeping notifier and subscriber URLs' secrets out of logs and traces.

A notifier URL carries its credentials in its user part, its path (a Slack hook's path
is its token), its query or even its host (some apprise plugins): url_secrets and
private_tokens find them, redact() cuts them (and any URL) out of a text, Redactor does
that to every record of the libraries apprise sends through, and shown_url() gives a URL
with its secrets replaced, for a trace's `url.full`.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

__all__ = ["REDACTED", "Redactor", "private_tokens", "redact", "shown_url", "url_secrets"]

REDACTED = "***"

# Query arguments apprise uses for behaviour, never for credentials. Every other query
# value (tokens, `+Header=value` pairs, ...) counts as a secret.
_PUBLIC_QUERY_KEYS = frozenset(
    "bcc cc channel channels cto emojis format from image method mode name optional "
    "overflow priority redirect reply retry rto smtp store to tz verify wait".split()
)

# Short secrets are only redacted as whole words, so "notify" doesn't eat "notification".
_SUBSTRING_MIN = 8

_URL_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*)://[^\s'\"<>]*")


@functools.lru_cache(maxsize=256)
def _secrets_pattern(secrets: frozenset[str]) -> re.Pattern[str] | None:
    parts = []
    for secret in sorted(secrets, key=len, reverse=True):
        escaped = re.escape(secret)
        if len(secret) < _SUBSTRING_MIN:
            escaped = rf"(?<![\w.\-]){escaped}(?![\w\-])"
        parts.append(escaped)
    return re.compile("|".join(parts)) if parts else None


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace each secret, and anything that looks like a URL, with "***".

    >>> redact("POST http://h/hooks/tok123 failed for tok123", ["tok123"])
    'POST http://*** failed for ***'
    """
    pattern = _secrets_pattern(frozenset(s for s in secrets if s))
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    return _URL_RE.sub(lambda m: f"{m.group(1)}://{REDACTED}", text)


def url_secrets(url: str) -> frozenset[str]:
    """The parts of an apprise URL that must never be logged, as written and decoded.

    The whole URL, its password, every path segment, every query value except apprise's
    behaviour switches (mode=, format=, ...) and the fragment. Hosts are not included:
    where a plugin keeps a token in the host, `private_tokens` finds it.
    """
    found: set[str] = {url.strip()}
    try:
        parts = urlsplit(url.strip())
        password = parts.password
    except ValueError:
        return frozenset(found)
    if password:
        found.add(password)
    found.update(seg for seg in parts.path.split("/") if seg)
    for key, value in parse_qsl(parts.query, keep_blank_values=False):
        # +Header=, -param= and :field= pass values through to the target: secret.
        if key.startswith(("+", "-", ":")) or key.lower() not in _PUBLIC_QUERY_KEYS:
            found.add(value)
    if parts.fragment:
        found.add(parts.fragment)
    return _with_encodings(found)


def private_tokens(plugin: Any) -> frozenset[str]:
    """Tokens apprise itself masks when it prints this plugin's URL with privacy on."""
    try:
        full = unquote(str(plugin.url(privacy=False)))
        masked = unquote(str(plugin.url(privacy=True)))
    except Exception:  # a plugin that can't print its URL has nothing to compare
        return frozenset()
    split = re.compile(r"[/:@?&=,#]+")
    return _with_encodings(set(split.split(full)) - set(split.split(masked)) - {""})


def _with_encodings(values: Iterable[str]) -> frozenset[str]:
    out: set[str] = set()
    for value in values:
        if value:
            out.update({value, unquote(value), quote(unquote(value), safe="")})
    return frozenset(out)


class Redactor(logging.Filter):
    """Rewrites library log records so no registered secret or URL reaches a handler.

    Attached to the loggers themselves (not to handlers), so it runs before apprise's
    own result capture, pytest's caplog and whatever handlers the app configures.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._secrets: frozenset[str] = frozenset()

    def add(self, secrets: frozenset[str]) -> None:
        if secrets <= self._secrets:
            return
        with self._lock:
            self._secrets = self._secrets | secrets

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = self._secrets
        try:
            message = record.getMessage()
        except Exception:  # a broken format string; let logging report it as usual
            return True
        clean = redact(message, secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text, record.exc_info = redact(text, secrets), None
        return True


SHOWN_REDACTED = "REDACTED"  # OpenTelemetry's word for what url.full leaves out


def shown_url(url: str, secrets: Iterable[str] = ()) -> str:
    """url as a trace may show it (`url.full`): its scheme, host and port as they are; its
    user part, every path segment, every query value but apprise's behaviour switches and
    its fragment replaced by REDACTED; its host too when it is one of secrets (a plugin
    that keeps its token there).

    >>> shown_url("https://u:p@hooks.example.com:8443/services/T0/x?token=t&format=json#f")
    'https://REDACTED:REDACTED@hooks.example.com:8443/REDACTED/REDACTED/REDACTED?token=REDACTED&format=json'
    >>> shown_url("tgram://bot123/chat", {"bot123"}), shown_url("console://")
    ('tgram://REDACTED/REDACTED', 'console://')
    """
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is no number
    except ValueError:
        return f"{_scheme_of(url)}://{SHOWN_REDACTED}"
    userinfo, at, hostport = parts.netloc.rpartition("@")
    host = parts.hostname or ""
    if host and ({host, hostport.rsplit(":", 1)[0]} & set(secrets)):
        hostport = SHOWN_REDACTED + (f":{parts.port}" if parts.port else "")
    shown = f"{parts.scheme}://"
    if at:
        shown += f"{SHOWN_REDACTED}:{SHOWN_REDACTED}@" if ":" in userinfo else f"{SHOWN_REDACTED}@"
    path = "/".join(SHOWN_REDACTED if seg else "" for seg in parts.path.split("/"))
    shown += hostport + path
    if parts.query:  # split as written: "+X-Token" must stay itself, not " X-Token"
        pairs = [pair.partition("=") for pair in parts.query.split("&") if pair]
        shown += "?" + "&".join(
            f"{key}={value if _public(key) else SHOWN_REDACTED}" for key, _, value in pairs
        )
    return shown


def _public(key: str) -> bool:
    key = unquote(key)
    return not key.startswith(("+", "-", ":")) and key.lower() in _PUBLIC_QUERY_KEYS


def _scheme_of(url: str) -> str:
    head, sep, _ = url.strip().partition("://")
    return head.lower() if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", head) else "unknown"
