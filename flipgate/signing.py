"""Webhook signatures: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + raw body>`.

The timestamp is inside the signed material, so a captured request cannot be sent again
with a new time, and a receiver refuses one whose time is outside its tolerance window.
The one implementation both sides use: `flipgate gate`, the server and its callbacks.
"""

import hashlib
import hmac
import time
from dataclasses import dataclass

HEADER = "X-Flipgate-Signature-256"


class SignatureError(Exception):
    """A signature header that is malformed, stale or does not match; `code` says which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class SignatureHeader:
    """The parts of a signature header: when it was signed and the candidate digests."""

    timestamp: int
    digests: tuple[str, ...]

    @classmethod
    def parse(cls, header: str) -> "SignatureHeader":
        """The header's fields; `malformed_signature` unless it has one t and a v1."""
        fields = [part.strip().partition("=") for part in header.split(",")]
        times = [value for key, _, value in fields if key == "t"]
        digests = tuple(value for key, _, value in fields if key == "v1")
        if len(times) != 1 or not times[0].isdecimal() or len(times[0]) > 12 or not digests:
            raise SignatureError("malformed_signature", f"expected '{HEADER}: t=<unix "
                                 "seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">'")
        return cls(int(times[0]), digests)


def digest(secret: str, body: bytes, timestamp: int) -> str:
    """The hex HMAC-SHA256 of `"<timestamp>." + body` under `secret`."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The signature header value of `body` signed with `secret` at `timestamp` (now)."""
    signed_at = int(time.time()) if timestamp is None else timestamp
    return f"t={signed_at},v1={digest(secret, body, signed_at)}"


def fresh_header(header: str, *, tolerance_seconds: float,
                 now: float | None = None) -> SignatureHeader:
    """The parsed header; SignatureError unless it parses and its timestamp lies within
    `tolerance_seconds` of `now` (the checks that need no body)."""
    parsed = SignatureHeader.parse(header)
    if abs((time.time() if now is None else now) - parsed.timestamp) > tolerance_seconds:
        raise SignatureError("stale_signature", f"the signature's timestamp is more than "
                             f"{tolerance_seconds:g} s away from the server's clock")
    return parsed


def verify(secrets: list[str], body: bytes, header: str, *, tolerance_seconds: float,
           now: float | None = None) -> str:
    """The digest that matched; SignatureError unless `header` signs `body` under one of
    `secrets` at a time within `tolerance_seconds` of `now` (constant-time comparison)."""
    parsed = fresh_header(header, tolerance_seconds=tolerance_seconds, now=now)
    expected = [digest(secret, body, parsed.timestamp) for secret in secrets]
    for want in expected:
        if any(hmac.compare_digest(want.encode(), given.encode()) for given in parsed.digests):
            return want
    raise SignatureError("invalid_signature", "the signature does not match the body")


def signature_matches(secret: str, body: bytes, header: str, *,
                      tolerance_seconds: float = 300) -> bool:
    """Whether `header` is a fresh signature of `body` under `secret`."""
    try:
        verify([secret], body, header, tolerance_seconds=tolerance_seconds)
    except SignatureError:
        return False
    return True
