"""flipgate.signing: the one implementation of the webhook signature both sides use."""

import hashlib
import hmac
import re

import pytest

from flipgate.signing import SignatureError, signature, signature_matches, verify

BODY = b'{"model":"m","candidate":"2"}'


def test_the_header_carries_the_time_inside_the_signed_material():
    header = signature("s3cret", BODY, timestamp=1_700_000_000)
    assert re.fullmatch(r"t=1700000000,v1=[0-9a-f]{64}", header)
    # what docs/gate.md's openssl recipe computes: HMAC-SHA256 of "<t>." + body
    assert header.endswith(hmac.new(b"s3cret", b"1700000000." + BODY,
                                    hashlib.sha256).hexdigest())
    assert signature("s3cret", BODY, 1_700_000_001) != header


@pytest.mark.parametrize(("secrets", "body", "now", "code"), [
    (["other"], BODY, 1_700_000_000, "invalid_signature"),
    (["s3cret"], BODY + b" ", 1_700_000_000, "invalid_signature"),
    (["s3cret"], BODY, 1_700_000_301, "stale_signature"),
    (["s3cret"], BODY, 1_699_999_699, "stale_signature"),
])
def test_a_wrong_key_body_or_time_is_refused_with_its_code(secrets, body, now, code):
    header = signature("s3cret", BODY, timestamp=1_700_000_000)
    with pytest.raises(SignatureError) as refused:
        verify(secrets, body, header, tolerance_seconds=300, now=now)
    assert refused.value.code == code


def test_any_of_several_secrets_verifies_and_fresh_signatures_match():
    header = signature("old", BODY, timestamp=1_700_000_000)
    verify(["new", "old"], BODY, header, tolerance_seconds=300, now=1_700_000_299)
    assert signature_matches("s3cret", BODY, signature("s3cret", BODY))
    assert not signature_matches("s3cret", BODY, "sha256=" + "0" * 64)
