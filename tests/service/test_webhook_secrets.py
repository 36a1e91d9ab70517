"""The server key that seals webhook secrets rotates without downtime (FLIPGATE_SECRET_KEY
lists keys, newest first), and a secret that no listed key opens is skipped with a warning,
never an error (on SQLite and PostgreSQL)."""

import logging

import pytest
from pydantic import SecretStr

from flipgate.signing import signature
from service.config import Settings
from service.errors import Unauthorized
from service.gate.webhook_auth import webhook_signature
from service.gate.webhook_secrets import rotate_secret, signing_secret, valid_secrets
from service.registry.service import create_line

OLD_KEY, NEW_KEY = "old-server-key-0123456789abcdef", "new-server-key-0123456789abcdef"


def keyed(tmp_path, *keys: str) -> Settings:
    return Settings(data_dir=tmp_path, secret_key=SecretStr(",".join(keys)))


def test_a_rotated_server_key_still_opens_what_the_old_one_sealed(session, tmp_path):
    create_line(session=session, name="digits", num_classes=3)
    first = rotate_secret(session=session, settings=keyed(tmp_path, OLD_KEY), line_name="digits")
    both = keyed(tmp_path, NEW_KEY, OLD_KEY)
    assert valid_secrets(session=session, settings=both, line_name="digits") == [first]
    second = rotate_secret(session=session, settings=both, line_name="digits")
    new_only = keyed(tmp_path, NEW_KEY)  # the new key sealed the second secret
    assert signing_secret(session=session, settings=new_only, line_name="digits") == second


def test_a_secret_no_key_opens_is_skipped_with_a_warning(session, tmp_path, caplog):
    create_line(session=session, name="digits", num_classes=3)
    secret = rotate_secret(session=session, settings=keyed(tmp_path, OLD_KEY),
                           line_name="digits")
    other = keyed(tmp_path, NEW_KEY)
    with caplog.at_level(logging.WARNING):
        assert valid_secrets(session=session, settings=other, line_name="digits") == []
        assert signing_secret(session=session, settings=other, line_name="digits") is None
    assert "opens with none of FLIPGATE_SECRET_KEY's keys" in caplog.text
    body = b'{"model": "digits", "candidate": "1"}'
    with pytest.raises(Unauthorized) as refused:  # the API answers it 401, not 500
        webhook_signature(session=session, settings=other, line_name="digits", body=body,
                          signature=signature(secret, body))
    assert refused.value.code == "invalid_signature"
