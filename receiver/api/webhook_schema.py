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

SCHEMAS: dict[str, Any] = {
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

PATHS: dict[str, Any] = {
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
