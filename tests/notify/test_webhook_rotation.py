"""Rotation with both signatures: during the overlap a Standard Webhooks delivery carries
a v1 signature for each secret, the new one first, then only the new one. Checked with the
standardwebhooks package (the reference implementation) as the oracle, each secret alone."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from standardwebhooks.webhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from receiver import signature
from receiver.notify.webhook import new_secret, sign
from tests.notify.test_webhook import hook

BODY = b'{"id":"evt_1","type":"score.drop"}'


def _verifies(secret: str, headers: dict[str, str]) -> bool:
    try:
        Verifier(secret).verify(BODY, headers)
    except WebhookVerificationError:
        return False
    return True


def test_during_the_overlap_each_secret_alone_verifies_then_only_the_new_one() -> None:
    old, new = new_secret("standard"), new_secret("standard")
    now = time.time()
    rotated = replace(
        hook(format="standard", secret=new), previous_secret=old, previous_until=now + 60
    )
    during = sign(rotated, "evt_1", BODY, now)
    entries = during["webhook-signature"].split(" ")
    assert len(entries) == 2 and all(e.startswith("v1,") for e in entries)
    assert (
        entries[0]
        == sign(replace(rotated, previous_secret=None), "evt_1", BODY, now)["webhook-signature"]
    )  # the new one first
    assert _verifies(new, during) and _verifies(old, during)
    assert not _verifies(new_secret("standard"), during)

    after = sign(rotated, "evt_1", BODY, now + 60)  # the overlap has ended
    assert " " not in after["webhook-signature"]
    assert _verifies(new, after) and not _verifies(old, after)


def test_without_an_overlap_only_the_new_secret_signs() -> None:
    old, new = new_secret("standard"), new_secret("standard")
    now = time.time()
    headers = sign(hook(format="standard", secret=new), "evt_1", BODY, now)
    assert _verifies(new, headers) and not _verifies(old, headers)


@pytest.mark.parametrize("overlap", [True, False])
def test_the_service_form_carries_the_new_secret_only(overlap: bool) -> None:
    """X-Service-Signature holds one signature, as the service defines it: the new one."""
    now = time.time()
    rotated = replace(
        hook(secret="new"),
        previous_secret="old" if overlap else None,
        previous_until=now + 60 if overlap else None,
    )
    headers = sign(rotated, "evt_1", BODY, now)
    signature.verify([b"new"], BODY, headers[signature.SIGNATURE_HEADER])
    with pytest.raises(signature.InvalidSignatureError):
        signature.verify([b"old"], BODY, headers[signature.SIGNATURE_HEADER])
