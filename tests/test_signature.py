import hashlib
import hmac

import pytest

from receiver import signature
from receiver.errors import InvalidSignatureError, MissingSignatureError

# RFC 4231, "Identifiers and Test Vectors for HMAC-SHA-224, -256, -384, and -512", HMAC-SHA-256.
RFC4231 = [
    pytest.param(
        b"\x0b" * 20,
        b"Hi There",
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
        id="case1",
    ),
    pytest.param(
        b"Jefe",
        b"what do ya want for nothing?",
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
        id="case2",
    ),
    pytest.param(
        b"\xaa" * 20,
        b"\xdd" * 50,
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
        id="case3",
    ),
    pytest.param(
        bytes(range(1, 26)),
        b"\xcd" * 50,
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
        id="case4",
    ),
    pytest.param(
        b"\xaa" * 131,
        b"Test Using Larger Than Block-Size Key - Hash Key First",
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
        id="case6",
    ),
    pytest.param(
        b"\xaa" * 131,
        b"This is a test using a larger than block-size key and a larger than block-size data."
        b" The key needs to be hashed before being used by the HMAC algorithm.",
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
        id="case7",
    ),
]

BODY = b'{"id":"evt_1","type":"score.drop"}'
SECRET = b"s3cret"
GOOD = signature.sign(SECRET, BODY)


@pytest.mark.parametrize(("key", "data", "digest"), RFC4231)
def test_sign_matches_rfc4231_vectors(key: bytes, data: bytes, digest: str) -> None:
    assert signature.sign(key, data) == f"sha256={digest}"
    signature.verify([key], data, f"sha256={digest}")


def test_valid_signature_verifies() -> None:
    signature.verify([SECRET], BODY, GOOD)


@pytest.mark.parametrize("header", [None, ""], ids=["absent", "empty"])
def test_missing_signature(header: str | None) -> None:
    with pytest.raises(MissingSignatureError, match="X-Service-Signature header is required"):
        signature.verify([SECRET], BODY, header)


MALFORMED = [
    pytest.param("sha256=", id="prefix-alone"),
    pytest.param(GOOD.removeprefix("sha256="), id="no-prefix"),
    pytest.param("sha1=" + hashlib.sha1(BODY).hexdigest(), id="sha1"),
    pytest.param("sha512=" + GOOD.removeprefix("sha256="), id="other-algorithm"),
    pytest.param("SHA256=" + GOOD.removeprefix("sha256="), id="upper-case-prefix"),
    pytest.param("sha256=" + GOOD.removeprefix("sha256=").upper(), id="upper-case-hex"),
    pytest.param(" " + GOOD, id="leading-space"),
    pytest.param(GOOD + " ", id="trailing-space"),
    pytest.param(GOOD + "\n", id="trailing-newline"),
    pytest.param(GOOD[:-1], id="short"),
    pytest.param(GOOD + "0", id="long"),
    pytest.param("sha256=" + "z" * 64, id="not-hex"),
    pytest.param(GOOD + "," + GOOD, id="two-values"),
    pytest.param("sha256=" + "0" * 64, id="zeros"),
]


@pytest.mark.parametrize("header", MALFORMED)
def test_malformed_or_wrong_signature_is_invalid(header: str) -> None:
    with pytest.raises(InvalidSignatureError):
        signature.verify([SECRET], BODY, header)


def test_signature_over_other_body_is_invalid() -> None:
    with pytest.raises(InvalidSignatureError, match="does not match the body"):
        signature.verify([SECRET], BODY + b" ", GOOD)


def test_secret_that_is_a_prefix_of_the_real_one_is_invalid() -> None:
    with pytest.raises(InvalidSignatureError):
        signature.verify([SECRET[:-1]], BODY, GOOD)


def test_rotation_accepts_either_secret() -> None:
    old, new = b"old-secret", b"new-secret"
    signature.verify([new, old], BODY, signature.sign(old, BODY))
    signature.verify([new, old], BODY, signature.sign(new, BODY))
    with pytest.raises(InvalidSignatureError):
        signature.verify([new], BODY, signature.sign(old, BODY))


def test_every_secret_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(signature.hmac, "compare_digest", spy)
    signature.verify([b"a", SECRET, b"c"], BODY, GOOD)
    assert len(calls) == 3  # no early exit on the match either


def test_error_messages_never_carry_the_secret() -> None:
    with pytest.raises(InvalidSignatureError) as info:
        signature.verify([SECRET], BODY, "sha256=" + "0" * 64)
    assert SECRET.decode() not in str(info.value)
