"""Repairs of a multi-label line over HTTP (docs/server.md, "Multi-label lines"): the ensemble
and interpolation of a blocked candidate with its baseline, and a retraining with Focal
Distillation, each registered as a multi-label version with its thresholds and measured like
any; the methods that do not apply to per-label logits are refused when requested.

The line `tags` holds two mlps trained by flipgate on real digit composites (ten labels, the
digits an image shows) from two seeds, registered with thresholds given at registration (not
in their metadata); 1 → 2 is blocked on NFR_sample. The jobs run in this process on the real
database, artifact store and ONNX Runtime; the expected figures come from a plain numpy
forward pass of the models' weights and tests/multilabel_reference.py.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from sqlalchemy import select

from flipgate.datasets import EvalSet, digit_composites, save_evalset, small_digits, split
from flipgate.train.config import TrainConfig
from flipgate.train.recipes import train
from service.datasets.models import Dataset
from service.predictions.models import Prediction
from service.registry.models import ModelVersion
from tests.conftest import numpy_mlp
from tests.multilabel_reference import assert_matches, reference
from tests.service.api.conftest import error_code, measure, shared_store
from tests.service.api.test_repair_api import stored_rows
from worker import training

LINE, LABELS, ARCH = "tags", 10, "mlp:hidden=16"
THRESHOLDS = {"1": [0.3, 0.6, 0.5, 0.4, 0.7] * 2, "2": [0.45, 0.55] * 5}


@dataclass(frozen=True)
class Seeded:
    """The line's models, its training composites, the held-out ones the gate decides on,
    and the decision blocking 1 → 2."""

    models: dict[str, Path]
    training: EvalSet
    evalset: EvalSet
    decision_id: int


def upload(client, path: str, name: str, data: EvalSet, folder: Path) -> None:
    response = client.post(path, data={"name": name}, files={
        "data": ("data.npz", save_evalset(data, folder / f"{name}.npz").read_bytes())})
    assert response.status_code == 201, response.text


def single_label(data: EvalSet) -> EvalSet:
    """The same images labelled with one class each (the smallest digit they show)."""
    return EvalSet(data.x, np.argmax(data.y, axis=1))


def seed_line(client, folder: Path) -> Seeded:
    """Versions 1 and 2 of `tags` (the second from another seed on twice the composites),
    multi-label sets `ev` (gated), `cal` and `train` (the line's training set), single-label
    `digits_cal` and `digits_train`, a policy of NFR_sample ≤ 0.02 on `ev`, and the decision
    that blocks 1 → 2."""
    train_digits, held_out = split(small_digits(), 1000, seed=0)
    composites = digit_composites(600, seed=0, digits=train_digits)
    evalset, calibration = (digit_composites(200, seed=seed, digits=held_out)
                            for seed in (1, 2))
    models = {}
    for version, (seed, samples) in {"1": (0, 300), "2": (1, 600)}.items():
        part = EvalSet(composites.x[:samples], composites.y[:samples])
        trained = train("baseline", ARCH, part, LABELS, TrainConfig(epochs=2, seed=seed))
        models[version] = trained.save(folder / f"{version}.onnx", part.sample_shape)
        response = client.post("/models", data={
            "name": LINE, "version": version, "multilabel": "true",
            "thresholds": json.dumps(THRESHOLDS[version]),
            "metadata": json.dumps({"arch": ARCH})},
            files={"artifact": ("model.onnx", models[version].read_bytes())})
        assert response.status_code == 201, response.text
    for path, name, data in (("/evalsets", "ev", evalset), ("/evalsets", "cal", calibration),
                             ("/trainsets", "train", composites),
                             ("/evalsets", "digits_cal", single_label(calibration)),
                             ("/trainsets", "digits_train", single_label(composites))):
        upload(client, path, name, data, folder)
    assert client.put(f"/models/{LINE}/training-dataset", json={"dataset": "train"}).is_success
    client.put(f"/models/{LINE}/policy", json={"max_nfr": 0.02, "evalsets": ["ev"]})
    measure(client, f"{LINE}:1", f"{LINE}:2", "ev")
    decision = client.post("/gate", json={"model": LINE, "candidate": "2", "baseline": "1"})
    assert decision.json()["verdict"] == "block", decision.text
    return Seeded(models, composites, evalset, decision.json()["decision_id"])


client, settings = shared_store(line=seed_line)


@pytest.fixture
def line(client, module_store) -> Seeded:
    """The line seed_line seeded (on the shared client)."""
    return module_store.seeded


def weights(path: Path) -> dict[str, np.ndarray]:
    return {tensor.name: numpy_helper.to_array(tensor).astype(np.float64)
            for tensor in onnx.load(str(path)).graph.initializer}


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def expected_probabilities(method: str, share: float, line: Seeded) -> np.ndarray:
    """The repair at the old model's share, computed from the models' weights: the average of
    each label's probability, or the forward pass of the blended weights."""
    old, new = (weights(line.models[version]) for version in ("1", "2"))
    x = line.evalset.x
    if method == "ensemble":
        return share * sigmoid(numpy_mlp(old, x)) + (1 - share) * sigmoid(numpy_mlp(new, x))
    return sigmoid(numpy_mlp({name: share * old[name] + (1 - share) * new[name] for name in old},
                           x))


def stored_probabilities(client, db, version: str, evalset: str) -> np.ndarray:
    """The probabilities the inference job stored for LINE:version on `evalset`."""
    with db() as session:
        sha256 = session.scalar(select(Prediction.logits_sha256).join(ModelVersion).join(
            Dataset).where(ModelVersion.version == version, Dataset.name == evalset))
    return np.load(client.app.state.store.local_path(sha256))


def assert_measured(client, db, line: Seeded, version: str, probabilities: np.ndarray,
                    thresholds: list[float] | np.ndarray) -> dict:
    """Measure 1 → `version` on `ev`: both versions' stored probabilities are numpy's forward
    passes (`probabilities` for `version`), and the report is the reference's on them at
    their thresholds; the report."""
    report = measure(client, f"{LINE}:1", f"{LINE}:{version}", "ev")
    old, new = (stored_probabilities(client, db, name, "ev") for name in ("1", version))
    np.testing.assert_allclose(old, sigmoid(numpy_mlp(weights(line.models["1"]), line.evalset.x)),
                               atol=1e-5)
    np.testing.assert_allclose(new, probabilities, atol=1e-5)
    assert report["multilabel"] and len(report["per_label"]) == LABELS
    assert_matches(report, reference(line.evalset.y, old > THRESHOLDS["1"], new > thresholds,
                                     old, new))
    return report


def repaired(client, decision_id: int, body: dict) -> dict:
    """Request the repair, run its job in this process; the job, succeeded."""
    response = client.post(f"/gate/decisions/{decision_id}/repair", json=body)
    assert response.status_code == 202, response.text
    job_id = response.json()["job"]["id"]
    training.train(job_id)
    job = client.get(f"/jobs/{job_id}").json()
    assert job["state"] == "succeeded", job
    return job


@pytest.mark.parametrize(("method", "share", "options"), [
    ("ensemble", "weight", {"probabilities": True}), ("interpolate", "alpha", {})])
def test_a_repair_without_retraining_mixes_per_label_probabilities_and_thresholds(
        client, line, worker, db, method, share, options):
    repaired(client, line.decision_id,
             {"method": method, "calibration": "cal", "max_nfr": 0.05, "options": options})
    version = client.get(f"/models/{LINE}/versions/2-{method}").json()
    chosen = version["produced_by"][share]
    assert 0 < chosen < 1  # a mix of both, not one of the two models
    thresholds = chosen * np.array(THRESHOLDS["1"]) + (1 - chosen) * np.array(THRESHOLDS["2"])
    np.testing.assert_allclose(version["thresholds"], thresholds)
    report = assert_measured(client, db, line, f"2-{method}",
                             expected_probabilities(method, chosen, line), thresholds)
    assert report["new"]["thresholds"] == pytest.approx(thresholds)


def test_focal_distillation_retrains_a_multi_label_version_measured_like_any(
        client, line, worker, db, tmp_path):
    """FD on the line's multi-label training set: a version of ten per-label logits, deciding
    at the candidate's thresholds, gated again and measured as numpy measures its outputs."""
    job = repaired(client, line.decision_id, {"method": "fd", "config": {"epochs": 1}})
    version = client.get(f"/models/{LINE}/versions/2-fd").json()
    assert version["thresholds"] == THRESHOLDS["2"] and version["num_classes"] == LABELS
    record = version["produced_by"]["record"]
    assert (record["method"], record["multilabel"], record["targets_old_model"]) == (
        "fd", True, True)
    again = client.get(f"/gate/decisions/{job['result']['decision_id']}").json()
    assert (again["candidate"], again["repair_of"]) == ("2-fd", line.decision_id)
    with db() as session:  # what FD distilled: the baseline's logits of each label
        distilled = training.old_model_logits(
            worker, session.scalar(select(ModelVersion).where(ModelVersion.version == "1")),
            session.scalar(select(Dataset).where(Dataset.name == "train")))
    np.testing.assert_allclose(distilled, numpy_mlp(weights(line.models["1"]), line.training.x),
                               rtol=1e-4, atol=1e-4)
    artifact = tmp_path / "fd.onnx"
    artifact.write_bytes(client.get(f"/models/{LINE}/versions/2-fd/artifact").content)
    assert_measured(client, db, line, "2-fd", sigmoid(numpy_mlp(weights(artifact),
                                                              line.evalset.x)), THRESHOLDS["2"])


@pytest.mark.parametrize("body", [
    {"method": "kd"}, {"method": "fd", "options": {"beta": 3.0}}, {"method": "paragon"},
    {"method": "anti_distill"}, {"method": "elodi", "options": {"members": 2, "k": 2}},
    {"method": "ensemble", "calibration": "cal"}])
def test_the_methods_that_apply_to_per_label_logits_are_queued(client, line, body):
    response = client.post(f"/gate/decisions/{line.decision_id}/repair", json=body)
    assert response.status_code == 202, response.text
    assert response.json()["job"]["params"]["method"] == body["method"]


@pytest.mark.parametrize(("body", "code"), [
    ({"method": "entropy"}, "method_not_multilabel"),
    ({"method": "codistill"}, "method_not_multilabel"),
    ({"method": "elodi", "options": {"k": 1}}, "method_not_multilabel"),
    ({"method": "fd", "dataset": "digits_train"}, "training_set_mismatch"),
    ({"method": "ensemble", "calibration": "digits_cal"}, "calibration_mismatch"),
    ({"method": "interpolate", "calibration": "digits_cal"}, "calibration_mismatch"),
])
def test_what_does_not_apply_to_a_multi_label_line_is_refused_and_stores_nothing(
        client, line, db, body, code):
    before = stored_rows(db)
    response = client.post(f"/gate/decisions/{line.decision_id}/repair", json=body)
    assert error_code(response, 422) == code
    assert code != "method_not_multilabel" or body["method"] in response.json()["error"][
        "message"]
    assert stored_rows(db) == before
