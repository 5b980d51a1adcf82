"""The exception hierarchy, and the HTTP status and error code each request error maps to.

    ReceiverError
    ├── RequestError                  a request we refuse; .status and .code
    │   ├── InvalidRequestError       400 invalid_request (not HTTP the parser accepts)
    │   ├── HeaderTimeoutError        408 header_timeout
    │   ├── HeadersTooLargeError      431 headers_too_large
    │   ├── OverloadedError           503 overloaded (RECEIVER_LIMIT_CONCURRENCY reached)
    │   ├── PayloadTooLargeError      413 payload_too_large
    │   ├── BodyTimeoutError          408 body_timeout
    │   ├── SignatureError            401
    │   │   ├── MissingSignatureError     missing_signature
    │   │   └── InvalidSignatureError     invalid_signature
    │   ├── InvalidJSONError          400 invalid_json
    │   ├── InvalidEventError         422 invalid_event
    │   ├── EventTooOldError          422 event_too_old
    │   ├── EventFromFutureError      422 event_from_future
    │   ├── StorageUnavailableError   503 storage_unavailable
    │   └── ApiError                  the read API's and the subscriptions' refusals
    │       ├── UnauthorizedError         401 unauthorized (the Bearer key)
    │       ├── ForbiddenError            403 forbidden (the key's role does not allow it)
    │       ├── RateLimitedError          429 rate_limited (+ Retry-After)
    │       ├── InvalidParameterError     400 invalid_parameter
    │       ├── SessionNotFoundError      404 session_not_found
    │       ├── InvalidWebhookError       400 invalid_webhook
    │       ├── WebhookNotFoundError      404 webhook_not_found
    │       ├── WebhookTestFailedError    409 webhook_test_failed (+ the attempt)
    │       ├── AlertNotFoundError        404 alert_not_found
    │       ├── EventNotFoundError        404 not_found
    │       └── SilenceNotFoundError      404 not_found
    ├── StoreError                    the store failed outside a request
    ├── UpstreamError                 the upstream service refused, failed or was not reached
    └── ConfigError                   rules.yaml or settings are invalid; .problems lists each

A duplicate delivery is a result, not an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ReceiverError(Exception):
    """Base class of every error this package raises on purpose."""


class RequestError(ReceiverError):
    status: int = 400
    code: str = "bad_request"
    event_id: str | None = None  # set when known, for the log line

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidRequestError(RequestError):
    status = 400
    code = "invalid_request"


class HeaderTimeoutError(RequestError):
    status = 408
    code = "header_timeout"


class HeadersTooLargeError(RequestError):
    status = 431
    code = "headers_too_large"


class OverloadedError(RequestError):
    status = 503
    code = "overloaded"


class PayloadTooLargeError(RequestError):
    status = 413
    code = "payload_too_large"


class BodyTimeoutError(RequestError):
    status = 408
    code = "body_timeout"


class SignatureError(RequestError):
    status = 401


class MissingSignatureError(SignatureError):
    code = "missing_signature"


class InvalidSignatureError(SignatureError):
    code = "invalid_signature"


class InvalidJSONError(RequestError):
    status = 400
    code = "invalid_json"


class InvalidEventError(RequestError):
    status = 422
    code = "invalid_event"


class EventTooOldError(RequestError):
    status = 422
    code = "event_too_old"


class EventFromFutureError(RequestError):
    """The event's timestamp is further ahead of our clock than RECEIVER_MAX_CLOCK_SKEW."""

    status = 422
    code = "event_from_future"


class StorageUnavailableError(RequestError):
    status = 503
    code = "storage_unavailable"


class ApiError(RequestError):
    """A refused request to the read API or the subscriptions (not a refused event)."""


class UnauthorizedError(ApiError):
    status = 401
    code = "unauthorized"


class ForbiddenError(ApiError):
    status = 403
    code = "forbidden"


class RateLimitedError(ApiError):
    status = 429
    code = "rate_limited"


class InvalidParameterError(ApiError):
    status = 400
    code = "invalid_parameter"


class SessionNotFoundError(ApiError):
    status = 404
    code = "session_not_found"


class InvalidWebhookError(ApiError):
    status = 400
    code = "invalid_webhook"


class WebhookNotFoundError(ApiError):
    status = 404
    code = "webhook_not_found"


class WebhookTestFailedError(ApiError):
    """A disabled subscription's test delivery failed, so it stays disabled; the body
    carries the attempt beside the error."""

    status = 409
    code = "webhook_test_failed"

    def __init__(
        self, message: str, attempt: dict[str, Any], *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message, headers=headers)
        self.attempt = attempt

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "attempt": self.attempt}


class AlertNotFoundError(ApiError):
    status = 404
    code = "alert_not_found"


class EventNotFoundError(ApiError):
    """GET /v1/events/:id/explain of an id the store does not have (DESIGN.md's generic
    not_found: there is no event_not_found code)."""

    status = 404
    code = "not_found"


class SilenceNotFoundError(ApiError):
    """DELETE /v1/silences/:id of an id no silence has (DESIGN.md's generic not_found)."""

    status = 404
    code = "not_found"


class StoreError(ReceiverError):
    """The store could not do what was asked (outside the ingest path)."""


class UpstreamError(ReceiverError):
    """A request to the upstream service (receiver.upstream) failed: .status is its HTTP
    status (None when it was not reached), .code its error code when it sent one."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class ConfigError(ReceiverError):
    """Configuration is invalid. Each entry of .problems is one message naming the key."""

    def __init__(self, problems: str | Sequence[str], *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        if len(self.problems) == 1:
            super().__init__(head + self.problems[0])
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            super().__init__(f"{head}{len(self.problems)} problems:\n{lines}")


class MethodNotAllowedError(RequestError):
    status = 405
    code = "method_not_allowed"


class ClientDisconnected(Exception):
    """The client went away (or was cut off) before its body was complete."""
