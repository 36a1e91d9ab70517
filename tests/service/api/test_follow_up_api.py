"""Registering a version queues its follow-up jobs: inference on the eval sets its line was
measured on, then metrics against its parent and `production` once both logits exist. The
tasks run directly on the client's database and send through its Celery app (folder broker)."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import delete, func, select

from flipgate.formats.evalsets import load_evalset
from flipgate.metrics import compare_logits
from service import flows
from service.celery_app import ROUTES
from service.compare.service import find_pair_metrics
from service.datasets.service import get_dataset
from service.db import session_scope
from service.jobs.models import Job, JobKind, JobState
from service.jobs.service import dependencies, get_job, start_job
from service.predictions.service import get_predictions, read_logits
from service.registry.models import Alias
from service.registry.service import get_version, set_alias
from tests.service.api.conftest import post_evalset, post_logits, post_model, shared_store
from tests.service.conftest import write_npz, write_onnx
from worker import tasks

N = 40


def sent(celery: Celery) -> list[tuple[str, int]]:
    """The (task name, job id) of the messages waiting on the broker, consumed."""
    messages = []
    with celery.connection_for_read() as connection:
        for name in {"default", *(route["queue"] for route in ROUTES.values())}:
            queue = connection.SimpleQueue(name)
            while (message := _next(queue)) is not None:
                message.ack()
                messages.append((message.headers["task"], message.payload[0][0]))
            queue.close()
    return messages


def _next(queue):
    try:
        return queue.get(block=False)
    except queue.Empty:
        return None


@pytest.fixture(autouse=True)
def jobs(db) -> Callable[[], list[Job]]:
    """The jobs this test made, in order: the worker's tests commit theirs to the same
    database, so a module that ran before this one on the same process leaves jobs behind."""
    with db() as session:
        before = session.scalar(select(func.max(Job.id))) or 0

    def made() -> list[Job]:
        with db() as session:
            return list(session.scalars(select(Job).where(Job.id > before).order_by(Job.id)))

    return made


def seed_measured_line(client: TestClient, folder: Path) -> dict:
    """`line:1.0` with uploaded logits on the eval set `eval`, and `line@production` on it;
    its id and the eval set's labels."""
    path = write_npz(folder, n=N)
    post_evalset(client, "eval", path)
    response = post_model(client, "line", "1.0", write_onnx(folder).read_bytes())
    logits = np.random.default_rng(0).normal(size=(N, 3))
    assert post_logits(client, "line:1.0", "eval", logits).status_code == 201
    with session_scope(client.app.state.sessions) as session:
        set_alias(session=session, line_name="line", alias="production", version="1.0")
    return {"old_id": response.json()["id"], "labels": load_evalset(path).y}


# the tests that use `measured_line` share one store per database, seeded once; the others
# start from an empty one
client, settings = shared_store(measured_line=seed_measured_line)


@pytest.fixture
def measured_line(client, module_store) -> dict:
    """What seed_measured_line returned, on the store it seeded."""
    return module_store.seeded


def test_a_version_is_scored_then_compared_with_its_parent_and_production(
        client, db, jobs, worker, measured_line, upload_model):
    response = upload_model("line", "1.1", seed=1, parent="line:1.0")
    assert response.status_code == 201 and response.json()["version"] == "1.1"
    old_id, new_id = measured_line["old_id"], response.json()["id"]
    inference, metrics = jobs()
    assert (inference.kind, inference.params["version_id"], inference.params["evalset"]) == (
        JobKind.INFERENCE, new_id, "eval")
    assert metrics.kind == JobKind.METRICS and metrics.params == {
        "old_version_id": old_id, "new_version_id": new_id, "evalset": "eval"}
    with db() as session:
        assert [job.id for job in dependencies(session=session, job=metrics)] == [inference.id]
    assert sent(worker.celery) == [("flipgate.inference", inference.id)]

    tasks.inference(inference.id)
    assert client.get(f"/jobs/{metrics.id}").json()["state"] == JobState.QUEUED
    matrix = jobs()[-1]  # the stored logits add the version to its line's matrix
    assert (matrix.kind, matrix.params) == (JobKind.MATRIX, {"line": "line", "evalset": "eval"})
    assert sorted(sent(worker.celery)) == [("flipgate.matrix", matrix.id),
                                           ("flipgate.metrics", metrics.id)]

    tasks.metrics(metrics.id)
    assert client.get(f"/jobs/{metrics.id}").json()["state"] == JobState.SUCCEEDED
    with db() as session:
        old, new = (get_version(session=session, version_id=id_) for id_ in (old_id, new_id))
        dataset = get_dataset(session=session, name="eval")
        stored = find_pair_metrics(session=session, old=old, new=new, dataset=dataset)
        expected = compare_logits(*(read_logits(store=worker.store, prediction=get_predictions(
            session=session, version=version, dataset=dataset)) for version in (old, new)),
            measured_line["labels"])
    assert [stored.nfr, stored.pfr, stored.churn] == pytest.approx(
        [expected["nfr"], expected["pfr"], expected["churn"]])


def test_a_version_of_a_line_without_logits_queues_nothing(client, db, jobs, worker, upload_model):
    assert upload_model("line", "1.0").status_code == 201
    assert upload_model("line", "1.1", seed=1, parent="line:1.0").status_code == 201
    assert jobs() == [] and sent(worker.celery) == []


def test_a_cancelled_inference_cancels_the_metrics_waiting_for_it(
        client, db, jobs, worker, measured_line, upload_model):
    assert upload_model("line", "1.1", seed=1, parent="line:1.0").status_code == 201
    inference, metrics = jobs()
    assert client.post(f"/jobs/{inference.id}/cancel").status_code == 200
    waiting = client.get(f"/jobs/{metrics.id}").json()
    assert waiting["state"] == JobState.CANCELLED
    assert f"job {inference.id}, which it waited for, cancelled" in waiting["error"]


def test_a_metrics_job_is_sent_once_the_last_job_it_waits_for_succeeds(
        client, db, worker, measured_line, upload_model):
    upload_model("line", "2.0", seed=2)
    upload_model("line", "2.1", seed=3)
    first, second, metrics = client.post("/compare/line:2.0/line:2.1",
                                         params={"evalset": "eval"}).json()["job_ids"]
    assert sent(worker.celery) == [("flipgate.inference", first),
                                   ("flipgate.inference", second)]
    tasks.inference(second)  # (each version's own measurement against production is sent)
    assert ("flipgate.metrics", metrics) not in sent(worker.celery)
    tasks.inference(first)
    assert ("flipgate.metrics", metrics) in sent(worker.celery)


def test_a_failed_inference_cancels_the_measurement_and_asking_again_queues_anew(
        client, db, worker, measured_line, upload_model):
    upload_model("line", "2.0", seed=2)
    url, params = "/compare/line:1.0/line:2.0", {"evalset": "eval"}
    inference, metrics = client.post(url, params=params).json()["job_ids"]
    with db() as session:
        flows.finish_job(session=session, settings=client.app.state.settings, job=start_job(
            session=session, job=get_job(session=session, job_id=inference)),
            state=JobState.FAILED, error="out of memory")
    assert client.get(f"/jobs/{metrics}").json()["state"] == JobState.CANCELLED
    again = client.post(url, params=params).json()["job_ids"]
    assert inference not in again and metrics not in again


def test_uploaded_logits_are_measured_against_the_parent(client, db, jobs, worker, measured_line,
                                                          upload_model, upload_logits):
    assert upload_model("line", "2.0", seed=2, parent="line:1.0").status_code == 201
    inference, metrics = jobs()
    sent(worker.celery)
    logits = np.random.default_rng(1).normal(size=(N, 3))
    assert client.post(f"/jobs/{inference.id}/cancel").is_success  # the team uploads instead
    assert upload_logits("line:2.0", "eval", logits).status_code == 201
    measuring, matrix = jobs()[-2:]
    assert measuring.kind == JobKind.METRICS and measuring.id != metrics.id
    assert matrix.kind == JobKind.MATRIX
    assert sorted(sent(worker.celery)) == [("flipgate.matrix", matrix.id),
                                           ("flipgate.metrics", measuring.id)]
    tasks.metrics(measuring.id)
    report = client.get("/compare/line:1.0/line:2.0", params={"evalset": "eval"}).json()
    with db() as session:
        old = read_logits(store=worker.store, prediction=get_predictions(
            session=session, dataset=get_dataset(session=session, name="eval"),
            version=get_version(session=session, version_id=measured_line["old_id"])))
    assert report["nfr"] == compare_logits(old, logits, measured_line["labels"])["nfr"]


def test_a_version_without_baselines_is_still_scored_on_the_measured_sets(
        client, db, jobs, worker, measured_line, upload_model):
    with db() as session:
        session.execute(delete(Alias))  # no production version
    assert upload_model("line", "2.0", seed=2).status_code == 201  # and no parent
    [inference] = jobs()
    assert (inference.kind, inference.params["version"]) == (JobKind.INFERENCE, "line:2.0")
    assert sent(worker.celery) == [("flipgate.inference", inference.id)]
