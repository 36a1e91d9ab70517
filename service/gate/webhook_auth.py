"""Who asks the gate without a bearer token (one with scope `gate`: service.deps.authorize):
a CI system that signs the raw body with the line's webhook secret (flipgate.signing:
`t=<unix>,v1=<hex>`)."""

from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from flipgate.signing import HEADER, SignatureError, verify
from service.config import Settings
from service.errors import Unauthorized
from service.gate.models import DELIVERY_LENGTH
from service.gate.webhook_secrets import valid_secrets

SignatureHeader = Annotated[str | None, Header(alias=HEADER, max_length=500)]
DeliveryHeader = Annotated[str | None, Header(alias="X-Flipgate-Delivery",
                                              max_length=DELIVERY_LENGTH)]


async def raw_body(request: Request) -> bytes:
    """The request body exactly as sent (the webhook signature covers these bytes)."""
    return await request.body()


RawBody = Annotated[bytes, Depends(raw_body)]


def webhook_signature(*, session: Session | None, settings: Settings, line_name: str,
                      body: bytes, signature: str | None) -> str:
    """The digest of the body's fresh, valid signature under one of the line's secrets
    (looked up in `session`'s project; None: a project of none, whose lines have none);
    401 `missing_credentials`, `malformed_signature`, `stale_signature` or
    `invalid_signature` otherwise."""
    if signature is None:
        raise Unauthorized("missing_credentials", "send 'Authorization: Bearer <token>' or "
                           f"'{HEADER}: t=<unix seconds>,v1=<hex HMAC of \"<t>.<body>\">'")
    secrets = [] if session is None else valid_secrets(session=session, settings=settings,
                                                        line_name=line_name)
    try:
        return verify(secrets, body, signature,
                      tolerance_seconds=settings.signature_tolerance_seconds)
    except SignatureError as error:
        raise Unauthorized(error.code, f"{error.message} (the webhook secret of "
                           f"{line_name!r})") from error
