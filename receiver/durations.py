"""Durations as rules.yaml writes them ("90s", "15m", "1h30m") and back."""

from __future__ import annotations

import re

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
# The longest span a person types for a silence or a report period (`--for`, `--since`,
# the admin page's forms): a year. Past it, a typo (99999999999d) would make a silence
# that ends beyond what a date can show.
MAX_SPAN = 365 * 86400.0


def parse_duration(text: str, *, limit: float | None = None) -> float:
    """Seconds in a duration made of whole days, hours, minutes and seconds, in that order.

    >>> parse_duration("1h30m")
    5400.0
    >>> parse_duration("90s"), parse_duration("15m"), parse_duration("2h"), parse_duration("1d")
    (90.0, 900.0, 7200.0, 86400.0)
    >>> parse_duration("400d", limit=MAX_SPAN)
    Traceback (most recent call last):
    ...
    ValueError: duration "400d" is longer than the limit of 365d

    Raises ValueError with a message fit for a ConfigError ("1.5h", "15", "15 min"
    and "" are all refused: a unit is always required, and each appears once), and for
    a duration over `limit` seconds (or too long to be a number of seconds at all).
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a duration string such as 90s, 15m, 1h30m; got {text!r}")
    match = _DURATION_RE.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ValueError(
            f'invalid duration "{text[:40]}"; expected whole numbers with units d, h, m, s '
            "in that order, e.g. 90s, 15m, 2h, 1d, 1h30m"
        )
    total = sum(int(n) * size for n, size in zip(match.groups(), _UNITS.values(), strict=True) if n)
    # Compared as whole numbers: float() of a 400-digit count would raise OverflowError.
    if limit is not None and total > limit:
        raise ValueError(
            f'duration "{text.strip()[:40]}" is longer than the limit of {format_duration(limit)}'
        )
    if total > 1e15:  # some 30 million years: no setting means that
        raise ValueError(f'duration "{text.strip()[:40]}" is too long')
    return float(total)


def format_duration(seconds: float) -> str:
    """The shortest rules.yaml spelling of a number of seconds: 5400 -> "1h30m", 0 -> "0s"."""
    rest = round(seconds)
    parts = []
    for unit, size in _UNITS.items():
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def format_age(seconds: float) -> str:
    """An age for messages, to the minute past one: 90061 -> "1d1h1m", 42 -> "42s".

    >>> format_age(90061), format_age(42), format_age(3599)
    ('1d1h1m', '42s', '59m')
    """
    rest = int(seconds)
    if rest < 60:
        return f"{rest}s"
    return format_duration(rest - rest % 60)
