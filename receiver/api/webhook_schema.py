"""The OpenAPI part of the subscriptions' newer operations (receiver.api.webhook_actions):
/test and /enable, merged into the document by receiver.api.openapi with their schemas."""

from __future__ import annotations

from typing import Any


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


_REFUSED = {
    "401": _answer(
        "unauthorized: the Bearer key is missing, malformed, unknown or revoked", "Error"
    ),
    "403": _answer("forbidden: the key's role does not allow this (writer or admin)", "Error"),
    "404": _answer("webhook_not_found", "Error"),
    "429": _answer("rate_limited: the key's plan limit is reached; see Retry-After", "Error"),
}
# An overlap as parse_duration reads it within 7 days, in format_duration's form: days up
# to 7, then hours, minutes and seconds, each at most once, in that order.
OVERLAP = "^(?=.)(?:7d|(?:[0-6]d)?(?:(?:1?[0-9]|2[0-3])h)?(?:[1-5]?[0-9]m)?(?:[1-5]?[0-9]s)?)$"
# A rule's match mapping (docs/rules.md): field or dotted path -> exact value, "glob*",
# "~regex", or one operator object: lt, lte, gt, gte, eq, between, in (any of).
# A scalar condition: an exact value or glob (a string not starting with "~": one that does
# is a regex, which only the server can check, so the document names the plainest ones),
# a number or true/false.
_SCALAR = {
    "anyOf": [
        {"type": "string", "pattern": "^(?:[^~]|$)"},
        {"type": "string", "pattern": "^~[A-Za-z0-9_]+$"},
        {"type": "number"},
        {"type": "boolean"},
    ]
}
_LIST = {"type": "array", "minItems": 1, "items": _SCALAR}
_NUMBER = {"type": "number"}
_CONDITION = {
    "anyOf": [
        _SCALAR,
        _LIST,
        {
            "type": "object",
            "minProperties": 1,
            "properties": {op: _NUMBER for op in ("lt", "lte", "gt", "gte", "eq")},
            "additionalProperties": False,
        },
        {
            "type": "object",
            "required": ["in"],
            "properties": {"in": _LIST},
            "additionalProperties": False,
        },
    ]
}
# OpenAPI 3.0 cannot say which field names are allowed (no propertyNames), so the document
# lists the event's own fields; any payload field or dotted path is taken as well.
FILTER = {
    "type": "object",
    "description": "Only the events that match it, as a rule's match (see docs/rules.md): each"
    ' payload field or dotted path to a value ("u1"), a glob ("user_*"), a regex ("~^u"), an'
    ' operator ({"lt": 30}, {"between": [10, 20]}) or a list (any of), {"in": [...]} the same'
    " as the list; every field must match. Any payload field or dotted path (meta.page) may"
    " be named, not only those listed here. What the rules would refuse is 400"
    " invalid_webhook",
    "properties": {
        name: _CONDITION
        for name in ("type", "sessionId", "userId", "score", "threshold", "interventionId")
    },
    "additionalProperties": False,
    "example": {"userId": "u1", "cohort": {"in": ["beta"]}},
}
RATE_LIMIT = {
    "type": "number",
    "minimum": 1,
    "maximum": 1000,
    "description": "Deliveries a second at most (default: no limit); deliveries over it wait."
    " At most RECEIVER_WEBHOOK_MAX_RATE (1000 unless set)",
}
_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}

_ATTEMPT: dict[str, Any] = {
    "type": "object",
    "required": ["eventId", "delivered", "status", "durationMs", "excerpt", "error"],
    "properties": {
        "eventId": {"type": "string", "description": "the test event's id (webhook-id)"},
        "delivered": {"type": "boolean", "description": "the subscriber answered 2xx"},
        "status": {"type": "integer", "nullable": True, "description": "HTTP status"},
        "durationMs": {"type": "integer", "minimum": 0},
        "excerpt": {
            "type": "string",
            "nullable": True,
            "maxLength": 256,
            "description": "The start of the answer (256 bytes at most, on one line)",
        },
        "error": {"type": "string", "nullable": True},
    },
    "additionalProperties": False,
}

_TIME = {"type": "string", "format": "date-time"}
_JOB_FIELDS: dict[str, Any] = {
    "id": {"type": "string"},
    "state": {"type": "string", "enum": ["running", "done"]},
    "since": _TIME,
    "until": _TIME,
    "all": {"type": "boolean"},
    "queued": {"type": "integer", "minimum": 0, "description": "deliveries queued (again)"},
    "replaced": {
        "type": "integer",
        "minimum": 0,
        "description": "pending retries made due now instead of queued twice",
    },
    "skipped": {
        "type": "integer",
        "minimum": 0,
        "description": "events its types or current filter do not match, delivered ones"
        " without all, or in flight",
    },
    "createdAt": _TIME,
    "finishedAt": {**_TIME, "nullable": True},
}

SCHEMAS: dict[str, Any] = {
    "ReplayRequest": {
        "type": "object",
        "required": ["since"],
        "properties": {
            "since": {**_TIME, "description": "events received from this time (with its zone)"},
            "until": {**_TIME, "description": "to this one, not included (default: now)"},
            "all": {"type": "boolean", "default": False, "description": "delivered ones too"},
        },
        "additionalProperties": False,
    },
    "ReplayJob": {
        "type": "object",
        "required": list(_JOB_FIELDS),
        "properties": _JOB_FIELDS,
        "additionalProperties": False,
    },
    "RotateRequest": {
        "type": "object",
        "properties": {
            "overlap": {
                "oneOf": [
                    {"type": "string", "pattern": OVERLAP, "example": "24h"},
                    {"type": "integer", "minimum": 0, "maximum": 7 * 86400},
                ],
                "description": "How long the secret before goes on signing (at most 7d);"
                " 0 or none: it stops at once",
            }
        },
        "additionalProperties": False,
    },
    "TestAttempt": _ATTEMPT,
    "EnableResult": {
        "type": "object",
        "required": ["webhook", "attempt"],
        "properties": {
            "webhook": _ref("Webhook"),
            "attempt": {
                "allOf": [_ref("TestAttempt")],
                "nullable": True,
                "description": "null when the subscription was not disabled (nothing done)",
            },
        },
        "additionalProperties": False,
    },
    "TestFailed": {
        "type": "object",
        "required": ["error", "attempt"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "enum": ["webhook_test_failed"]},
                    "message": {"type": "string"},
                },
            },
            "attempt": _ref("TestAttempt"),
        },
    },
}


def rotate(parameters: list[dict[str, Any]]) -> dict[str, Any]:
    """POST /v1/webhooks/{id}/rotate-secret."""
    return {
        "summary": "A new signing secret, shown only here; with an overlap, the one before"
        " signs each delivery too until it ends (Standard Webhooks: two v1 entries)",
        "parameters": parameters,
        "requestBody": {
            "required": False,
            "content": {"application/json": {"schema": _ref("RotateRequest")}},
        },
        "responses": {
            "200": _answer("The subscription with its new secret", "WebhookWithSecret"),
            "400": _answer("invalid_webhook: the body or its overlap", "Error"),
            "413": _answer("payload_too_large: a body over 16 KB", "Error"),
            **_REFUSED,
        },
    }


PATHS: dict[str, Any] = {
    "/v1/webhooks/{id}/replay": {
        "post": {
            "summary": "Re-deliver, in event order, every event received in [since, until) that"
            " the subscription matches now (its types, its current filter): failed and never"
            " sent ones, delivered ones only with all; each keeps its webhook-id, a pending"
            " retry is made due instead of doubled; sent at its rate limit. A job: 202 with"
            " its progress and Location",
            "parameters": [_ID],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("ReplayRequest")}},
            },
            "responses": {
                "202": _answer("The job, running", "ReplayJob"),
                "400": _answer("invalid_webhook: the body, since, until or all", "Error"),
                "409": _answer("invalid_webhook: the subscription is disabled", "Error"),
                "413": _answer("payload_too_large: a body over 16 KB", "Error"),
                **_REFUSED,
            },
        }
    },
    "/v1/webhooks/{id}/replays/{job}": {
        "get": {
            "summary": "A replay job's progress",
            "parameters": [
                _ID,
                {"name": "job", "in": "path", "required": True, "schema": {"type": "string"}},
            ],
            "responses": {"200": _answer("The job", "ReplayJob"), **_REFUSED},
        }
    },
    "/v1/webhooks/{id}/test": {
        "post": {
            "summary": "Send a signed webhook.test delivery now (not queued, not retried, not"
            " counted towards health); the attempt, whether the subscriber took it or not",
            "parameters": [_ID],
            "responses": {"200": _answer("The attempt", "TestAttempt"), **_REFUSED},
        }
    },
    "/v1/webhooks/{id}/enable": {
        "post": {
            "summary": "Enable a disabled subscription again if a test delivery succeeds"
            " (its owner told with webhook.recovered); an active one is left as it is",
            "parameters": [_ID],
            "responses": {
                "200": _answer(
                    "Enabled (or active already), with the test attempt", "EnableResult"
                ),
                "409": _answer(
                    "webhook_test_failed: the test delivery failed; it stays disabled",
                    "TestFailed",
                ),
                **_REFUSED,
            },
        }
    },
}
