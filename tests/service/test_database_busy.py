"""A SQLite database locked by another writer for too long gives a JSON 503 to a request
that writes, not a crash (requests that only read take no write lock)."""

import io
import sqlite3
import threading

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import event

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


def test_a_request_commits_in_its_endpoint_thread(tmp_path):
    """A request that writes ends its transaction in the thread its endpoint ran in
    (service.deps.CommittingRoute), never waiting for another pool thread while it holds
    SQLite's write lock."""
    settings = Settings(data_dir=tmp_path, admin_token=TOKEN)
    upgrade(settings)
    app = create_app(settings)
    began, committed = [], []
    event.listen(app.state.engine, "begin",
                 lambda _connection: began.append(threading.current_thread().name))
    event.listen(app.state.engine, "commit",
                 lambda _connection: committed.append(threading.current_thread().name))
    evalset = io.BytesIO()
    np.savez(evalset, x=np.zeros((4, 2), np.float32), y=np.arange(4) % 2)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        began.clear()
        committed.clear()
        response = api.post("/evalsets", data={"name": "ev"},
                            files={"data": ("ev.npz", evalset.getvalue())})
    assert response.status_code == 201, response.text
    assert len(began) == 1 and committed == began, (began, committed)
