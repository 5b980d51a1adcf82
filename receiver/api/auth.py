"""Bearer API keys: made once, stored as a hash, looked up on every request (so a revoked
key stops at once, on every replica), with the key's plan limit counted in the store.

    key = new_key()                       # shown once, to whoever created it
    store.keys.add(key_hash=hash_key(key), prefix=key[:PREFIX], ...)
    api_key, headers = await Access(store).check(request, "reader")
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable

from starlette.requests import Request

from receiver.errors import ForbiddenError, RateLimitedError, UnauthorizedError
from receiver.store import Store
from receiver.store.records import ROLES, ApiKey, RateLimit

KEY_START = "ar_"  # every key starts so, which secret scanners can match
PREFIX = 10  # characters of a key kept to tell keys apart in `receiver keys list`


def new_key() -> str:
    """A new API key: 256 random bits, URL-safe."""
    return KEY_START + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """What the store keeps of a key. A fast hash is enough: the key is 256 random bits,
    so there is nothing to guess from it (unlike a password)."""
    return hashlib.sha256(key.encode()).hexdigest()


def may(role: str, needed: str) -> bool:
    """Whether a key of role may do what needs `needed` (reader < writer < admin)."""
    return ROLES.index(role) >= ROLES.index(needed)


def limit_headers(limit: RateLimit | None) -> dict[str, str]:
    """The RateLimit-* headers of a response to a key with a plan limit (none without)."""
    if limit is None:
        return {}
    return {
        "RateLimit-Limit": str(limit.limit),
        "RateLimit-Remaining": str(limit.remaining),
        "RateLimit-Reset": str(limit.reset),
    }


class Access:
    """Checks a request's Bearer key, its role and its plan limit."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    async def check(self, request: Request, role: str = "reader") -> tuple[ApiKey, dict[str, str]]:
        """The request's key and the headers its response carries; raises the 401, 403 or
        429 to answer instead, in that order: a key's role before its plan's limit."""
        header = request.headers.get("authorization")
        if header is None:
            raise UnauthorizedError(
                "missing API key: send the header Authorization: Bearer <key>"
                " (`receiver keys create` makes one)"
            )
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or " " in token:
            raise UnauthorizedError("malformed Authorization header: expected Bearer <key>")
        key, limit = await self.store.keys.authorize(hash_key(token), now=self.clock(), role=role)
        if key is None:
            raise UnauthorizedError("unknown or revoked API key")
        # The role first: a request the key may never make is a 403 whatever its plan's
        # count, and spends none of it (the store does not count it).
        if not may(key.role, role):
            raise ForbiddenError(
                f"this key's role is {key.role}; this request needs {role} or above"
            )
        headers = limit_headers(limit)
        if limit is not None and not limit.allowed:
            raise RateLimitedError(
                f"rate limit of the {key.plan} plan reached ({limit.limit} requests a minute);"
                f" retry in {limit.reset} s",
                headers={**headers, "Retry-After": str(limit.reset)},
            )
        return key, headers
