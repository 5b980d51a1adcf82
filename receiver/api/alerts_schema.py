"""The OpenAPI part of /v1/alerts (receiver.api.alerts), merged into the document by
receiver.api.openapi: the paths and their schemas."""

from __future__ import annotations

from typing import Any

from receiver.api.alerts import MAX_TEXT
from receiver.api.sessions import MAX_LIMIT
from receiver.store.records import ACTIONS, RECORDED_ACTIONS, RECORDED_SOURCES

_TIME = {"type": "string", "format": "date-time"}
_TEXT = {"type": "string", "nullable": True}  # an event's own timestamp, as it came


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


_REFUSED = {
    "401": _answer(
        "unauthorized: the Bearer key is missing, malformed, unknown or revoked", "Error"
    ),
    "403": _answer("forbidden: the key's role does not allow this", "Error"),
    "429": _answer("rate_limited: the key's plan limit is reached; see Retry-After", "Error"),
}
_NOT_FOUND = {"404": _answer("alert_not_found", "Error")}
_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
# A filter or cursor as api.alerts._text takes it: no NUL (no stored id holds one), at most
# MAX_TEXT characters.
_FILTER = {"type": "string", "maxLength": MAX_TEXT, "pattern": "^[^\\u0000]*$"}
# A snooze as parse_duration reads it, within MAX_SPAN, in the form format_duration writes:
# days up to 365, then hours 0-23, minutes and seconds 0-59, each at most once, in that
# order ("1h30m", "2d", "45s"). The server also reads "90m" as 1h30m; the document names
# the form that no limit can refuse, so that every request it allows is accepted.
SNOOZE_FOR = (
    "^(?:365d|(?:(?:36[0-4]|3[0-5][0-9]|[12][0-9]{2}|[1-9]?[0-9])d)?"
    "(?:(?:1?[0-9]|2[0-3])h)?(?:[1-5]?[0-9]m)?(?:[1-5]?[0-9]s)?)$"
)


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


_ALERT_FIELDS: dict[str, Any] = {
    "id": {"type": "string", "description": "session:<id> or intervention:<session>:<id>"},
    "state": {"type": "string", "enum": ["open", "resolved"]},
    "episode": {"type": "integer", "description": "how many times it has opened"},
    "openedAt": _TEXT,
    "openedEvent": _TEXT,
    "lastEventAt": {"type": "string"},
    "resolvedAt": _TEXT,
    "acked": {
        "type": "object",
        "nullable": True,
        "required": ["by", "at"],
        "properties": {"by": {"type": "string"}, "at": _TIME},
        "additionalProperties": False,
    },
}
_ALERT_REQUIRED = list(_ALERT_FIELDS)

SCHEMAS: dict[str, Any] = {
    "Alert": {
        "type": "object",
        "required": _ALERT_REQUIRED,
        "properties": _ALERT_FIELDS,
        "additionalProperties": False,
    },
    "AlertList": {
        "type": "object",
        "required": ["alerts", "cursor"],
        "properties": {
            "alerts": {"type": "array", "items": _ref("Alert")},
            "cursor": {"type": "string", "nullable": True},
        },
        "additionalProperties": False,
    },
    "AlertDetail": {
        "type": "object",
        "required": [*_ALERT_REQUIRED, "notifications", "actions", "escalations"],
        "properties": {
            **_ALERT_FIELDS,
            "notifications": {
                "type": "array",
                "description": "who was paged when, oldest first (the newest 100)",
                "items": {
                    "type": "object",
                    "required": [
                        "id",
                        "rule",
                        "notifier",
                        "target",
                        "kind",
                        "state",
                        "createdAt",
                        "updatedAt",
                    ],
                    "properties": {
                        "id": {"type": "string"},
                        "rule": {"type": "string"},
                        "notifier": {"type": "string"},
                        "target": {"type": "integer"},
                        "kind": {"type": "string"},
                        "state": {"type": "string"},
                        "createdAt": _TIME,
                        "updatedAt": _TIME,
                    },
                    "additionalProperties": False,
                },
            },
            "actions": {"type": "array", "items": _ref("AlertAction")},
            "escalations": {
                "type": "array",
                "description": "each rule's escalation of the alert, newest episode first",
                "items": _ref("Escalation"),
            },
        },
        "additionalProperties": False,
    },  # fmt: skip
    "EventExplanation": {
        "type": "object",
        "required": [
            "event",
            "type",
            "routedAt",
            "rules",
            "rulesFile",
            "rulesAsOf",
            "duplicates",
            "traceId",
        ],
        "properties": {
            "event": {"type": "string"},
            "type": {"type": "string"},
            "routedAt": {**_TIME, "nullable": True},
            "traceId": {
                "type": "string",
                "nullable": True,
                "description": "The event's OpenTelemetry trace id (hex), if it was traced",
            },
            "rulesFile": {
                "type": "object",
                "required": ["digest", "source"],
                "properties": {"digest": {"type": "string"}, "source": {"type": "string"}},
                "additionalProperties": False,
            },
            "rulesAsOf": {
                "type": "string",
                "enum": ["routing", "now"],
                "description": "routing: the rules file the event was routed with; now: "
                "routed before routing kept its files, explained with today's",
            },
            "duplicates": {
                "type": "integer",
                "description": "deliveries of the same id after the first "
                "(deduplicated: routed once)",
            },
            "rules": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["rule", "matched", "reason"],
                    "properties": {
                        "rule": {"type": "string"},
                        "matched": {"type": "boolean"},
                        "decision": {
                            "type": "string",
                            "enum": [
                                "sent",
                                "held",
                                "digest",
                                "throttled",
                                "silenced",
                                "quiet",
                                "inhibited",
                                "storm",
                                "stale",
                                "flapping",
                                "maintenance",
                                "deduplicated",
                            ],
                        },
                        "reason": {"type": "string"},
                        "states": {
                            "type": "array",
                            "description": "routing's decision first, then each state the"
                            " rule's notification went through since, with its time",
                            "items": {
                                "type": "object",
                                "required": ["decision", "at", "reason"],
                                "properties": {
                                    "decision": {"type": "string"},
                                    "at": _TIME,
                                    "reason": {"type": "string"},
                                },
                                "additionalProperties": False,
                            },
                        },
                        "notifications": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": [
                                    "id",
                                    "notifier",
                                    "target",
                                    "kind",
                                    "state",
                                    "reason",
                                    "createdAt",
                                    "updatedAt",
                                ],
                                "properties": {
                                    "id": {"type": "string"},
                                    "notifier": {"type": "string"},
                                    "target": {"type": "integer"},
                                    "kind": {"type": "string"},
                                    "state": {"type": "string"},
                                    "reason": {"type": "string", "nullable": True},
                                    "createdAt": _TIME,
                                    "updatedAt": _TIME,
                                },
                                "additionalProperties": False,
                            },
                        },
                    },
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    },  # fmt: skip
    "Escalation": {
        "type": "object",
        "required": [
            "policy",
            "rule",
            "episode",
            "status",
            "step",
            "steps",
            "round",
            "rounds",
            "nextAt",
            "startedAt",
            "suppressedSince",
            "log",
        ],
        "properties": {
            "policy": {"type": "string"},
            "rule": {"type": "string"},
            "episode": {"type": "integer"},
            "status": {
                "type": "string",
                "enum": ["running", "acked", "suppressed", "done", "ended"],
            },
            "step": {
                "type": "integer",
                "description": "the next step to page, from 1 (the last, once done)",
            },
            "steps": {"type": "integer"},
            "round": {"type": "integer", "description": "the chain's run, from 1"},
            "rounds": {"type": "integer"},
            "nextAt": {**_TIME, "nullable": True, "description": "when it looks again"},
            "startedAt": _TIME,
            "suppressedSince": {**_TIME, "nullable": True},
            "log": {
                "type": "array",
                "description": "what it did, oldest first: paged (step, round, to), skipped, "
                "acked, reack, resumed, done, ended",
                "items": {
                    "type": "object",
                    "required": ["at", "event"],
                    "properties": {
                        "at": _TIME,
                        "event": {"type": "string"},
                        "step": {"type": "integer"},
                        "round": {"type": "integer"},
                        "to": {"type": "array", "items": {"type": "string"}},
                        "note": {"type": "string"},
                        "eventId": {
                            "type": "string",
                            "description": "started: the event that started the chain",
                        },
                    },
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    },  # fmt: skip
    "AlertAction": {
        "type": "object",
        "required": ["action", "source", "by", "at", "outcome", "episode", "until"],
        "properties": {
            "action": {
                "type": "string",
                "enum": list(RECORDED_ACTIONS),
                "description": "unack: the acknowledgement ran out (an escalation's reack)",
            },
            "source": {"type": "string", "enum": list(RECORDED_SOURCES)},
            "by": {"type": "string", "description": "the API key's name, link, or the reack"},
            "at": _TIME,
            "outcome": {
                "type": "string",
                "enum": ["done", "already", "stale"],
                "description": "stale: a one-click link for an episode that had ended",
            },
            "episode": {"type": "integer"},
            "until": {**_TIME, "nullable": True},
        },
        "additionalProperties": False,
    },
    "ActionResult": {
        "type": "object",
        "required": ["alert", "action", "result", "message", "until"],
        "properties": {
            "alert": {"type": "string"},
            "action": {"type": "string", "enum": list(ACTIONS)},
            "result": {
                "type": "string",
                "enum": ["done", "already"],
                "description": "already: acked, resolved or over already; nothing changed",
            },
            "message": {"type": "string"},
            "until": {**_TIME, "nullable": True},
        },
        "additionalProperties": False,
    },
    "SnoozeRequest": {
        "type": "object",
        "required": ["for"],
        "properties": {
            "for": {
                "type": "string",
                "minLength": 2,
                "pattern": SNOOZE_FOR,
                "example": "1h",
                "description": "how long: days up to 365d, then hours, minutes, seconds",
            }
        },
    },
}

_ACTING = {
    "ack": "Acknowledge it: its repeats and escalation stop until it resolves (role writer)",
    "resolve": "Resolve it now: the resolved message to everyone notified (role writer)",
    "snooze": 'Put its repeats off (body {"for": "1h"}, 1h without a body); notified'
    " again when the snooze ends if still open (role writer)",
}


def _act(name: str) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": _ACTING[name],
        "parameters": [_ID],
        "responses": {"200": _answer("done, or already so", "ActionResult"), **_REFUSED,
                      **_NOT_FOUND},
    }  # fmt: skip
    if name == "snooze":
        op["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": _ref("SnoozeRequest")}},
        }
        op["responses"]["400"] = _answer("invalid_parameter: the body or its duration", "Error")
        op["responses"]["413"] = _answer("payload_too_large: a body over 16 KB", "Error")
    return {"post": op}


PATHS: dict[str, Any] = {
    "/v1/alerts": {
        "get": {
            "summary": "Alerts by id (role reader)",
            "parameters": [
                _query("state", {"type": "string", "enum": ["open", "resolved"]}, "only these"),
                _query("rule", _FILTER, "only alerts this rule notified about"),
                _query("session", _FILTER, "only this session's alerts"),
                _query(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                    "alerts a page",
                ),
                _query(
                    "cursor",
                    _FILTER,
                    "the previous page's cursor (empty: the first page; naming no alert: 400)",
                ),
            ],  # fmt: skip
            "responses": {
                "200": _answer("OK", "AlertList"),
                "400": _answer("invalid_parameter", "Error"),
                **_REFUSED,
            },
        }
    },
    "/v1/alerts/{id}": {
        "get": {
            "summary": "One alert: its state, who was paged when, what was done to it",
            "parameters": [_ID],
            "responses": {"200": _answer("OK", "AlertDetail"), **_REFUSED, **_NOT_FOUND},
        }
    },
    **{f"/v1/alerts/{{id}}/{name}": _act(name) for name in ACTIONS},
    "/v1/events/{id}/explain": {
        "get": {
            "summary": "Why a stored event was routed as it was, from what routing recorded"
            " (role writer)",
            "parameters": [_ID],
            "responses": {
                "200": _answer("OK", "EventExplanation"),
                **_REFUSED,
                "404": _answer("not_found: no event has that id", "Error"),
            },
        }
    },
}
