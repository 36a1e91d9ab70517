"""GET /metrics and request ids on the app, on SQLite and PostgreSQL: who may scrape, the
work figures read from the rows (durations, waits and the queue's age computed by each
database), and the X-Request-ID a request is given, echoed and stamped on its jobs."""

import logging
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from service.db import utcnow
from service.jobs.models import Job, JobDependency, JobKind, JobState, WorkerBeat
from service.main import create_app
from service.observability.logs import JsonFormatter
from tests.service.api.conftest import ADMIN_TOKEN, bearer, error_code

pytestmark = pytest.mark.both_backends  # the collector's SQL has a branch per dialect

INFERENCE, METRICS, MATRIX = JobKind.INFERENCE, JobKind.METRICS, JobKind.MATRIX


def figures(client, token: str | None = None) -> dict[tuple[str, frozenset], float]:
    """/metrics as {(sample name, labels): value}."""
    response = client.get("/metrics", headers=bearer(token) if token else None)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples}


def test_only_a_metrics_or_admin_token_scrapes_and_a_metrics_token_does_nothing_else(
        client, mint):
    anonymous = client.get("/metrics", headers={"Authorization": ""})
    assert error_code(anonymous, 401) == "missing_token"
    assert error_code(client.get("/metrics", headers=bearer(mint("read", "write", "gate"))),
                      403) == "missing_scope"
    scraper = mint("metrics")
    assert figures(client, scraper)[("flipgate_build_info", frozenset({("version", "0.1.0")}))]
    assert error_code(client.get("/models", headers=bearer(scraper)), 403) == "missing_scope"
    assert figures(client)  # the admin's token too


def test_a_label_never_holds_what_a_client_chose(client):
    """A method a client makes up is counted as `other`, a path by its route's template."""
    assert client.request("BREW", "/models/a-line-named-by-a-client").status_code == 405
    assert client.get("/a/path/no/route/serves").status_code == 404
    labels = {labels for name, labels in figures(client) if name == "flipgate_http_requests_total"}
    assert frozenset({("method", "other"), ("route", "/models/{name}"),
                      ("status", "405")}) in labels
    assert frozenset({("method", "GET"), ("route", "unmatched"), ("status", "404")}) in labels
    assert not [labels for labels in labels if {"BREW", "/a/path/no/route/serves",
                                                "/models/a-line-named-by-a-client"}
                & {value for _, value in labels}]


def test_the_work_figures_are_computed_from_the_rows(client, db):
    now = utcnow()
    with db() as session:
        arrange_jobs(session, now)
    seen = figures(client)

    def value(name: str, **labels: str) -> float:
        return seen[(name, frozenset(labels.items()))]

    assert value("flipgate_jobs_total", kind="inference", state="succeeded") == 1
    assert value("flipgate_jobs_total", kind="inference", state="failed") == 1
    assert value("flipgate_jobs_total", kind="metrics", state="succeeded") == 1
    assert (value("flipgate_jobs_queued", kind="metrics"),
            value("flipgate_jobs_queued", kind="matrix"),
            value("flipgate_jobs_running", kind="inference")) == (1, 1, 1)
    duration = "flipgate_job_duration_seconds"
    assert [value(f"{duration}_bucket", kind="inference", le=le)
            for le in ("1.0", "2.5", "60.0", "120.0", "+Inf")] == [0, 1, 1, 2, 2]
    assert value(f"{duration}_sum", kind="inference") == pytest.approx(102, abs=0.01)
    assert value(f"{duration}_sum", kind="metrics") == pytest.approx(419, abs=0.01)
    wait = "flipgate_job_queue_wait_seconds"
    # the jobs that ended: a running job's wait changes if it is lost and run again, which
    # would make a counter of the histogram go down
    assert value(f"{wait}_count", kind="inference") == 2
    assert value(f"{wait}_sum", kind="inference") == pytest.approx(35, abs=0.01)
    # the queued metrics job has waited for a worker since the job it needed ended, 60 s
    # ago; the queued matrix job still waits for a running job and is not counted
    assert value("flipgate_oldest_queued_job_age_seconds") == pytest.approx(60, abs=10)
    assert value("flipgate_workers_alive", queue="gpu") == 1
    assert ("flipgate_workers_alive", frozenset({("queue", "callbacks")})) not in seen


def arrange_jobs(session, now) -> None:
    """Jobs of known timings (see the test's expectations) and two workers' beats."""
    def job(kind, state, created, started=None, run=None) -> Job:
        row = Job(kind=kind, state=state, params={"n": len(session.new)},
                  created_at=now - timedelta(seconds=created))
        if started is not None:
            row.started_at = row.created_at + timedelta(seconds=started)
        if run is not None:
            row.finished_at = row.started_at + timedelta(seconds=run)
        session.add(row)
        session.flush()
        return row

    job(INFERENCE, JobState.SUCCEEDED, 600, started=30, run=2)
    job(INFERENCE, JobState.FAILED, 540, started=5, run=100)
    needed = job(METRICS, JobState.SUCCEEDED, 480, started=1, run=480 - 1 - 60)
    waiting = job(METRICS, JobState.QUEUED, 480)
    running = job(INFERENCE, JobState.RUNNING, 120, started=7)
    blocked = job(MATRIX, JobState.QUEUED, 420)
    session.add_all([JobDependency(job_id=waiting.id, waits_for_id=needed.id),
                     JobDependency(job_id=blocked.id, waits_for_id=running.id),
                     WorkerBeat(name="gpu-host:1", queues="gpu,default", seen_at=now),
                     WorkerBeat(name="old-host:2", queues="callbacks",
                                seen_at=now - timedelta(minutes=5))])


def test_metrics_can_be_turned_off(settings):
    with TestClient(create_app(settings.model_copy(update={"metrics": False}))) as off:
        answer = off.get("/metrics", headers=bearer(ADMIN_TOKEN))
        assert error_code(answer, 404) == "not_found"
        assert "X-Request-ID" in off.get("/healthz").headers  # ids and logs stay


@pytest.mark.parametrize(("sent", "kept"), [("ci-run-7:build.3", True), ("x" * 129, False),
                                            ("two words", False), ("", False), (None, False)])
def test_a_request_id_is_the_callers_when_acceptable_else_new(client, sent, kept):
    headers = {} if sent is None else {"X-Request-ID": sent}
    echoed = client.get("/models", headers=headers).headers["X-Request-ID"]
    assert (echoed == sent) if kept else (len(echoed) == 32 and echoed != sent)


def test_the_jobs_a_request_queues_carry_its_request_id(client, db, upload_model,
                                                       upload_evalset, npz_file):
    for version in ("1.0", "1.1"):
        assert upload_model("digits", version, seed=int(version[-1])).status_code == 201
    assert upload_evalset("eval", npz_file()).status_code == 201
    queued = client.post("/compare/digits:1.0/digits:1.1", params={"evalset": "eval"},
                         headers={"X-Request-ID": "ci-run-8"})
    assert queued.status_code == 202 and queued.headers["X-Request-ID"] == "ci-run-8"
    with db() as session:
        stamped = dict(session.execute(select(Job.id, Job.request_id)).all())
    assert stamped == dict.fromkeys(queued.json()["job_ids"], "ci-run-8")


def test_a_json_line_masks_a_url_password_and_carries_the_request_id():
    record = logging.makeLogRecord({"msg": "cannot reach %s", "levelname": "WARNING",
                                    "args": ("postgresql://flipgate:hunter2@db:5432/x",),
                                    "request_id": "ci-run-9", "process_name": "worker"})
    line = JsonFormatter().format(record)
    assert "hunter2" not in line
    assert '"request_id": "ci-run-9"' in line and "flipgate:***@db:5432" in line
