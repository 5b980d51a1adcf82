"""POST /v1/silences, GET /v1/silences and DELETE /v1/silences/:id (role writer): the silences
`receiver silence` and the admin page make, added by the same function
(store.silences), until resolved too; and their OpenAPI part (SCHEMAS,
PATHS), merged into the document by receiver.api.openapi."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver.api import limits
from receiver.api.alerts_schema import SNOOZE_FOR
from receiver.api.auth import Access
from receiver.durations import MAX_SPAN, format_duration, parse_duration
from receiver.errors import InvalidParameterError, SilenceNotFoundError
from receiver.events import iso_epoch
from receiver.matchers import parse_matchers
from receiver.store import Store
from receiver.store.records import Silence

FIELDS = ("match", "for", "reason", "untilResolved", "after")
DEFAULT_FOR = 24 * 3600.0  # an until-resolved silence's limit when the body gives none
DEFAULT_AFTER = 300.0
MAX_TEXT = 500  # a reason, a match field or value: no longer
MAX_MATCH = 20  # fields in one silence's match
LISTED = 500  # the newest silences GET lists


def describe(s: Silence, now: float) -> dict[str, Any]:
    """A silence as the API shows it."""
    state = "expired" if s.expired_at is not None else "active" if s.ends_at > now else "ended"
    return {
        "id": s.id,
        "match": s.matchers,
        "reason": s.reason,
        "state": state,
        "createdAt": iso_epoch(s.created_at),
        "endsAt": iso_epoch(min(s.ends_at, 253402300799.0)),  # a date a client can read
        "expiredAt": None if s.expired_at is None else iso_epoch(s.expired_at),
        "untilResolved": s.after is not None,
        "after": None if s.after is None else format_duration(s.after),
        "alerts": list(s.alerts),
    }


def _duration(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    try:
        return parse_duration(value, limit=MAX_SPAN)
    except ValueError as exc:
        raise InvalidParameterError(f'"{name}": {exc}') from None


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > MAX_TEXT:
        raise InvalidParameterError(
            f"{where} must be text of 1 to {MAX_TEXT} characters, without NUL"
        )
    return value


def parse(body: Any) -> tuple[dict[str, Any], str, float, float | None]:
    """(matchers, reason, seconds, after) from a POST body, or InvalidParameterError."""
    if not isinstance(body, dict):
        raise InvalidParameterError(
            'body must be a JSON object such as {"match": {"userId": "user_42"}, "for": "2h",'
            ' "reason": "load test"}'
        )
    unknown = [k for k in body if k not in FIELDS]
    if unknown:
        raise InvalidParameterError(
            f"unknown field {unknown[0][:40]!r}; allowed: {', '.join(FIELDS)}"
        )
    items = body.get("match")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_MATCH:
        raise InvalidParameterError(f'"match" must be a list of 1 to {MAX_MATCH} FIELD=VALUE texts')
    for item in items:
        _text(item, '"match" items')
    match, problems = parse_matchers(items)  # as `receiver silence add --match` reads them
    if problems:
        raise InvalidParameterError('"match": ' + "; ".join(p[:200] for p in problems[:3]))
    reason = _text(body.get("reason"), '"reason"')
    until_resolved = body.get("untilResolved", False)
    if not isinstance(until_resolved, bool):
        raise InvalidParameterError('"untilResolved" must be true or false')
    if body.get("after") is not None and not until_resolved:
        raise InvalidParameterError('"after" only goes with "untilResolved": true')
    seconds = _duration(body, "for")
    if seconds is None and not until_resolved:
        raise InvalidParameterError('"for" is required (or "untilResolved": true)')
    after = None
    if until_resolved:
        given = _duration(body, "after")
        after = DEFAULT_AFTER if given is None else given
    return match, reason, DEFAULT_FOR if seconds is None else seconds, after


class SilencesAPI:
    def __init__(
        self, store: Store, access: Access, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.access = access
        self.clock = clock

    def routes(self) -> list[Route]:
        return [
            Route("/v1/silences", self._either, methods=["GET", "POST"]),
            Route("/v1/silences/{id}", self.delete, methods=["DELETE"]),
        ]

    async def _either(self, request: Request) -> Response:
        return await (self.create if request.method == "POST" else self.list)(request)

    async def create(self, request: Request) -> Response:
        _, headers = await self.access.check(request, "writer")
        try:
            body = json.loads(await limits.read_body(request))
        except ValueError:
            body = None
        try:
            matchers, reason, seconds, after = parse(body)
        except InvalidParameterError as exc:
            exc.headers = headers
            raise
        now = self.clock()
        made = await self.store.silences.add(matchers, reason, now, now + seconds, after=after)
        return JSONResponse(describe(made, now), status_code=201, headers=headers)

    async def list(self, request: Request) -> Response:
        _, headers = await self.access.check(request, "writer")
        every = request.query_params.get("all") == "true"
        now = self.clock()
        found = await self.store.silences.recent(LISTED)
        shown = [describe(s, now) for s in found]
        if not every:
            shown = [s for s in shown if s["state"] == "active"]
        return JSONResponse({"silences": shown}, headers=headers)

    async def delete(self, request: Request) -> Response:
        _, headers = await self.access.check(request, "writer")
        wanted = request.path_params["id"]
        silence_id = int(wanted) if wanted.isascii() and wanted.isdigit() else None
        if silence_id is None or silence_id > 2**62:
            raise SilenceNotFoundError(f"no silence has the id {wanted[:40]!r}", headers=headers)
        now = self.clock()
        done, found = await self.store.silences.expire(silence_id, now)
        if found is None:
            raise SilenceNotFoundError(f"no silence has the id {wanted[:40]!r}", headers=headers)
        body = {"result": "done" if done else "already", "silence": describe(found, now)}
        return JSONResponse(body, headers=headers)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


_TIME = {"type": "string", "format": "date-time"}
_DURATION = {"type": "string", "minLength": 2, "pattern": SNOOZE_FOR,
             "description": "days up to 365d, then hours, minutes, seconds"}  # fmt: skip
# A matcher as `receiver silence add --match` takes it, FIELD=VALUE, in a form the server
# always takes: a field name or dotted path, then a value that is no ~regex (one RE2 cannot
# run is refused, so the document names the form no pattern can break; the server reads
# "page=~^/check" too): not starting with ~, a space or a quote, or a JSON text in quotes.
MATCHER = (
    "^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*="
    '([^~"\\s\\u0000][^\\u0000]*|"([^~\\\\\\u0000][^\\u0000]*)?)?$'
)
_MATCH = {
    "type": "array",
    "minItems": 1,
    "maxItems": MAX_MATCH,
    "items": {"type": "string", "maxLength": MAX_TEXT, "pattern": MATCHER},
    "example": ["userId=user_42", "page=/checkout*"],
    "description": "FIELD=VALUE, each as rules.yaml reads a match value (exact, glob user_*,"
    ' ~regex, a number, true/false, "42" in double quotes for the text); all must hold',
}
_REASON = {"type": "string", "minLength": 1, "maxLength": MAX_TEXT, "pattern": "^[^\\u0000]+$"}
SCHEMAS: dict[str, Any] = {
    "Silence": {
        "type": "object",
        "required": ["id", "match", "reason", "state", "createdAt", "endsAt", "expiredAt",
                     "untilResolved", "after", "alerts"],
        "properties": {
            "id": {"type": "integer"},
            "match": {"type": "object"},
            "reason": {"type": "string"},
            "state": {"type": "string", "enum": ["active", "ended", "expired"]},
            "createdAt": _TIME,
            "endsAt": {**_TIME, "description": "its limit; until resolved it may end sooner"},
            "expiredAt": {**_TIME, "nullable": True},
            "untilResolved": {"type": "boolean"},
            "after": {"type": "string", "nullable": True},
            "alerts": {"type": "array", "items": {"type": "string"},
                       "description": "until resolved: the open alerts it matched when made"},
        },
        "additionalProperties": False,
    },
    "SilenceList": {
        "type": "object",
        "required": ["silences"],
        "properties": {"silences": {"type": "array", "items": _ref("Silence")}},
        "additionalProperties": False,
    },
    "SilenceExpired": {
        "type": "object",
        "required": ["result", "silence"],
        "properties": {"result": {"type": "string", "enum": ["done", "already"]},
                       "silence": _ref("Silence")},
        "additionalProperties": False,
    },
    "NewSilence": {
        "type": "object",
        "required": ["match", "reason", "for"],
        "properties": {"match": _MATCH, "reason": _REASON, "for": _DURATION,
                       "untilResolved": {"type": "boolean", "enum": [False]}},
        "additionalProperties": False,
    },
    "NewSilenceUntilResolved": {
        "type": "object",
        "required": ["match", "reason", "untilResolved"],
        "properties": {"match": _MATCH, "reason": _REASON, "for": _DURATION,
                       "untilResolved": {"type": "boolean", "enum": [True]},
                       "after": _DURATION},
        "additionalProperties": False,
    },
}  # fmt: skip
_REFUSED = {
    "401": _answer("unauthorized: the Bearer key is missing, malformed, unknown or revoked",
                   "Error"),
    "403": _answer("forbidden: the key's role (writer or admin needed) does not allow this",
                   "Error"),
    "429": _answer("rate_limited: the key's plan limit is reached; see Retry-After", "Error"),
}  # fmt: skip
PATHS: dict[str, Any] = {
    "/v1/silences": {
        "get": {
            "summary": "The active silences, newest first (all=true: ended ones too)",
            "parameters": [{"name": "all", "in": "query", "required": False,
                            "schema": {"type": "string", "enum": ["true", "false"]}}],
            "responses": {"200": _answer("the silences", "SilenceList"), **_REFUSED},
        },
        "post": {
            "summary": "Add a silence: for a while, or until the alerts it matches now have"
            " stayed resolved for after (default 5m; for is then its limit, default 24h)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "oneOf": [_ref("NewSilence"), _ref("NewSilenceUntilResolved")]}}}},
            "responses": {
                "201": _answer("added", "Silence"),
                "400": _answer("invalid_parameter: the body is not a silence", "Error"),
                "413": _answer("payload_too_large", "Error"),
                **_REFUSED,
            },
        },
    },
    "/v1/silences/{id}": {
        "delete": {
            "summary": "End a silence now (what it held that is still open is woken)",
            "parameters": [{"name": "id", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {
                "200": _answer("ended now (done), or already ended", "SilenceExpired"),
                "404": _answer("not_found: no silence has that id", "Error"),
                **_REFUSED,
            },
        },
    },
}  # fmt: skip
