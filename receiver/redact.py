"""Secrets out of a line of text: what the logs, the CLI and the store's errors show of a URL
(a database URL's password, an action link's token). It imports nothing of receiver, so the
store uses it without loading logging's set-up (and tracing through it)."""

from __future__ import annotations

import re

# A password in a URL's user part (scheme://user:password@host), or in a libpq keyword or
# query parameter (password=...): what a database URL carries.
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]*@")
_KEYWORD_PASSWORD = re.compile(r"(\bpassword=)[^&\s]+", re.IGNORECASE)
_ACTION_TOKEN = re.compile(r"(/act/)[^/?#\s\"']+")


def redact_url(text: str) -> str:
    """text with every URL's password (and any password=...), and every action link's
    token (/act/<token>), replaced by ***.

    >>> redact_url("postgresql://receiver:s3cret@db:5432/receiver")
    'postgresql://receiver:***@db:5432/receiver'
    >>> redact_url("postgresql://db/receiver?user=receiver&password=s3cret")
    'postgresql://db/receiver?user=receiver&password=***'
    >>> redact_url("POST /act/eyJhIjoi.Zx9 HTTP/1.1")
    'POST /act/*** HTTP/1.1'
    >>> redact_url("./data/receiver.db")
    './data/receiver.db'
    """
    if "/act/" in text:  # a one-click action link's token is a capability (receiver.links)
        text = _ACTION_TOKEN.sub(r"\1***", text)
    if "@" not in text and "password" not in text.lower():
        return text
    return _KEYWORD_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
