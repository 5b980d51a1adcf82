"""The sample event the unit tests share: one `score.drop` of a session and a user.

Tests that need a variant derive it (`sample(score=22)`, `sample(meta={...})`) rather than
copying the literal. A function rather than a pytest fixture: the rule tests use it at module
level, as parameters' defaults.
"""

from __future__ import annotations

from typing import Any

SAMPLE: dict[str, Any] = {
    "id": "evt_1",
    "type": "score.drop",
    "sessionId": "sess_1",
    "userId": "user_42",
    "score": 20,
    "threshold": 40,
    "timestamp": "2026-11-21T10:00:00Z",
}


def sample(**fields: Any) -> dict[str, Any]:
    """A fresh copy of the sample event with `fields` changed or added."""
    return {**SAMPLE, **fields}
