"""A `flipgate worker` on a real Redis broker runs the jobs that the API sends after its
commit. Unreachable Redis fails the test in CI and skips it elsewhere."""

import os

import pytest
import redis
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from service.migrate import upgrade
from tests.e2e.conftest import flipgate_env, flipgate_process, register, wait_for_jobs

REDIS_URL = os.environ.get("FLIPGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TOKEN = "redis-admin-token-0123456789"
pytestmark = pytest.mark.slow


@pytest.fixture
def redis_url() -> str:
    """A Redis database emptied for this test."""
    server = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    try:
        server.flushdb()
    except redis.ConnectionError as error:
        message = f"Redis at {REDIS_URL} is unreachable: {error}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI must test Redis)", pytrace=False)
        pytest.skip(message)
    finally:
        server.close()
    return REDIS_URL


def test_a_worker_on_redis_runs_the_jobs_a_request_queued(tmp_path, redis_url, models,
                                                          evalset):
    data_dir = tmp_path / "data"
    database_url = f"sqlite:///{data_dir / 'flipgate.db'}"
    settings = Settings(data_dir=data_dir, database_url=database_url, redis_url=redis_url,
                        admin_token=TOKEN)
    upgrade(settings)
    env = flipgate_env(FLIPGATE_DATA_DIR=str(data_dir), FLIPGATE_DATABASE_URL=database_url,
                       FLIPGATE_REDIS_URL=redis_url)
    with (flipgate_process(["worker", "--concurrency", "2"], env, tmp_path),
          TestClient(create_app(settings), headers={"Authorization": f"Bearer {TOKEN}"})
          as client):
        register(client, models[:2], evalset)
        pending = client.get("/compare/digits:1.0/digits:1.1", params={"evalset": "eval"})
        assert pending.status_code == 202
        jobs = wait_for_jobs(client, pending.json()["job_ids"])
        report = client.get("/compare/digits:1.0/digits:1.1", params={"evalset": "eval"})
    assert {job["progress"] for job in jobs} == {1.0}
    assert report.status_code == 200 and report.json()["n"] == 300
