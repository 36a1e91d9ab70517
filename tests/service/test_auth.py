"""API tokens: hashed at rest, scoped, revocable, expiring."""

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from service.auth.access import require_scope
from service.auth.models import ApiToken
from service.auth.service import authenticate, create_token, hash_token, revoke_token
from service.db import utcnow
from service.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized


def test_only_the_hash_of_a_token_is_stored(session):
    row, token = create_token(session=session, name="ci", scopes=["read", "gate"])
    stored = session.execute(select(ApiToken.__table__)).one()
    assert token not in {str(value) for value in stored}
    assert row.token_hash == hash_token(token) and token.startswith("fg_")
    assert authenticate(session=session, token=token) is row
    assert row.scopes == ["gate", "read"]


def test_wrong_and_revoked_tokens_are_unauthorized(session):
    _, token = create_token(session=session, name="ci", scopes=["read"])
    with pytest.raises(Unauthorized):
        authenticate(session=session, token=token + "x")
    revoke_token(session=session, name="ci")
    with pytest.raises(Unauthorized) as refused:
        authenticate(session=session, token=token)
    assert refused.value.status_code == 401


def test_scopes_are_required_and_admin_has_them_all(session):
    reader, _ = create_token(session=session, name="reader", scopes=["read"])
    admin, _ = create_token(session=session, name="admin", scopes=["admin"])
    require_scope(reader, "read")
    require_scope(admin, "write")
    with pytest.raises(Forbidden) as refused:
        require_scope(reader, "gate")
    assert refused.value.status_code == 403


@pytest.mark.parametrize("scopes", [[], ["read", "root"]])
def test_unknown_or_missing_scopes_are_refused(session, scopes):
    with pytest.raises(InvalidInput):
        create_token(session=session, name="ci", scopes=scopes)


def test_token_names_are_unique(session):
    create_token(session=session, name="ci", scopes=["read"])
    with pytest.raises(Conflict):
        create_token(session=session, name="ci", scopes=["write"])


def test_a_token_stops_authenticating_when_it_expires(session):
    row, token = create_token(session=session, name="ci", scopes=["read"],
                              expires_in=timedelta(days=30))
    assert timedelta(days=29) < row.expires_at - utcnow() <= timedelta(days=30)
    assert authenticate(session=session, token=token) is row
    row.expires_at = utcnow() - timedelta(seconds=1)
    session.flush()
    with pytest.raises(Unauthorized) as refused:
        authenticate(session=session, token=token)
    assert refused.value.code == "token_expired"


def test_a_token_without_expiry_never_expires(session):
    row, token = create_token(session=session, name="ci", scopes=["read"])
    assert row.expires_at is None
    assert authenticate(session=session, token=token) is row


@pytest.mark.parametrize("expires_in", [timedelta(0), timedelta(days=-1)])
def test_an_expiry_in_the_past_is_refused(session, expires_in):
    with pytest.raises(InvalidInput) as refused:
        create_token(session=session, name="ci", scopes=["read"], expires_in=expires_in)
    assert refused.value.code == "invalid_expiry"
    assert session.scalar(select(func.count()).select_from(ApiToken)) == 0


def test_revoking_an_unknown_token_is_not_found(session):
    with pytest.raises(NotFound) as refused:
        revoke_token(session=session, name="nobody")
    assert refused.value.code == "token_not_found"
