"""Sign and verify deliveries: ``X-Service-Signature: sha256=<hex HMAC-SHA256(secret, raw body)>``.

Pure functions over bytes; nothing here knows about HTTP frameworks or storage.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence

from receiver.errors import InvalidSignatureError, MissingSignatureError

SIGNATURE_HEADER = "X-Service-Signature"
PREFIX = "sha256="
# Exactly the form the service sends: the prefix, then 64 lowercase hex digits, nothing else.
_FORM = re.compile(r"sha256=[0-9a-f]{64}")


def sign(secret: bytes, body: bytes) -> str:
    """The header value for body under secret.

    >>> sign(b"key", b"The quick brown fox jumps over the lazy dog")
    'sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8'
    """
    return PREFIX + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secrets: Sequence[bytes], body: bytes, header: str | None) -> None:
    """Raise a SignatureError unless header is the HMAC-SHA256 of body under one of secrets.

    Every secret is tried (rotation keeps two for a while) and each comparison
    is constant time, so neither the match nor which secret matched leaks
    through timing.
    """
    if header is None or header == "":
        raise MissingSignatureError(f"{SIGNATURE_HEADER} header is required")
    if not _FORM.fullmatch(header):
        raise InvalidSignatureError(
            f"{SIGNATURE_HEADER} must be 'sha256=' followed by 64 lowercase hex digits"
        )
    given = bytes.fromhex(header[len(PREFIX) :])
    matched = False
    for secret in secrets:
        # hmac.digest: OpenSSL's one-shot HMAC, without hmac.new()'s Python object.
        matched |= hmac.compare_digest(hmac.digest(secret, body, "sha256"), given)
    if not matched:
        raise InvalidSignatureError(f"{SIGNATURE_HEADER} does not match the body")
