"""External versions (no model file): an LLM prompt's or a remote API's predicted labels on
scikit-learn's wine data are uploaded, compared, matrixed and gated like any version, with
counts equal to numpy's; what needs weights or scores is refused or null."""

from dataclasses import dataclass

import numpy as np
import pytest
from sklearn.datasets import load_wine
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier

from service.registry.service import create_line
from tests.service.api.conftest import error_code, measure, npy_bytes, run_task

CLASS_NAMES = ["barolo", "grignolino", "barbera"]
WINE_EVAL = "wine-eval"  # not the dashboard fixtures' "eval"
SCORE_KEYS = ("schurn", "schurn_alpha", "confidence", "displacement", "flip_rank")


@dataclass(frozen=True)
class Wine:
    labels: np.ndarray
    predictions: dict[str, np.ndarray]  # version -> predicted classes


@pytest.fixture(scope="module")
def wine(tmp_path_factory) -> tuple[Wine, bytes]:
    """Two real classifiers' predictions on wine's held-out half, and the eval set's .npz."""
    x, y = load_wine(return_X_y=True)
    rng = np.random.default_rng(0)
    order = rng.permutation(y.size)
    train, test = order[:60], order[60:]
    prompt = DecisionTreeClassifier(max_depth=2, random_state=0).fit(x[train], y[train])
    api = LogisticRegression(max_iter=5000).fit(x[train], y[train])
    path = tmp_path_factory.mktemp("wine") / "eval.npz"
    np.savez(path, x=x[test].astype(np.float32), y=y[test])
    return Wine(y[test], {"prompt-v1": prompt.predict(x[test]),
                          "api-v2": api.predict(x[test])}), path.read_bytes()


def upload_labels(client, version: str, labels: np.ndarray, evalset: str = WINE_EVAL):
    return client.post(f"/models/wine/versions/{version}/predictions",
                       data={"evalset": evalset},
                       files={"labels": ("labels.npy", npy_bytes(labels))})


@pytest.fixture
def external_line(client, db, wine):
    """Line `wine` (class names set) with two external versions whose labels are uploaded:
    prompt-v1 as class names, api-v2 as integers."""
    data, npz = wine
    with db() as session:
        create_line(session=session, name="wine", num_classes=3, class_names=CLASS_NAMES)
    assert client.post("/evalsets", data={"name": WINE_EVAL},
                       files={"data": ("eval.npz", npz)}).status_code == 201
    for version in data.predictions:
        response = client.post("/models", data={"name": "wine", "version": version})
        assert response.status_code == 201, response.text
        assert response.json()["external"] and response.json()["artifact_sha256"] is None
    names = np.asarray(CLASS_NAMES)[data.predictions["prompt-v1"]]
    assert upload_labels(client, "prompt-v1", names).status_code == 201
    assert upload_labels(client, "api-v2", data.predictions["api-v2"]).status_code == 201
    return data


def expected_counts(old: np.ndarray, new: np.ndarray, y: np.ndarray) -> dict:
    return {"negative_flips": int(((old == y) & (new != y)).sum()),
            "positive_flips": int(((old != y) & (new == y)).sum()),
            "both_wrong": int(((old != y) & (new != y)).sum()),
            "churn": float((old != new).mean()), "er_old": float((old != y).mean()),
            "er_new": float((new != y).mean())}


def test_labels_only_pair_report_has_every_count_and_null_scores(client, external_line):
    report = measure(client, "wine:prompt-v1", "wine:api-v2", WINE_EVAL)
    old, new, y = (external_line.predictions["prompt-v1"], external_line.predictions["api-v2"],
                   external_line.labels)
    expected = expected_counts(old, new, y)
    assert {key: report[key] for key in expected} == pytest.approx(expected)
    assert report["flipped_indices"]["negative"] == np.flatnonzero(
        (old == y) & (new != y)).tolist()
    assert [row["n"] for row in report["per_class"]] == np.bincount(y, minlength=3).tolist()
    assert report["labels_only"] and 0 <= report["mcnemar_p"] <= 1
    assert all(report[key] is None for key in SCORE_KEYS)
    page = client.get("/compare/wine:prompt-v1/wine:api-v2",
                      params={"evalset": WINE_EVAL, "format": "html"}).text
    assert "predicted labels only" in page


def test_the_matrix_counts_external_versions(client, external_line):
    queued = client.post("/models/wine/matrix", params={"evalset": WINE_EVAL}).json()
    run_task(client, queued["missing"][0]["job_id"])
    matrix = client.get("/models/wine/matrix", params={"evalset": WINE_EVAL}).json()
    old, new, y = (external_line.predictions["prompt-v1"], external_line.predictions["api-v2"],
                   external_line.labels)
    first, second = (matrix["versions"].index(v) for v in ("prompt-v1", "api-v2"))
    assert matrix["nfr"][first][second] == pytest.approx(float(((old == y) & (new != y)).mean()))
    assert matrix["churn"][first][second] == pytest.approx(float((old != new).mean()))


def test_the_gate_decides_on_labels_and_repairs_are_refused(client, external_line):
    old, new, y = (external_line.predictions["prompt-v1"], external_line.predictions["api-v2"],
                   external_line.labels)
    nfr = float(((old == y) & (new != y)).mean())
    assert nfr > 0, "the two real classifiers must disagree for this test to mean anything"
    measure(client, "wine:prompt-v1", "wine:api-v2", WINE_EVAL)
    assert client.post("/gate", json={"model": "wine", "candidate": "prompt-v1"}).json()[
        "verdict"] == "approve"
    assert client.post("/models/wine/aliases/production", json={"version": "prompt-v1"}).is_success
    assert client.post("/models", data={"name": "wine", "version": "v3"}).status_code == 201
    unscored = client.post("/gate", json={"model": "wine", "candidate": "v3",
                                          "evalsets": [WINE_EVAL]})
    assert error_code(unscored, 409) == "predictions_missing"
    for bound, verdict in ((nfr / 2, "block"), (min(1.0, nfr * 2 + 0.01), "approve")):
        assert client.put("/models/wine/policy",
                          json={"max_nfr": bound, "evalsets": [WINE_EVAL]}).is_success
        decision = client.post("/gate", json={"model": "wine", "candidate": "api-v2"}).json()
        assert decision["verdict"] == verdict, decision
        if verdict == "block":
            refused = client.post(f"/gate/decisions/{decision['decision_id']}/repair",
                                  json={"method": "elodi"})
            assert error_code(refused, 422) == "external_version"


@pytest.mark.parametrize(("labels", "code"), [
    (np.array(["barolo", "merlot"] * 59), "unknown_class_name"),
    (np.array([0, 3] * 59), "labels_out_of_range"),
    (np.zeros(5, dtype=np.int64), "labels_shape"),
    (np.zeros((118, 3), dtype=np.int64), "labels_shape"),
])
def test_bad_labels_are_422_and_store_nothing(client, external_line, labels, code):
    assert client.post("/models", data={"name": "wine", "version": "v3"}).status_code == 201
    assert error_code(upload_labels(client, "v3", labels), 422) == code
    assert client.post("/compare/wine:prompt-v1/wine:v3",
                       params={"evalset": WINE_EVAL}).status_code == 409


def test_an_external_version_of_a_new_line_needs_its_class_count(client):
    assert error_code(client.post("/models", data={"name": "llm", "version": "1"}),
                      422) == "num_classes_required"
    made = client.post("/models", data={"name": "llm", "version": "1", "num_classes": "4"})
    assert made.status_code == 201 and made.json()["num_classes"] == 4
