"""Pair reports and a line's matrix over HTTP: a GET answers from stored rows, a POST queues the
inference and metrics jobs (or the matrix job) that store what is missing; the tasks run in
this process."""

import numpy as np
import pytest
from sqlalchemy import select

from flipgate.formats.evalsets import load_evalset
from flipgate.metrics import compare_logits, matrices_from_predictions
from service.compare.models import PairCounts
from service.compare.service import find_pair_metrics, resolve_pair
from service.datasets.service import get_dataset
from service.jobs.models import Job, JobKind, JobState
from service.predictions.service import get_predictions, read_logits, read_predicted_classes
from service.registry.service import get_named_version, set_alias
from tests.service.api.conftest import error_code, measure, run_task
from worker import tasks

VERSIONS = ("1.0", "1.1", "1.2")
CLASSES = 5


@pytest.fixture
def logits(npz_file, upload_model, upload_evalset, upload_logits):
    """Three versions of `digits` (5 classes), the eval set `eval` (200 samples) and each
    version's real logits on it, uploaded; returns the logits and the labels."""
    path = npz_file(n=200, num_classes=CLASSES)
    upload_evalset("eval", path)
    rng = np.random.default_rng(0)
    labels = load_evalset(path).y
    arrays = [np.eye(CLASSES)[labels] * 2 + rng.normal(size=(200, CLASSES)) for _ in VERSIONS]
    for seed, (version, array) in enumerate(zip(VERSIONS, arrays, strict=True)):
        upload_model("digits", version, num_classes=CLASSES, seed=seed)
        assert upload_logits(f"digits:{version}", "eval", array).status_code == 201
    return arrays, labels


def test_compare_returns_the_numbers_of_compare_logits(client, logits):
    arrays, labels = logits
    measure(client, "digits:1.0", "digits:1.2", "eval")
    response = client.get("/compare/digits:1.0/digits:1.2", params={"evalset": "eval"})
    assert response.status_code == 200, response.text
    expected = compare_logits(arrays[0], arrays[2], labels)
    report = response.json()
    assert report.keys() == {*expected, "old", "new"}
    assert {key: report[key] for key in expected} == expected
    assert report["old"] == {"source": "digits:1.0", "provider": "uploaded"}
    again = client.get("/compare/digits:1.0/digits:1.2", params={"evalset": "eval"})
    assert again.json() == report


def test_format_html_returns_the_report_page(client, logits):
    measure(client, "digits:1.0", "digits:1.1", "eval")
    response = client.get("/compare/digits:1.0/digits:1.1",
                          params={"evalset": "eval", "format": "html"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "<svg" in response.text and "digits:1.1" in response.text


def test_the_html_page_is_the_one_the_metrics_job_stored(client, db, worker, logits):
    measure(client, "digits:1.0", "digits:1.1", "eval")
    with db() as session:
        pair = resolve_pair(session=session, old="digits:1.0", new="digits:1.1", evalset="eval")
        row = find_pair_metrics(session=session, old=pair.old, new=pair.new, dataset=pair.dataset)
        html_sha256, row.html_sha256 = row.html_sha256, None  # as if measured before pages
    url, params = "/compare/digits:1.0/digits:1.1", {"evalset": "eval", "format": "html"}
    assert error_code(client.get(url, params=params), 404) == "report_html_not_stored"
    with db() as session:
        find_pair_metrics(session=session, old=pair.old, new=pair.new,
                          dataset=pair.dataset).html_sha256 = html_sha256
    stored = worker.store.path(html_sha256).read_bytes()
    assert client.get(url, params=params).content == stored
    assert b"digits:1.0" in stored and stored.count(b"<svg") >= 4


def test_a_metrics_job_gives_older_predictions_their_classes(client, db, worker, logits):
    arrays, _ = logits
    with db() as session:
        pair = resolve_pair(session=session, old="digits:1.0", new="digits:1.2", evalset="eval")
        for version in (pair.old, pair.new):
            get_predictions(session=session, version=version,
                            dataset=pair.dataset).classes_sha256 = None
    measure(client, "digits:1.0", "digits:1.2", "eval")
    with db() as session:
        for version, array in ((pair.old, arrays[0]), (pair.new, arrays[2])):
            row = get_predictions(session=session, version=version, dataset=pair.dataset)
            assert row.classes_sha256 is not None
            classes = read_predicted_classes(store=worker.store, prediction=row)
            np.testing.assert_array_equal(classes, array.argmax(axis=1))


def test_an_alias_names_the_version_it_points_at(client, db, logits):
    with db() as session:
        set_alias(session=session, line_name="digits", alias="production", version="1.1")
    measure(client, "digits@production", "digits:1.2", "eval")
    by_alias = client.get("/compare/digits@production/digits:1.2", params={"evalset": "eval"})
    assert by_alias.json() == client.get("/compare/digits:1.1/digits:1.2",
                                         params={"evalset": "eval"}).json()
    assert [alias["name"] for alias in client.get("/models/digits").json()["aliases"]] == [
        "production"]
    assert error_code(client.get("/compare/digits@canary/digits:1.2",
                                 params={"evalset": "eval"}), 404) == "alias_not_found"


def test_missing_predictions_queue_one_inference_job_each(client, logits, upload_model):
    upload_model("digits", "2.0", num_classes=CLASSES, seed=7)
    upload_model("digits", "2.1", num_classes=CLASSES, seed=8)
    url, params = "/compare/digits:2.0/digits:2.1", {"evalset": "eval"}
    pending = client.post(url, params=params)
    assert pending.status_code == 202
    body = pending.json()
    *inference, metrics = body["job_ids"]
    assert len(inference) == 2 and body["job_id"] == metrics
    job = client.get(f"/jobs/{inference[0]}").json()
    assert (job["kind"], job["state"], job["progress"]) == ("inference", "queued", 0.0)
    assert job["params"]["version"] == "digits:2.0" and job["params"]["evalset"] == "eval"
    assert client.get(body["status_url"]).json()["kind"] == "metrics"
    assert client.post(url, params=params).json() == body
    assert client.get(url, params=params).json() == body
    assert client.post(f"/jobs/{inference[0]}/cancel").json()["state"] == "cancelled"
    assert error_code(client.post(f"/jobs/{inference[0]}/cancel"), 409) == "invalid_transition"
    assert client.get(body["status_url"]).json()["state"] == "cancelled"
    renewed = client.post(url, params=params).json()
    assert len(renewed["job_ids"]) == 3 and inference[1] in renewed["job_ids"]
    assert inference[0] not in renewed["job_ids"] and renewed["job_id"] != metrics


def test_a_version_is_not_compared_with_itself(client, logits):
    response = client.get("/compare/digits:1.0/digits:1.0", params={"evalset": "eval"})
    assert error_code(response, 422) == "incomparable_versions"


def expected_matrices(arrays: list[np.ndarray], labels: np.ndarray) -> dict[str, list]:
    """The library's matrices of the logits' predicted classes, as JSON lists."""
    expected = matrices_from_predictions([array.argmax(axis=1) for array in arrays], labels)
    return {name: matrix.tolist() for name, matrix in expected.items()}


def test_matrix_equals_pairwise_matrices_of_the_predictions(client, logits, upload_model):
    arrays, labels = logits
    upload_model("digits", "3.0", num_classes=CLASSES, seed=9)  # no predictions: left out
    queued = client.post("/models/digits/matrix", params={"evalset": "eval"})
    assert queued.status_code == 202
    run_task(client, queued.json()["missing"][0]["job_id"])
    matrix = client.get("/models/digits/matrix", params={"evalset": "eval"}).json()
    assert matrix["versions"] == list(VERSIONS) and matrix["missing"] == []
    assert {name: matrix[name] for name in ("nfr", "pfr", "churn")} == expected_matrices(
        arrays, labels)


def test_a_get_reads_only_what_is_stored_and_queues_nothing(client, db, logits):
    with db() as session:
        queued = session.scalars(select(Job.id)).all()
        matrix_job = session.scalars(select(Job.id).where(Job.kind == JobKind.MATRIX)).one()
    url, params = "/compare/digits:1.0/digits:1.1", {"evalset": "eval"}
    assert error_code(client.get(url, params=params), 404) == "not_measured"
    assert error_code(client.get(url, params={**params, "format": "html"}),
                      404) == "not_measured"
    assert error_code(client.get(url, params=params), 404) == "not_measured"
    matrix = client.get("/models/digits/matrix", params={"evalset": "eval"}).json()
    assert matrix["nfr"][0] == [0.0, None, None]
    assert len(matrix["missing"]) == 6
    assert {pair["job_id"] for pair in matrix["missing"]} == {matrix_job}  # the uploads'

    with db() as session:
        assert session.scalars(select(Job.id)).all() == queued

def test_compare_answers_202_with_the_jobs_then_200_once_they_ran(client, db, worker, logits,
                                                                 upload_model):
    arrays, labels = logits
    upload_model("digits", "2.0", num_classes=CLASSES, seed=7)  # no logits: inferred
    url, params = "/compare/digits:1.0/digits:2.0", {"evalset": "eval"}
    queued = client.post(url, params=params)
    assert queued.status_code == 202
    inference, metrics = queued.json()["job_ids"]
    assert client.get(url, params=params).json() == queued.json()
    tasks.inference(inference)
    still = client.get(url, params=params)
    assert still.status_code == 202 and still.json() == queued.json()
    tasks.metrics(metrics)
    report = client.get(url, params=params)
    assert report.status_code == 200
    with db() as session:
        version = get_named_version(session=session, line_name="digits", version="2.0")
        logits_2 = read_logits(store=worker.store, prediction=get_predictions(
            session=session, version=version, dataset=get_dataset(session=session,
                                                                  name="eval")))
    expected = compare_logits(arrays[0], logits_2, labels)
    assert {key: report.json()[key] for key in expected} == expected
    assert client.post(url, params=params).json() == report.json()
    assert client.get(f"/jobs/{metrics}").json()["result"]["compare_url"] == (
        "/compare/digits:1.0/digits:2.0?evalset=eval")


def test_the_matrix_answers_202_with_its_job_then_200_once_it_ran(client, worker, logits):
    arrays, labels = logits
    url, params = "/models/digits/matrix", {"evalset": "eval"}
    measure(client, "digits:1.0", "digits:1.1", "eval")  # a full pair report fills no cell
    partial = client.get(url, params=params)
    assert partial.status_code == 200 and len(partial.json()["missing"]) == 6
    (queued_by_the_uploads,) = {pair["job_id"] for pair in partial.json()["missing"]}
    queued = client.post(url, params=params)
    assert queued.status_code == 202
    missing = queued.json()["missing"]
    assert sorted((pair["old"], pair["new"]) for pair in missing) == [
        (old, new) for old in VERSIONS for new in VERSIONS if old != new]
    (job_id,) = {pair["job_id"] for pair in missing}
    assert job_id == queued_by_the_uploads
    assert client.get(f"/jobs/{job_id}").json()["kind"] == "matrix"
    assert client.post(url, params=params).json() == queued.json()  # the same open job
    assert client.get(url, params=params).json() == queued.json()
    tasks.matrix(job_id)
    complete = client.get(url, params=params)
    assert complete.status_code == 200 and complete.json()["missing"] == []
    assert {name: complete.json()[name] for name in ("nfr", "pfr", "churn")} == (
        expected_matrices(arrays, labels))
    assert client.get(f"/jobs/{job_id}").json()["result"] == {
        "pairs_stored": 3, "matrix_url": "/models/digits/matrix?evalset=eval"}
    again = client.post(url, params=params)
    assert again.status_code == 200 and again.json() == complete.json()


def test_logits_stored_while_the_matrix_job_runs_get_a_job_of_their_own(
        client, db, logits, upload_model, upload_logits):
    url, params = "/models/digits/matrix", {"evalset": "eval"}
    (running,) = {pair["job_id"] for pair in client.get(url, params=params).json()["missing"]}
    with db() as session:  # a worker took it and read the versions with logits so far
        session.get_one(Job, running).state = JobState.RUNNING
    upload_model("digits", "2.0", num_classes=CLASSES, seed=7)
    newest = np.random.default_rng(1).normal(size=(200, CLASSES))
    assert upload_logits("digits:2.0", "eval", newest).status_code == 201
    missing = client.get(url, params=params).json()["missing"]
    (queued,) = {pair["job_id"] for pair in missing}
    assert queued != running and len(missing) == 12
    assert client.get(f"/jobs/{queued}").json()["state"] == "queued"
    assert client.post(url, params=params).json()["missing"] == missing  # that queued job


def test_a_version_added_later_adds_only_its_pairs(client, db, worker, logits, upload_model,
                                                   upload_logits):
    arrays, labels = logits
    url, params = "/models/digits/matrix", {"evalset": "eval"}
    run_task(client, client.post(url, params=params).json()["missing"][0]["job_id"])
    with db() as session:
        before = {(row.id, row.first_version_id, row.second_version_id, row.differ)
                  for row in session.scalars(select(PairCounts))}
    newest = np.random.default_rng(1).normal(size=(200, CLASSES))
    upload_model("digits", "2.0", num_classes=CLASSES, seed=7)
    assert upload_logits("digits:2.0", "eval", newest).status_code == 201
    queued = client.post(url, params=params)
    assert queued.status_code == 202
    assert {pair["old"] for pair in queued.json()["missing"]} | {
        pair["new"] for pair in queued.json()["missing"]} == {*VERSIONS, "2.0"}
    assert all("2.0" in (pair["old"], pair["new"]) for pair in queued.json()["missing"])
    job_id = queued.json()["missing"][0]["job_id"]
    run_task(client, job_id)
    assert client.get(f"/jobs/{job_id}").json()["result"]["pairs_stored"] == 3
    with db() as session:
        after = {(row.id, row.first_version_id, row.second_version_id, row.differ)
                 for row in session.scalars(select(PairCounts))}
    assert before < after and len(after) == 6
    matrix = client.get(url, params=params).json()
    assert {name: matrix[name] for name in ("nfr", "pfr", "churn")} == expected_matrices(
        [*arrays, newest], labels)
