"""A `flipgate worker` on a real Redis broker runs the jobs that the API sends after its
commit. Unreachable Redis fails the test in CI and skips it elsewhere."""

import os
from contextlib import ExitStack

import numpy as np
import pytest
from fastapi.testclient import TestClient

from flipgate.formats.evalsets import load_evalset
from flipgate.inference import OnnxClassifier
from service.config import Settings
from service.datasets.service import get_dataset
from service.db import settings_session
from service.jobs.models import Job
from service.jobs.service import list_shards
from service.main import create_app
from service.migrate import upgrade
from service.predictions.service import get_predictions, read_logits
from service.registry.service import get_named_version
from service.storage import open_store
from tests.e2e.conftest import (
    empty_redis,
    flipgate_env,
    flipgate_process,
    register,
    wait_for,
    wait_for_jobs,
)

REDIS_URL = os.environ.get("FLIPGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
SHARDS_REDIS_URL = os.environ.get("FLIPGATE_TEST_SHARDS_REDIS_URL", "redis://127.0.0.1:6379/14")
SHARD_SIZE = 20
TOKEN = "redis-admin-token-0123456789"
pytestmark = pytest.mark.slow


@pytest.fixture
def redis_url() -> str:
    """A Redis database emptied for this test."""
    return empty_redis(REDIS_URL)


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
        pending = client.post("/compare/digits:1.0/digits:1.1", params={"evalset": "eval"})
        assert pending.status_code == 202
        jobs = wait_for_jobs(client, pending.json()["job_ids"])
        report = client.get("/compare/digits:1.0/digits:1.1", params={"evalset": "eval"})
    assert {job["progress"] for job in jobs} == {1.0}
    assert report.status_code == 200 and report.json()["n"] == 300


def test_two_workers_share_the_shards_of_a_job(tmp_path, models, evalset):
    data_dir = tmp_path / "data"
    database_url = f"sqlite:///{data_dir / 'flipgate.db'}"
    settings = Settings(data_dir=data_dir, database_url=database_url, admin_token=TOKEN,
                        redis_url=empty_redis(SHARDS_REDIS_URL), shard_size=SHARD_SIZE)
    upgrade(settings)
    env = flipgate_env(FLIPGATE_DATA_DIR=str(data_dir), FLIPGATE_DATABASE_URL=database_url,
                       FLIPGATE_REDIS_URL=settings.redis_url,
                       FLIPGATE_SHARD_SIZE=str(SHARD_SIZE))
    with ExitStack() as stack:
        logs = [tmp_path / "w1", tmp_path / "w2"]
        for folder in logs:
            folder.mkdir()
            stack.enter_context(flipgate_process(["worker", "--concurrency", "1"], env, folder))
        wait_for(lambda: all("ready" in (folder / "worker.log").read_text() for folder in logs),
                 "two ready workers")
        client = stack.enter_context(TestClient(
            create_app(settings), headers={"Authorization": f"Bearer {TOKEN}"}))
        register(client, models[:2], evalset)
        pending = client.post("/compare/digits:1.0/digits:1.1", params={"evalset": "eval"})
        jobs = wait_for_jobs(client, pending.json()["job_ids"])[:-1]  # the inference jobs
    assert [job["result"]["shards"] for job in jobs] == [15, 15]
    store = open_store(settings)
    with settings_session(settings) as session:
        workers = {shard.result["worker"] for job in jobs for shard in list_shards(
            session=session, job=session.get_one(Job, job["id"]))}
        logits = [read_logits(store=store, prediction=get_predictions(
            session=session, dataset=get_dataset(session=session, name="eval"),
            version=get_named_version(session=session, line_name="digits", version=f"1.{index}")))
            for index in range(2)]
    assert len(workers) == 2, workers
    x = load_evalset(evalset).x
    for path, stored in zip(models[:2], logits, strict=True):
        np.testing.assert_array_equal(stored, OnnxClassifier(path).predict(x))
