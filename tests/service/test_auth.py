"""API tokens: hashed at rest, scoped, revocable."""

import pytest
from sqlalchemy import select

from service.auth.models import ApiToken
from service.auth.service import (
    authenticate,
    create_token,
    hash_token,
    require_scope,
    revoke_token,
)
from service.errors import Conflict, Forbidden, InvalidInput, Unauthorized


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
