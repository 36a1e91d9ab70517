"""Pair reports, inference jobs for missing predictions, and a line's matrix over HTTP."""

import numpy as np
import pytest

from flipgate.formats import load_evalset
from flipgate.metrics import compare_logits, pairwise_matrices
from service.registry.service import set_alias
from tests.service.api.conftest import error_code

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
    response = client.get("/compare/digits:1.0/digits:1.1",
                          params={"evalset": "eval", "format": "html"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "<svg" in response.text and "digits:1.1" in response.text


def test_an_alias_names_the_version_it_points_at(client, db, logits):
    with db() as session:
        set_alias(session=session, line_name="digits", alias="production", version="1.1")
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
    pending = client.get(url, params=params)
    assert pending.status_code == 202
    body = pending.json()
    assert len(body["job_ids"]) == 2 and body["job_id"] == body["job_ids"][0]
    job = client.get(body["status_url"]).json()
    assert (job["kind"], job["state"], job["progress"]) == ("inference", "queued", 0.0)
    assert job["params"]["version"] == "digits:2.0" and job["params"]["evalset"] == "eval"
    assert client.get(url, params=params).json() == body
    assert client.post(f"/jobs/{body['job_id']}/cancel").json()["state"] == "cancelled"
    assert error_code(client.post(f"/jobs/{body['job_id']}/cancel"), 409) == "invalid_transition"
    renewed = client.get(url, params=params).json()
    assert renewed["job_ids"][1] == body["job_ids"][1] and renewed["job_id"] != body["job_id"]


def test_a_version_is_not_compared_with_itself(client, logits):
    response = client.get("/compare/digits:1.0/digits:1.0", params={"evalset": "eval"})
    assert error_code(response, 422) == "incomparable_versions"


def test_matrix_equals_pairwise_matrices_of_the_predictions(client, logits, upload_model):
    arrays, labels = logits
    upload_model("digits", "3.0", num_classes=CLASSES, seed=9)  # no predictions: left out
    client.get("/compare/digits:1.0/digits:1.1", params={"evalset": "eval"})
    matrix = client.get("/models/digits/matrix", params={"evalset": "eval"}).json()
    expected = pairwise_matrices(np.stack([array.argmax(axis=1) for array in arrays]), labels)
    assert matrix["versions"] == list(VERSIONS)
    for name in ("nfr", "pfr", "churn"):
        np.testing.assert_allclose(np.array(matrix[name]), expected[name])
