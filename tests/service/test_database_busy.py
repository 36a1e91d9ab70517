"""A SQLite database locked by another writer for too long gives a JSON 503 to a request
that writes, not a crash (requests that only read take no write lock)."""

import sqlite3

from fastapi.testclient import TestClient

from service import db
from service.config import Settings
from service.main import create_app
from service.migrate import upgrade

TOKEN = "busy-test-admin-token-0123"


def test_a_locked_database_answers_503_with_retry_after(tmp_path, monkeypatch):
    settings = Settings(data_dir=tmp_path, admin_token=TOKEN)
    upgrade(settings)
    monkeypatch.setattr(db, "SQLITE_BUSY_SECONDS", 0.2)
    other_writer = sqlite3.connect(tmp_path / "flipgate.db", isolation_level=None)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        other_writer.execute("BEGIN EXCLUSIVE")
        try:
            response = api.post("/gate", json={"model": "m", "candidate": "2"})  # a write
            read_while_locked = api.get("/models")
        finally:
            other_writer.execute("ROLLBACK")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "database_busy"
        assert response.headers["Retry-After"] == "1"
        assert read_while_locked.status_code == 200, read_while_locked.text
