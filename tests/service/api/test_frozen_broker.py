"""A broker that stops answering (a redis-server of the test's own, frozen with SIGSTOP)
holds no request: the job rows are committed and the answer comes once the send has given
up; when the broker answers again, the dispatcher sends the jobs and nothing is lost."""

import signal
import threading
import time

import pytest
import redis

from service.celery_app import BROKER_SOCKET_SECONDS
from service.config import Settings
from service.jobs.enqueue import send_unsent
from tests.faults.conftest import spare_redis  # noqa: F401 (the fixture)
from tests.service.api.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.serial  # bounds how long a request waits


@pytest.fixture
def settings(engine, tmp_path, spare_redis) -> Settings:  # noqa: F811
    return Settings(database_url=engine.url.render_as_string(hide_password=False),
                    data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN,
                    redis_url=spare_redis.url)


def test_a_frozen_broker_holds_no_request_and_loses_no_job(client, db, upload_model,
                                                         upload_evalset, npz_file,
                                                         spare_redis):  # noqa: F811
    upload_evalset("ev", npz_file(n=50))
    for version, seed in (("1", 1), ("2", 2)):
        assert upload_model("digits", version, seed=seed).is_success
    spare_redis.process.send_signal(signal.SIGSTOP)
    thaw = threading.Timer(15, spare_redis.process.send_signal, [signal.SIGCONT])
    thaw.start()  # so that a send that waits for the broker ends the test, not hangs it
    try:
        started = time.monotonic()
        queued = client.post("/compare/digits:1/digits:2", params={"evalset": "ev"})
        took = time.monotonic() - started
    finally:
        thaw.cancel()
        spare_redis.process.send_signal(signal.SIGCONT)
    assert queued.status_code == 202, queued.text
    assert took < BROKER_SOCKET_SECONDS + 1.5, took  # one send waited, then gave up
    inference_jobs = queued.json()["job_ids"][:2]  # the metrics job waits for both
    broker = redis.Redis.from_url(spare_redis.url)
    assert broker.llen("gpu") == 0  # nothing reached the broker while it was frozen
    with db() as session:
        sent = send_unsent(session=session, celery=client.app.state.celery, resend_seconds=60)
    assert sorted(sent) == sorted(inference_jobs)
    assert broker.llen("gpu") == 2
