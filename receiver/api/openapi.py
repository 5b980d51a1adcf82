"""GET /v1/openapi.json: the read API as OpenAPI 3.0 (no key needed). The schemas say what
the endpoints answer, and tests/test_api_schema.py holds the live server to them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from receiver.api.sessions import DEFAULT_LIMIT, GROUP_BY, MAX_LIMIT, METRICS, WINDOWS
from receiver.sessions import STATUSES

_TIMESTAMP = {"type": "string", "format": "date-time"}
_NULLABLE_TIMESTAMP = {**_TIMESTAMP, "nullable": True}
_LIST_FIELDS: dict[str, Any] = {
    "id": {"type": "string"},
    "userId": {"type": "string", "nullable": True},
    "score": {"type": "number", "nullable": True},
    "status": {"type": "string", "enum": list(STATUSES)},
    "context": {"type": "string", "nullable": True},
    "startedAt": _NULLABLE_TIMESTAMP,
}
SCHEMAS: dict[str, Any] = {
    "SessionListItem": {
        "type": "object",
        "required": list(_LIST_FIELDS),
        "properties": _LIST_FIELDS,
        "additionalProperties": False,
    },
    "Session": {
        "type": "object",
        "required": [*_LIST_FIELDS, "cohort", "signals", "interventions", "updatedAt"],
        "properties": {
            **_LIST_FIELDS,
            "cohort": {"type": "string", "nullable": True},
            "signals": {"type": "integer", "minimum": 0},
            "interventions": {"type": "integer", "minimum": 0},
            "updatedAt": _NULLABLE_TIMESTAMP,
        },
        "additionalProperties": False,
    },
    "SessionList": {
        "type": "object",
        "required": ["sessions", "total", "cursor"],
        "properties": {
            "sessions": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/SessionListItem"},
            },
            "total": {"type": "integer", "minimum": 0},
            "cursor": {"type": "string", "nullable": True},
        },
        "additionalProperties": False,
    },
    "Score": {
        "type": "object",
        "required": ["sessionId", "score", "updatedAt"],
        "properties": {
            "sessionId": {"type": "string"},
            "score": {"type": "number", "nullable": True},
            "updatedAt": _NULLABLE_TIMESTAMP,
        },
        "additionalProperties": False,
    },
    "ScoreHistory": {
        "type": "object",
        "required": ["sessionId", "history"],
        "properties": {
            "sessionId": {"type": "string"},
            "history": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["score", "timestamp"],
                    "properties": {"score": {"type": "number"}, "timestamp": _TIMESTAMP},
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    },
    "Aggregates": {
        "type": "object",
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["key", "avg", "p50", "sessions"],
                    "properties": {
                        "key": {"type": "string"},
                        "avg": {"type": "number"},
                        "p50": {"type": "number"},
                        "p95": {"type": "number"},
                        "sessions": {"type": "integer", "minimum": 1},
                    },
                    "additionalProperties": False,
                },
            }
        },
        "additionalProperties": False,
    },
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                "additionalProperties": False,
            }
        },
        "additionalProperties": False,
    },
}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _ok(schema: str) -> dict[str, Any]:
    return {
        "description": "OK",
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


_ERRORS = {
    "401": _error("unauthorized: the Bearer key is missing, malformed, unknown or revoked"),
    "403": _error("forbidden: the key's role does not allow this"),
    "429": _error("rate_limited: the key's plan limit is reached; see Retry-After"),
}
_SESSION_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
# What api.sessions.instant_param takes: 2026-05-01 or 2026-05-01T12:00:00Z.
_INSTANT = {
    "anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]
}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


def _get(
    summary: str, schema: str, parameters: list[dict[str, Any]], *errors: str
) -> dict[str, Any]:
    responses = {"200": _ok(schema), **_ERRORS}
    for status in errors:
        responses[status] = _error({"400": "invalid_parameter", "404": "session_not_found"}[status])
    return {"get": {"summary": summary, "parameters": parameters, "responses": responses}}


def document(version: str) -> dict[str, Any]:
    session = [_SESSION_ID]
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "attention-receiver: the Attention Scoring Service's /v1 read API",
            "version": version,
            "description": "Sessions and scores as received by this deployment. Every"
            " endpoint but this document needs Authorization: Bearer <key>.",
        },
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/sessions": _get(
                "List sessions, newest startedAt first",
                "SessionList",
                [
                    _query("userId", {"type": "string"}, "only this user's sessions"),
                    _query(
                        "status", {"type": "string", "enum": list(STATUSES)}, "only this status"
                    ),
                    _query("from", _INSTANT, "startedAt at or after (ISO date or time)"),
                    _query("to", _INSTANT, "startedAt at or before (a date: its whole day)"),
                    _query(
                        "limit",
                        {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_LIMIT,
                            "default": DEFAULT_LIMIT,
                        },
                        "sessions a page",
                    ),
                    _query("cursor", {"type": "string"}, "the previous page's cursor"),
                ],
                "400",
            ),
            "/v1/sessions/{id}": _get("One session, all fields", "Session", session, "404"),
            "/v1/sessions/{id}/score": _get("A session's current score", "Score", session, "404"),
            "/v1/sessions/{id}/scores": _get(
                "A session's score history, oldest first", "ScoreHistory", session, "404"
            ),
            "/v1/scores": _get(
                "Scores aggregated over sessions, lowest first",
                "Aggregates",
                [
                    _query(
                        "groupBy",
                        {"type": "string", "enum": list(GROUP_BY), "default": "page"},
                        "the key",
                    ),
                    _query(
                        "metric",
                        {"type": "string", "enum": list(METRICS), "default": "avg"},
                        "sort by",
                    ),
                    _query(
                        "window",
                        {"type": "string", "enum": list(WINDOWS), "default": "24h"},
                        "scored within",
                    ),
                ],
                "400",
            ),
        },
    }


def endpoint(version: str) -> Callable[[Request], Awaitable[Response]]:
    """The GET /v1/openapi.json handler (a function: Starlette takes a class for ASGI)."""
    body = document(version)

    async def openapi(request: Request) -> Response:
        return JSONResponse(body)

    return openapi
