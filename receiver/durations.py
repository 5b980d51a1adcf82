"""Durations as rules.yaml writes them ("90s", "15m", "1h30m") and back."""

from __future__ import annotations

import re

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(text: str) -> float:
    """Seconds in a duration made of whole days, hours, minutes and seconds, in that order.

    >>> parse_duration("1h30m")
    5400.0
    >>> parse_duration("90s"), parse_duration("15m"), parse_duration("2h"), parse_duration("1d")
    (90.0, 900.0, 7200.0, 86400.0)

    Raises ValueError with a message fit for a ConfigError ("1.5h", "15", "15 min"
    and "" are all refused: a unit is always required, and each appears once).
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a duration string such as 90s, 15m, 1h30m; got {text!r}")
    match = _DURATION_RE.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ValueError(
            f'invalid duration "{text}"; expected whole numbers with units d, h, m, s '
            "in that order, e.g. 90s, 15m, 2h, 1d, 1h30m"
        )
    return float(
        sum(int(n) * size for n, size in zip(match.groups(), _UNITS.values(), strict=True) if n)
    )


def format_duration(seconds: float) -> str:
    """The shortest rules.yaml spelling of a number of seconds: 5400 -> "1h30m", 0 -> "0s"."""
    rest = round(seconds)
    parts = []
    for unit, size in _UNITS.items():
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
