"""Revision 0005 encrypts the webhook secrets stored in plaintext before it, with the server
key `flipgate migrate` runs with, and its downgrade gives them back in plaintext."""

from alembic import command
from sqlalchemy import text

from service.config import Settings
from service.db import create_db_engine
from service.migrate import alembic_config, migrating, upgrade
from service.sealing import cipher

PLAINTEXT = "ab" * 32


def test_0005_encrypts_stored_secrets_and_its_downgrade_decrypts_them(tmp_path):
    settings = Settings(data_dir=tmp_path, secret_key="a-real-server-key-0123456789")
    engine = create_db_engine(settings)
    try:
        with engine.begin() as connection:
            command.upgrade(alembic_config(connection), "0002")
            connection.execute(text("INSERT INTO model_lines (id, name, num_classes, created_at)"
                                    " VALUES (1, 'digits', 3, CURRENT_TIMESTAMP)"))
            connection.execute(text("INSERT INTO webhook_secrets (id, line_id, secret, "
                                    "created_at) VALUES (1, 1, :secret, CURRENT_TIMESTAMP)"),
                               {"secret": PLAINTEXT})
        upgrade(settings)
        with migrating(engine) as connection:
            stored = connection.scalar(text("SELECT secret FROM webhook_secrets"))
            assert PLAINTEXT not in stored
            assert cipher(settings).decrypt(stored.encode()).decode() == PLAINTEXT
            config = alembic_config(connection)
            config.attributes["settings"] = settings
            command.downgrade(config, "0002")
            assert connection.scalar(text("SELECT secret FROM webhook_secrets")) == PLAINTEXT
    finally:
        engine.dispose()
