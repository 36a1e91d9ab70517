"""The MLflow connector when things go wrong, on a real `mlflow server`, the API in-process
and `flipgate worker` processes (tests/faults): an alias move MLflow never delivered is
handled by the sweeper's reconcile loop, and a worker killed while it imports a version
leaves one version, one decision and one promotion once another worker has taken over."""

from collections.abc import Iterator
from contextlib import contextmanager

import onnx
import pytest
from mlflow import MlflowClient
from sqlalchemy import select

from service.db import settings_session
from service.gate.models import Decision, Promotion
from service.jobs.models import Job, JobState
from service.registry.models import ModelVersion
from tests.e2e.conftest import wait_for
from tests.faults.conftest import System, kill_group, slow_mlp, system
from tests.integrations.mlflow_world import (
    alias_event,
    classifier,
    digits_split,
    log_version,
    mlflow_server,
    signed,
)
from worker.mlflow import registered_models

SECRET = "mlflow-webhook-secret-for-fault-tests"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow-faults")) as url:
        yield url


@contextmanager
def connector(tmp_path, mlflow_url: str, reconcile_seconds: float) -> Iterator[System]:
    """The API with the connector on, and its workers' environment to match."""
    with system(tmp_path, mlflow_webhook_secret=SECRET, mlflow_tracking_uri=mlflow_url) as running:
        running.env.update(FLIPGATE_MLFLOW_TRACKING_URI=mlflow_url,
                           FLIPGATE_MLFLOW_RECONCILE_SECONDS=str(reconcile_seconds))
        yield running


def aliases(client: MlflowClient, model: str) -> dict[str, str]:
    return client.get_registered_model(model).aliases


def test_lost_events_are_handled_by_the_reconcile_loop(tmp_path, mlflow_url):
    """MLflow has no webhook at all here: every alias move is an event it lost."""
    _, train = digits_split()
    first, other = classifier(train, samples=500), classifier(train, samples=300, scramble=1.5)
    for model in (first, other):
        log_version("lost", model)
    client = MlflowClient(mlflow_url)
    with connector(tmp_path, mlflow_url, reconcile_seconds=1) as running:
        running.start_worker()
        client.set_registered_model_alias("lost", "challenger", "1")
        wait_for(lambda: aliases(client, "lost").get("champion") == "1", "champion set by "
                 "the reconcile loop", timeout=90)
        assert client.get_model_version("lost", "1").tags["flipgate.verdict"] == "approve"

        client.set_registered_model_alias("lost", "champion", "2")
        wait_for(lambda: aliases(client, "lost").get("champion") == "1", "the hand move "
                 "reverted by the reconcile loop", timeout=60)
        assert client.get_model_version("lost", "2").tags["flipgate.verdict"] == "unapproved"
        log = running.client.get("/models/lost/mlflow-events").json()
        assert [(e["action"], e["version"]) for e in log if e["action"] == "reverted"] == [
            ("reverted", "2")]


def test_a_worker_killed_mid_import_loses_nothing_and_repeats_nothing(tmp_path, mlflow_url):
    big = onnx.load(str(slow_mlp(tmp_path / "big.onnx", seed=0)))
    log_version("killed", big)
    client = MlflowClient(mlflow_url)
    client.set_registered_model_alias("killed", "challenger", "1")  # no webhook: we deliver
    with connector(tmp_path, mlflow_url, reconcile_seconds=3600) as running:
        body = alias_event("killed", "challenger", "1")
        headers = signed(body, secret=SECRET, delivery="killed-challenger-1")
        response = running.client.post("/integrations/mlflow/webhook", content=body,
                                        headers=headers)
        assert response.status_code == 202, response.text
        job_id = response.json()["job_id"]
        first = running.start_worker()
        wait_for(lambda: job_state(running, job_id) == JobState.RUNNING, "the import running",
                 timeout=60)
        kill_group(first)
        assert "flipgate.verdict" not in client.get_model_version("killed", "1").tags
        running.start_worker()
        wait_for(lambda: aliases(client, "killed").get("champion") == "1",
                 "champion after the second worker's import", timeout=120)
        with settings_session(running.settings) as session:
            job = session.get(Job, job_id)
            assert (job.state, job.attempts) == (JobState.SUCCEEDED, 2)
            assert len(session.scalars(select(ModelVersion)).all()) == 1
            assert len(session.scalars(select(Decision)).all()) == 1
            assert len(session.scalars(select(Promotion)).all()) == 1


def job_state(running: System, job_id: int) -> JobState:
    with settings_session(running.settings) as session:
        return session.get(Job, job_id).state


def test_the_reconcile_loop_reads_every_page_of_registered_models(mlflow_url):
    client = MlflowClient(mlflow_url)
    names = {f"paged-{index}" for index in range(5)}
    for name in names:
        client.create_registered_model(name)
    assert names <= {model.name for model in registered_models(client, page_size=2)}
