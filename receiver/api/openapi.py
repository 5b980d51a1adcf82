"""GET /v1/openapi.json: the read API as OpenAPI 3.0 (no key needed). The schemas say what
the endpoints answer, and tests/api/test_openapi.py holds the live server to them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from receiver.api import alerts_schema, silences, webhook_schema
from receiver.api.sessions import DEFAULT_LIMIT, GROUP_BY, MAX_LIMIT, METRICS, WINDOWS
from receiver.events import EVENT_TYPES
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
# Free text as api.sessions.text_param takes it: no NUL (no stored id holds one).
_TEXT = {"type": "string", "pattern": "^[^\\u0000]*$"}
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
            "title": "attention-receiver: the Attention Scoring Service's /v1 API",
            "version": version,
            "description": "Sessions and scores as received by this deployment, webhook"
            " subscriptions, and alerts with their actions. Every endpoint but this document"
            " and POST /v1/events (signed with X-Service-Signature) needs Authorization:"
            " Bearer <key>.",
        },
        "components": {
            "schemas": {**SCHEMAS, **WEBHOOK_SCHEMAS, **alerts_schema.SCHEMAS, **silences.SCHEMAS},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/sessions": _get(
                "List sessions, newest startedAt first",
                "SessionList",
                [
                    _query("userId", _TEXT, "only this user's sessions"),
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
                    _query(
                        "cursor",
                        _TEXT,
                        "the previous page's cursor (empty: the first page; one naming no"
                        " session: 400)",
                    ),
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
            **_webhook_paths(),
            **alerts_schema.PATHS,
            **silences.PATHS,
        },
    }


_WEBHOOK_FIELDS: dict[str, Any] = {
    "id": {"type": "string"},
    "url": {"type": "string", "format": "uri", "maxLength": 2048},
    "events": {"type": "array", "items": {"type": "string", "enum": list(EVENT_TYPES)}},
    "threshold": {"type": "number", "nullable": True},
    "format": {"type": "string", "enum": ["service", "standard"]},
    "status": {"type": "string", "enum": ["active", "disabled"]},
    "statusReason": {"type": "string"},
    "createdAt": _TIMESTAMP,
    "health": {
        "type": "string",
        "enum": ["healthy", "failing", "disabled"],
        "description": "failing: 5 failed deliveries in a row, or an hour of failures (one"
        " probe delivery at a time); disabled: failing for RECEIVER_WEBHOOK_DISABLE_AFTER, or"
        " answered 410 Gone",
    },
    "failingSince": {
        **_NULLABLE_TIMESTAMP,
        "description": "The first failed delivery of those in a row; null after a success",
    },
    "lastError": {"type": "string", "nullable": True},
    "rateLimit": {"type": "number", "nullable": True, "description": "deliveries a second"},
    "filter": {"type": "object", "nullable": True, "description": "as registered"},
    "previousSecretUntil": {
        **_TIMESTAMP,
        "description": "After a rotation with an overlap: until when the secret before signs too",
    },
}
_WEBHOOK_REQUIRED = [n for n in _WEBHOOK_FIELDS if n not in ("statusReason", "previousSecretUntil")]
_DELIVERY_FIELDS: dict[str, Any] = {
    "id": {"type": "string"},
    "eventId": {"type": "string"},
    "sourceEventId": {"type": "string"},
    "state": {"type": "string", "enum": ["pending", "delivered", "failed"]},
    "attempts": {"type": "integer", "minimum": 0},
    "lastStatus": {"type": "integer", "nullable": True},
    "lastError": {"type": "string", "nullable": True},
    "nextAttemptAt": _NULLABLE_TIMESTAMP,
    "createdAt": _TIMESTAMP,
}
WEBHOOK_SCHEMAS: dict[str, Any] = {
    "WebhookRequest": {
        "type": "object",
        "required": ["url", "events"],
        "properties": {
            "url": {
                "type": "string",
                "format": "uri",
                "maxLength": 2048,
                "description": "https:// address to deliver to (a public one: see"
                " RECEIVER_WEBHOOK_ALLOW_PRIVATE and RECEIVER_WEBHOOK_ALLOW_HTTP)",
            },
            "events": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "enum": list(EVENT_TYPES)},
            },
            "threshold": {"type": "number"},
            "format": {"type": "string", "enum": ["service", "standard"], "default": "service"},
            "rateLimit": webhook_schema.RATE_LIMIT,
            "filter": webhook_schema.FILTER,
        },
    },
    "Webhook": {
        "type": "object",
        "required": _WEBHOOK_REQUIRED,
        "properties": _WEBHOOK_FIELDS,
        "additionalProperties": False,
    },
    "WebhookWithSecret": {
        "type": "object",
        "required": [*_WEBHOOK_REQUIRED, "secret"],
        "properties": {**_WEBHOOK_FIELDS, "secret": {"type": "string"}},
        "additionalProperties": False,
    },
    "WebhookList": {
        "type": "object",
        "required": ["webhooks"],
        "properties": {
            "webhooks": {"type": "array", "items": {"$ref": "#/components/schemas/Webhook"}}
        },
        "additionalProperties": False,
    },
    "Delivery": {
        "type": "object",
        "required": list(_DELIVERY_FIELDS),
        "properties": _DELIVERY_FIELDS,
        "additionalProperties": False,
    },
    "DeliveryWithAttempts": {
        "type": "object",
        "required": [*_DELIVERY_FIELDS, "attemptLog"],
        "properties": {
            **_DELIVERY_FIELDS,
            "attemptLog": {
                "type": "array",
                "description": "Every attempt, oldest first (a manual retry goes on numbering)",
                "items": {"$ref": "#/components/schemas/Attempt"},
            },
        },
        "additionalProperties": False,
    },
    "Attempt": {
        "type": "object",
        "required": ["attempt", "at", "status", "durationMs", "error"],
        "properties": {
            "attempt": {"type": "integer", "minimum": 1},
            "at": _TIMESTAMP,
            "status": {"type": "integer", "nullable": True, "description": "HTTP status"},
            "durationMs": {"type": "integer", "minimum": 0},
            "error": {"type": "string", "nullable": True},
            "excerpt": {
                "type": "string",
                "maxLength": 256,
                "description": "The start of the answer (256 bytes at most, on one line)",
            },
        },
        "additionalProperties": False,
    },
    "DeliveryList": {
        "type": "object",
        "required": ["deliveries", "cursor"],
        "properties": {
            "deliveries": {"type": "array", "items": {"$ref": "#/components/schemas/Delivery"}},
            "cursor": {"type": "string", "nullable": True},
        },
        "additionalProperties": False,
    },
    **webhook_schema.SCHEMAS,
}
_WEBHOOK_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}


def _webhook_op(
    summary: str,
    ok: tuple[str, str | None],
    parameters: list[dict[str, Any]],
    *,
    body: bool = False,
    invalid: bool = False,
    found: bool = True,
) -> dict[str, Any]:
    """A /v1/webhooks operation: ok is (status, schema or None for no body)."""
    status, schema = ok
    responses: dict[str, Any] = {
        status: _ok(schema) if schema else {"description": "done"},
        **_ERRORS,
    }
    if invalid:
        responses["400"] = _error("invalid_webhook (or invalid_parameter), naming the field")
    if found:
        responses["404"] = _error("webhook_not_found")
    op: dict[str, Any] = {"summary": summary, "parameters": parameters, "responses": responses}
    if body:
        responses["409"] = _error(
            "invalid_webhook: the key already has RECEIVER_WEBHOOKS_PER_KEY subscriptions"
        )
        responses["413"] = _error("payload_too_large: a body over 16 KB")
        op["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/WebhookRequest"}}
            },
        }
    return op


def _linked(create: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/webhooks with links from its 201 to what may follow it (for clients, and
    schemathesis' stateful runs): the new subscription's id feeds each operation on it."""
    by_id = {"id": "$response.body#/id"}
    create["responses"]["201"]["links"] = {
        name: {"operationRef": f"#/paths/{path.replace('/', '~1')}/{method}", "parameters": by_id}
        for name, path, method in (
            ("GetWebhook", "/v1/webhooks/{id}", "get"),
            ("DeleteWebhook", "/v1/webhooks/{id}", "delete"),
            ("RotateSecret", "/v1/webhooks/{id}/rotate-secret", "post"),
            ("ListDeliveries", "/v1/webhooks/{id}/deliveries", "get"),
            ("TestWebhook", "/v1/webhooks/{id}/test", "post"),
            ("EnableWebhook", "/v1/webhooks/{id}/enable", "post"),
        )
    }
    return create


def _webhook_paths() -> dict[str, Any]:
    one = [_WEBHOOK_ID]
    delivery = {
        "name": "deliveryId", "in": "path", "required": True, "schema": {"type": "string"}
    }  # fmt: skip
    return {
        "/v1/webhooks": {
            "post": _linked(
                _webhook_op(
                    "Subscribe (role writer); the secret is shown only here",
                    ("201", "WebhookWithSecret"),
                    [],
                    body=True,
                    invalid=True,
                    found=False,
                )
            ),
            "get": _webhook_op("The subscriptions", ("200", "WebhookList"), [], found=False),
        },
        "/v1/webhooks/{id}": {
            "get": _webhook_op("One subscription (never its secret)", ("200", "Webhook"), one),
            "delete": _webhook_op("Delete it; unsent deliveries are cancelled", ("204", None), one),
        },
        "/v1/webhooks/{id}/rotate-secret": {"post": webhook_schema.rotate(one)},
        "/v1/webhooks/{id}/deliveries": {
            "get": _webhook_op(
                "Its deliveries, newest first",
                ("200", "DeliveryList"),
                [
                    *one,
                    _query(
                        "limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}, "a page"
                    ),
                    _query(
                        "cursor",
                        {"type": "string", "pattern": "^[0-9]{1,18}$"},
                        "the previous page's cursor",
                    ),
                ],
                invalid=True,
            )
        },
        "/v1/webhooks/{id}/deliveries/{deliveryId}": {
            "get": _webhook_op(
                "One delivery with its attempt log",
                ("200", "DeliveryWithAttempts"),
                [*one, delivery],
            )
        },
        "/v1/webhooks/{id}/deliveries/{deliveryId}/retry": {
            "post": _webhook_op("Send it again now", ("202", "Delivery"), [*one, delivery])
        },
        **webhook_schema.PATHS,
    }


def endpoint(version: str) -> Callable[[Request], Awaitable[Response]]:
    """The GET /v1/openapi.json handler (a function: Starlette takes a class for ASGI)."""
    body = document(version)

    async def openapi(request: Request) -> Response:
        return JSONResponse(body)

    return openapi
