"""Webhook signatures: `sha256=<hex HMAC-SHA256 of the raw body>` under a shared secret."""

import hashlib
import hmac

PREFIX = "sha256="


def signature(secret: str, body: bytes) -> str:
    """The X-Flipgate-Signature-256 header value of `body` signed with `secret`."""
    return PREFIX + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_matches(secret: str, body: bytes, header: str) -> bool:
    """Whether `header` is the signature of `body` under `secret` (constant-time compare)."""
    return hmac.compare_digest(signature(secret, body).encode(), header.strip().encode())
