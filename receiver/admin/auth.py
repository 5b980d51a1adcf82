"""Sign-in to the admin page: an admin API key -> a signed session cookie.

The cookie (HttpOnly, SameSite=Strict, 12 hours) carries the key's hash, never the key,
signed with a key kept in the store (so every replica, and the next start, honours it);
each request checks the key again, so a revoked key ends its sessions at once, and
signing out ends every session of that key (a copied cookie too). Every form carries
the session's CSRF token.

Sign-in attempts are counted per client address in the store (so every replica shares
the count): past SIGN_IN_LIMIT a minute, the form answers 429 with Retry-After without
looking at the key.
"""

from __future__ import annotations

import hmac
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer

from receiver.api.auth import hash_key, may
from receiver.links import stored_key
from receiver.store import Store
from receiver.store.base import Tx

COOKIE = "receiver_admin"
MAX_AGE = 12 * 3600
_STATE = "admin-cookie-key"  # the store's named state holding the signing key
_SIGNED_OUT = "admin-signed-out:"  # + a key's hash: when its sessions were last ended
_ATTEMPTS = "admin-sign-in-attempts"  # the store's named state: address -> [start, count]
SIGN_IN_LIMIT = 10  # sign-in attempts from one address in a window
SIGN_IN_WINDOW = 60.0
# Addresses counted at once (the count is one stored value, rewritten at each attempt);
# past this, new addresses share one count, as LogLimiter's "other sources" do.
_MAX_ADDRESSES = 1000
_OTHERS = "other addresses"


@dataclass(frozen=True)
class Session:
    key_name: str
    key_hash: str
    csrf: str


class AdminAuth:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._serializer: URLSafeTimedSerializer | None = None

    async def _signer(self) -> URLSafeTimedSerializer:
        if self._serializer is None:
            secret = await stored_key(self.store, _STATE)
            self._serializer = URLSafeTimedSerializer(secret, salt="receiver-admin")
        return self._serializer

    async def sign_in(self, key: str) -> tuple[str | None, str]:
        """The cookie value for a valid admin key, or None and why not."""
        found, _ = await self.store.keys.authorize(
            hash_key(key.strip()), now=self.clock(), role="admin"
        )
        if found is None:
            return None, "unknown or revoked API key"
        if not may(found.role, "admin"):
            return None, f"key {found.name!r} has role {found.role}; the admin page needs admin"
        # "t": the exact time of issue. The signer's own timestamp is whole seconds, which
        # cannot tell a cookie issued just before a sign-out from one issued just after.
        value = {
            "h": hash_key(key.strip()),
            "n": found.name,
            "c": secrets.token_urlsafe(16),
            "t": self.clock(),
        }
        return (await self._signer()).dumps(value), ""

    async def attempt(self, address: str) -> int:
        """Count a sign-in attempt from address: 0 if it may go on, else the seconds until
        its window ends (a Retry-After). A refused attempt is not counted."""
        now = self.clock()

        def count(tx: Tx) -> int:
            found = tx.state.get(_ATTEMPTS)
            table: dict[str, tuple[float, int]] = {
                str(a): (float(v[0]), int(v[1]))
                for a, v in (found.items() if isinstance(found, dict) else ())
                if isinstance(v, list) and len(v) == 2 and now - v[0] < SIGN_IN_WINDOW
            }
            key = address if address in table or len(table) < _MAX_ADDRESSES else _OTHERS
            start, attempts = table.get(key, (now, 0))
            if attempts >= SIGN_IN_LIMIT:
                return max(1, math.ceil(start + SIGN_IN_WINDOW - now))
            table[key] = (start, attempts + 1)
            tx.state.set(_ATTEMPTS, table)
            return 0

        waited: int = await self.store.transact(count)
        return waited

    async def session(self, cookie: str | None) -> Session | None:
        """The session a cookie proves, while its key is a live admin key; else None."""
        if not cookie:
            return None
        try:
            value, issued = (await self._signer()).loads(
                cookie, max_age=MAX_AGE, return_timestamp=True
            )
        except BadSignature:
            return None
        if not isinstance(value, dict) or not {"h", "n", "c"} <= set(value):
            return None
        found, _ = await self.store.keys.authorize(value["h"], now=self.clock(), role="admin")
        if found is None or not may(found.role, "admin"):
            return None
        name = _SIGNED_OUT + value["h"]
        signed_out = await self.store.transact(lambda tx: tx.state.get(name))
        if isinstance(signed_out, int | float):
            exact = value.get("t")
            if isinstance(exact, int | float) and not isinstance(exact, bool):
                if exact <= signed_out:
                    return None
            # A cookie from before "t" was written: whole seconds, so one issued in the
            # second of the sign-out ends too (signing in again is the cost).
            elif issued.timestamp() <= signed_out:
                return None
        return Session(key_name=found.name, key_hash=value["h"], csrf=value["c"])

    async def sign_out(self, session: Session) -> None:
        """End every session of this key, on every replica (the cookies stay signed, but
        the store says they were issued before the sign-out)."""
        name, now = _SIGNED_OUT + session.key_hash, self.clock()
        await self.store.transact(lambda tx: tx.state.set(name, now))


def csrf_ok(session: Session, token: object) -> bool:
    return isinstance(token, str) and hmac.compare_digest(session.csrf, token)
