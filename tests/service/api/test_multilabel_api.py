"""Multi-label lines on the server (docs/server.md, "Multi-label lines"): two versions of
each toolchain's standard export registered, measured by the inference and metrics jobs on
real digit composites, and the stored report, matrix and gate checked against a plain numpy
computation (tests/multilabel_reference.py) on the models' own outputs run here by ONNX
Runtime; what disagrees with the line is refused at upload."""

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.multioutput import MultiOutputClassifier

from flipgate.datasets import digit_composites, save_evalset, small_digits, split
from tests.conftest import save_graph
from tests.multilabel_reference import (
    assert_groups_match,
    assert_matches,
    group_reference,
    label_cost,
    reference,
)
from tests.service.api.conftest import error_code, measure, npy_bytes, put_model, run_task
from tests.toolchains import export, fit

LINE = "tags"
DECLARED = [0.4, 0.6] * 5  # thresholds a model's metadata declares


@dataclass(frozen=True)
class Composites:
    """Held-out digit composites (x flattened, as the models take them) saved as an eval
    set, and the training composites the models learn from."""

    evalset: Path
    x: np.ndarray
    y: np.ndarray
    train_x: np.ndarray
    train_y: np.ndarray


@pytest.fixture(scope="module")
def composites(tmp_path_factory) -> Composites:
    folder = tmp_path_factory.mktemp("multilabel_api")
    train_digits, eval_digits = split(small_digits(), 1000, seed=0)
    train, held_out = (digit_composites(n, seed=seed, digits=part) for n, seed, part in (
        (400, 1, train_digits), (200, 2, eval_digits)))
    flat = replace(held_out, x=held_out.x.reshape(held_out.n, -1))
    return Composites(save_evalset(flat, folder / "composites.npz"), flat.x, held_out.y,
                      train.x.reshape(train.n, -1), train.y.astype(np.int64))


@pytest.fixture(scope="module")
def sklearn_models(composites, tmp_path_factory) -> dict[str, Path]:
    """OneVsRestClassifier (its default ZipMap, and a tensor) and MultiOutputClassifier
    (a sequence of per-label tensors) exported by skl2onnx, each fitted twice."""
    from skl2onnx import to_onnx

    folder = tmp_path_factory.mktemp("sklearn_multilabel")
    x, y = composites.train_x, composites.train_y
    fitted = {
        "ovr_zipmap": (OneVsRestClassifier(LogisticRegression(max_iter=300)), 150, None),
        "ovr_tensor": (OneVsRestClassifier(LogisticRegression(C=0.1, max_iter=300)), 400,
                       {"zipmap": False}),
        "multioutput_small": (MultiOutputClassifier(LogisticRegression(max_iter=300)), 120,
                              {"zipmap": False}),
        "multioutput": (MultiOutputClassifier(LogisticRegression(max_iter=300)), 400,
                        {"zipmap": False}),
    }
    models = {}
    for name, (model, samples, options) in fitted.items():
        model.fit(x[:samples], y[:samples])
        models[name] = folder / f"{name}.onnx"
        models[name].write_bytes(to_onnx(model, x[:1], options=options).SerializeToString())
    return models


@pytest.fixture(scope="module")
def torch_models(composites, tmp_path_factory) -> dict[str, Path]:
    """Two PyTorch modules ending in Sigmoid, exported by torch.onnx.export."""
    folder = tmp_path_factory.mktemp("torch_multilabel")
    x = torch.tensor(composites.train_x)
    y = torch.tensor(composites.train_y, dtype=torch.float32)
    models = {}
    for name, (seed, steps) in {"small": (0, 15), "trained": (1, 80)}.items():
        torch.manual_seed(seed)
        module = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 10), torch.nn.Sigmoid())
        fit(module, x, y, torch.nn.functional.binary_cross_entropy, steps)
        models[name] = export(module, (x[:2],), folder / f"{name}.onnx", ["x"], ["scores"])
    return models


def own_probabilities(path: Path, x: np.ndarray) -> np.ndarray:
    """A model's probability of each label, run by ONNX Runtime: the last output, a ZipMap's
    maps, a sequence of per-label (N, 2) tensors (column 1: present) or an (N, L) tensor."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scores = session.run(None, {session.get_inputs()[0].name: x})[-1]
    if isinstance(scores, list) and isinstance(scores[0], dict):
        scores = [[row[key] for key in sorted(row)] for row in scores]
    elif isinstance(scores, list):
        scores = np.stack([tensor[:, 1] for tensor in scores], axis=1)
    return np.asarray(scores, dtype=np.float64)


def register(client, name: str, version: str, path: Path, **fields: str) -> dict:
    response = client.post("/models", data={"name": name, "version": version,
                                            "multilabel": "true", **fields},
                           files={"artifact": ("model.onnx", path.read_bytes())})
    assert response.status_code == 201, response.text
    return response.json()


def post_evalset(client, name: str, path: Path) -> dict:
    response = client.post("/evalsets", data={"name": name},
                           files={"data": ("data.npz", path.read_bytes())})
    assert response.status_code == 201, response.text
    return response.json()


def matrix(client, line: str, evalset: str) -> dict:
    """The line's matrix on `evalset`, its missing pairs counted by the matrix job first."""
    queued = client.post(f"/models/{line}/matrix", params={"evalset": evalset}).json()
    for job_id in {pair["job_id"] for pair in queued["missing"]}:
        run_task(client, job_id)
    return client.get(f"/models/{line}/matrix", params={"evalset": evalset}).json()


def measured_line(client, composites: Composites, old: Path, new: Path,
                  new_fields: dict[str, str] | None = None) -> dict:
    """Register `old` and `new` as LINE:1 and LINE:2 and the composites as `composites`;
    the stored report of 1 → 2."""
    register(client, LINE, "1", old)
    register(client, LINE, "2", new, **(new_fields or {}))
    dataset = post_evalset(client, "composites", composites.evalset)
    assert (dataset["multilabel"], dataset["num_classes"]) == (True, 10)
    return measure(client, f"{LINE}:1", f"{LINE}:2", "composites")


def assert_numpys_figures(client, report: dict, composites: Composites, old_p: np.ndarray,
                          new_p: np.ndarray, new_thresholds: float | list[float] = 0.5) -> None:
    """The report equals numpy's on the probabilities, and the line's matrix shows the
    per-sample NFR and churn of both directions."""
    expected = reference(composites.y, old_p > 0.5, new_p > np.asarray(new_thresholds),
                         old_p, new_p)
    assert report["multilabel"] and report["label_names"] == [str(d) for d in range(10)]
    assert_matches(report, expected)
    assert report["pooled"]["negative_flips"] > 0  # the check weighs some flips
    backwards = reference(composites.y, new_p > np.asarray(new_thresholds), old_p > 0.5)
    cells = matrix(client, LINE, "composites")
    assert cells["multilabel"] and cells["versions"] == ["1", "2"]
    assert cells["nfr"][0][1] == pytest.approx(expected["per_sample"]["nfr"])
    assert cells["churn"][0][1] == pytest.approx(expected["per_sample"]["churn"])
    assert cells["nfr"][1][0] == pytest.approx(backwards["per_sample"]["nfr"])


@pytest.mark.slow
@pytest.mark.parametrize(("old", "new"), [("ovr_zipmap", "ovr_tensor"),
                                          ("multioutput_small", "multioutput")])
def test_sklearn_exports_are_measured_as_numpy_measures_their_own_outputs(
        client, composites, sklearn_models, old, new):
    report = measured_line(client, composites, sklearn_models[old], sklearn_models[new])
    assert [report[side]["thresholds"] for side in ("old", "new")] == [[0.5] * 10] * 2
    assert [report[side]["scores"] for side in ("old", "new")] == ["probabilities"] * 2
    assert_numpys_figures(client, report, composites,
                          *(own_probabilities(sklearn_models[name], composites.x)
                            for name in (old, new)))


@pytest.mark.slow
def test_a_torch_sigmoid_module_with_thresholds_given_at_registration(
        client, composites, torch_models):
    thresholds = [0.3, 0.6] * 5
    report = measured_line(client, composites, torch_models["small"], torch_models["trained"],
                           {"thresholds": json.dumps(thresholds)})
    assert report["new"]["thresholds"] == thresholds
    assert client.get(f"/models/{LINE}").json()["line"]["multilabel"] is True
    assert_numpys_figures(client, report, composites,
                          *(own_probabilities(torch_models[name], composites.x)
                            for name in ("small", "trained")), new_thresholds=thresholds)


class Logits(torch.nn.Module):
    """A Hugging Face classifier called with pixel_values, returning its logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


@pytest.fixture(scope="module")
def vit_models(composites, tmp_path_factory) -> dict[str, Path]:
    """Two tiny Hugging Face ViTs with problem_type="multi_label_classification", built from
    a config with two seeds (nothing downloaded, nothing trained: weights drawn wide enough
    that each decides some labels either way) and exported by torch.onnx.export."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("vit_multilabel")
    pixels = torch.tensor(composites.x[:2]).reshape(-1, 1, 8, 24)
    models = {}
    for name, seed in {"first": 0, "second": 1}.items():
        torch.manual_seed(seed)
        config = transformers.ViTConfig(
            image_size=(8, 24), patch_size=4, num_channels=1, hidden_size=16,
            num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=10,
            problem_type="multi_label_classification", initializer_range=0.5)
        model = transformers.ViTForImageClassification(config)
        models[name] = folder / f"{name}.onnx"
        torch.onnx.export(Logits(model.eval()), (pixels,), str(models[name]),
                          input_names=["pixel_values"], output_names=["logits"],
                          dynamic_axes={"pixel_values": {0: "batch"}}, dynamo=False)
    declared = onnx.load(str(models["second"]))  # thresholds in the model's metadata
    helper.set_model_props(declared, {"thresholds": json.dumps(DECLARED)})
    onnx.save(declared, str(models["second"]))
    return models


@pytest.mark.slow
def test_a_hugging_face_multi_label_classifier(client, composites, vit_models, tmp_path):
    """Its logits read as logits (a sigmoid each), on an eval set of pixel_values; the
    thresholds its metadata declares are the version's."""
    pixels = composites.x.reshape(-1, 1, 8, 24)
    np.savez(images := tmp_path / "images.npz", pixel_values=pixels, y=composites.y)
    for version, name in (("1", "first"), ("2", "second")):
        register(client, LINE, version, vit_models[name])
    post_evalset(client, "images", images)
    report = measure(client, f"{LINE}:1", f"{LINE}:2", "images")
    assert [report[side]["scores"] for side in ("old", "new")] == ["logits"] * 2
    assert report["new"]["thresholds"] == DECLARED
    assert client.get(f"/models/{LINE}/versions/2").json()["thresholds"] == DECLARED
    old_p, new_p = (1 / (1 + np.exp(-own_probabilities(vit_models[name], pixels)))
                    for name in ("first", "second"))
    assert_matches(report, reference(composites.y, old_p > 0.5, new_p > np.array(DECLARED),
                                     old_p, new_p))
    assert report["pooled"]["negative_flips"] > 0


def external(client, version: str, **fields: str) -> None:
    response = client.post("/models", data={"name": LINE, "version": version,
                                            "multilabel": "true", "num_classes": "10",
                                            **fields})
    assert response.status_code == 201, response.text


def upload(client, version: str, evalset: str, field: str, array: np.ndarray, **form: str):
    return client.post(f"/models/{LINE}/versions/{version}/predictions",
                       data={"evalset": evalset, **form},
                       files={field: ("predictions.npy", npy_bytes(array))})


def test_uploaded_logits_and_label_matrices_are_measured(client, composites):
    """An external version's logits (N, L) and another's 0/1 decisions (N, L)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, composites.y.shape) + 3 * (composites.y - 0.5)
    decisions = np.where(rng.random(composites.y.shape) < 0.1, ~composites.y, composites.y)
    external(client, "1")
    external(client, "2")
    post_evalset(client, "composites", composites.evalset)
    assert upload(client, "1", "composites", "logits", logits).status_code == 201
    assert upload(client, "2", "composites", "labels", decisions.astype(np.int64)
                  ).status_code == 201
    report = measure(client, f"{LINE}:1", f"{LINE}:2", "composites")
    probabilities = 1 / (1 + np.exp(-logits))
    assert_matches(report, reference(composites.y, probabilities > 0.5, decisions))
    assert report["labels_only"] and report["new"]["thresholds"] is None


def test_groups_of_the_set_are_measured_and_gated_naming_the_group(client, composites,
                                                                   tmp_path):
    """Per group, the stored report equals numpy's on both versions' uploaded logits; a
    group limit blocks the one group that regresses (named), a group too small is not
    gated."""
    rng = np.random.default_rng(1)
    groups = rng.choice(np.array(["scanner-a", "scanner-b", "scanner-c"]), composites.y.shape[0])
    np.savez(grouped := tmp_path / "grouped.npz", x=composites.x, y=composites.y,
             groups=groups)
    old = rng.normal(0, 2, composites.y.shape) + 3 * (composites.y - 0.5)
    new = old + rng.normal(0, 0.5, old.shape)
    new[groups == "scanner-c", 3] *= -1  # every decision of label 3 turned over on c
    external(client, "1")
    external(client, "2")
    post_evalset(client, "grouped", grouped)
    for version, logits in (("1", old), ("2", new)):
        assert upload(client, version, "grouped", "logits", logits).status_code == 201
    report = measure(client, f"{LINE}:1", f"{LINE}:2", "grouped")
    assert_groups_match(report, group_reference(composites.y, old > 0, new > 0, groups))
    c, others = split_groups(report["per_group"], "scanner-c")
    assert c["worst_labels"][0]["name"] == "3"
    for key, code, what in (("nfr", "max_group_nfr", "NFR_sample"),
                            ("er_increase", "max_group_er_increase", "Hamming-loss increase")):
        bound = between(c, others, key)  # only c exceeds it
        assert client.put(f"/models/{LINE}/policy", json={
            code: bound, "evalsets": ["grouped"]}).status_code == 200
        decision = gate(client)
        (reason,) = decision["reasons"]
        assert (decision["verdict"], reason["code"], reason["group"]) == ("block", code,
                                                                           "scanner-c")
        assert reason["measured"] == pytest.approx(increase(c) if key == "er_increase"
                                                   else c["nfr"])
        assert f"group 'scanner-c' (n = {c['n']}): " in reason["message"]
        assert what in reason["message"]
    client.put(f"/models/{LINE}/policy", json={"max_group_er_increase": bound,
                                               "min_group_size": c["n"] + 1,
                                               "evalsets": ["grouped"]})
    decision = gate(client)
    assert decision["verdict"] == "approve"  # c is reported, too small to gate
    assert not {entry["group"]: entry["gated"]
                for entry in decision["metrics"]["grouped"]["groups"]}["scanner-c"]


def increase(group: dict) -> float:
    return group["er_new"] - group["er_old"]


def split_groups(rows: list[dict], name: str) -> tuple[dict, list[dict]]:
    """The row of group `name` and the others."""
    return (next(row for row in rows if row["group"] == name),
            [row for row in rows if row["group"] != name])


def between(group: dict, others: list[dict], key: str) -> float:
    """A bound that `group`'s figure exceeds and every other group's does not."""
    value = increase if key == "er_increase" else (lambda row: row[key])
    highest = max(value(row) for row in others)
    assert value(group) > highest
    return (value(group) + highest) / 2


@pytest.fixture
def labelled_pair(client, composites) -> dict:
    """Two external versions of a multi-label line measured on the composites: the new one
    loses label 3 wherever the old one had it right, the rest alike."""
    old = composites.y.copy()
    new = composites.y.copy()
    new[:, 3] = False
    external(client, "1")
    external(client, "2")
    post_evalset(client, "composites", composites.evalset)
    for version, decisions in (("1", old), ("2", new)):
        assert upload(client, version, "composites", "labels", decisions).status_code == 201
    return measure(client, f"{LINE}:1", f"{LINE}:2", "composites")


def gate(client) -> dict:
    response = client.post("/gate", json={"model": LINE, "candidate": "2", "baseline": "1"})
    assert response.status_code in (200, 201), response.text
    return response.json()


def test_the_gate_blocks_on_a_labels_limit_and_names_the_label(client, labelled_pair,
                                                               composites):
    lost = int(composites.y[:, 3].sum())
    assert labelled_pair["per_label"][3]["lost_positives"] == lost > 0
    policy = {"max_label_nfr": {"3": 0.5, "4": 0.0}, "max_lost_positives": 0.9,
              "evalsets": ["composites"]}
    assert client.put(f"/models/{LINE}/policy", json=policy).status_code == 200
    assert gate(client)["verdict"] == "approve"  # label 3 under its limit, 4 never flips
    policy["max_lost_positives"] = {"3": lost / composites.y.shape[0] / 2}
    client.put(f"/models/{LINE}/policy", json=policy)
    decision = gate(client)
    assert decision["verdict"] == "block"
    (reason,) = decision["reasons"]
    assert (reason["code"], reason["label"]) == ("max_lost_positives", "3")
    assert "label '3'" in reason["message"]
    client.put(f"/models/{LINE}/policy", json={"max_nfr": 0.01, "evalsets": ["composites"]})
    blocked = gate(client)  # max_nfr limits NFR_sample: every sample that had label 3
    assert [reason["code"] for reason in blocked["reasons"]] == ["max_nfr"]
    assert blocked["reasons"][0]["measured"] == pytest.approx(lost / composites.y.shape[0])
    unstable = client.get(f"/models/{LINE}/unstable-samples", params={"evalset": "composites"})
    assert error_code(unstable, 422) == "unstable_samples_not_multilabel"


def test_the_default_policy_blocks_a_label_that_flips_significantly(client, labelled_pair):
    client.put(f"/models/{LINE}/policy", json={"significance": 0.05,
                                               "evalsets": ["composites"]})
    decision = gate(client)
    assert decision["verdict"] == "block"
    assert {(reason["code"], reason["label"]) for reason in decision["reasons"]} == {
        ("significance", "3")}


def test_limits_that_do_not_apply_to_the_lines_kind_are_refused(client, labelled_pair,
                                                                upload_model):
    for rules in ({"max_class_nfr": 0.1}, {"max_nfr": 0.1, "max_nfr_mc": 0.1},
                  {"max_er_increase": 0.1}):
        response = client.put(f"/models/{LINE}/policy", json=rules)
        assert error_code(response, 422) == "policy_limit_not_applicable"
        dry = client.post(f"/models/{LINE}/policy/dry-run", json=rules)
        assert error_code(dry, 422) == "policy_limit_not_applicable"
    assert upload_model("single", "1").status_code == 201
    for rules in ({"max_label_nfr": 0.1}, {"max_lost_positives": {"3": 0.1}},
                  {"negative_flip_cost": {"3": 2.0}}, {"positive_flip_gain": {"0": 0.5}}):
        response = client.put("/models/single/policy", json=rules)
        assert error_code(response, 422) == "policy_limit_not_applicable"
    assert "positive_flip_gain (a map of labels)" in response.json()["error"]["message"]
    assert client.put("/models/single/policy", json={"negative_flip_cost": 2.0}
                      ).status_code == 200  # one weight still applies to a single-label line
    assert client.get(f"/models/{LINE}/policy").json()["version"] is None  # nothing stored
    stored = client.get("/models/single/policy").json()
    assert (stored["version"], stored["rules"]["negative_flip_cost"]) == (1, 2.0)


def test_a_label_limit_naming_no_label_is_refused_or_blocks(client, labelled_pair):
    """A typo in a label's name never leaves the label unlimited: refused where the line
    names its labels, a blocking reason where only the eval set does."""
    policy = {"max_label_nfr": {"three": 0.5}, "evalsets": ["composites"]}
    client.put(f"/models/{LINE}/policy", json=policy)
    decision = gate(client)
    assert decision["verdict"] == "block"
    assert [(reason["code"], reason["label"]) for reason in decision["reasons"]] == [
        ("unknown_label", "three")]
    client.put(f"/models/{LINE}/classes", json={"class_names": [str(d) for d in range(10)]})
    refused = client.put(f"/models/{LINE}/policy", json=policy)
    assert error_code(refused, 422) == "unknown_label"


@pytest.fixture
def costly_pair(client, composites) -> tuple[np.ndarray, np.ndarray]:
    """Two external versions measured on the composites: the new one gets labels 3 and 7
    wrong together on some samples, and label 5 right everywhere (the old one gets it wrong
    on about half); their decisions."""
    rng = np.random.default_rng(7)
    y = composites.y
    old = np.where(rng.random(y.shape) < 0.1, ~y, y)
    old[:, 5] = np.where(rng.random(len(y)) < 0.5, ~y[:, 5], y[:, 5])
    new = old.copy()
    hit = rng.random(len(y)) < 0.12
    new[hit, 3], new[hit, 7] = ~y[hit, 3], ~y[hit, 7]
    new[:, 5] = y[:, 5]
    external(client, "1")
    external(client, "2")
    post_evalset(client, "composites", composites.evalset)
    for version, decisions in (("1", old), ("2", new)):
        assert upload(client, version, "composites", "labels", decisions).status_code == 201
    measure(client, f"{LINE}:1", f"{LINE}:2", "composites")
    return old, new


def costs_of(weights: dict[str, float]) -> list[float]:
    """Each of the 10 labels' weight: its entry of the map, else 1."""
    return [weights.get(str(label), 1.0) for label in range(10)]


def test_a_per_label_cost_policy_blocks_naming_the_costliest_label(client, composites,
                                                                    costly_pair):
    weights = {"3": 4.0, "7": 0.5}
    expected = label_cost(composites.y, *costly_pair, costs_of(weights), [0.1] * 10)
    cost = expected["expected_cost"]
    assert cost > 0 and np.argmax(expected["per_label"]) == 3
    policy = {"negative_flip_cost": weights, "positive_flip_gain": 0.1,
              "max_expected_cost": cost * 1.01, "evalsets": ["composites"]}
    assert client.put(f"/models/{LINE}/policy", json=policy).status_code == 200
    approved = gate(client)
    assert approved["verdict"] == "approve"
    client.put(f"/models/{LINE}/policy", json={**policy, "max_expected_cost": cost * 0.99})
    decision = gate(client)
    assert decision["verdict"] == "block"
    (reason,) = decision["reasons"]
    assert (reason["code"], reason["label"]) == ("max_expected_cost", "3")
    assert reason["measured"] == pytest.approx(cost)
    assert f"most from labels '3' ({expected['per_label'][3]:.3g})" in reason["message"]
    numbers = decision["metrics"]["composites"]
    assert numbers["expected_cost"] == pytest.approx(cost)
    assert numbers["expected_cost_ci"] == pytest.approx(expected["expected_cost_ci"])
    assert numbers["cost_p"] == pytest.approx(expected["cost_p"])
    assert [entry["expected_cost"] for entry in numbers["labels"]] == pytest.approx(
        list(expected["per_label"]))
    draft = client.post(f"/models/{LINE}/policy/dry-run", json=policy).json()
    assert [(change["old_verdict"], change["new_verdict"], change["reasons"])
            for change in draft["changed"]] == [("block", "approve", [])]


def test_the_cost_test_weighs_per_label_costs(client, composites, costly_pair):
    """Label 5's fixes outweigh labels 3 and 7's breaks at equal weights; breaking label 3
    costly enough makes the update raise the cost significantly."""
    lenient = {"significance": 0.05, "significance_test": "cost", "evalsets": ["composites"]}
    client.put(f"/models/{LINE}/policy", json=lenient)
    approved = gate(client)
    assert approved["verdict"] == "approve"
    expected = label_cost(composites.y, *costly_pair, [1.0] * 10, [1.0] * 10)
    assert approved["metrics"]["composites"]["cost_p"] == pytest.approx(expected["cost_p"])
    assert expected["expected_cost"] < 0
    client.put(f"/models/{LINE}/policy", json={**lenient, "negative_flip_cost": {"3": 20.0}})
    decision = gate(client)
    expected = label_cost(composites.y, *costly_pair, costs_of({"3": 20.0}), [1.0] * 10)
    assert expected["cost_p"] < 0.05 and decision["verdict"] == "block"
    (reason,) = decision["reasons"]
    assert (reason["code"], reason["label"]) == ("significance", "3")
    assert reason["measured"] == pytest.approx(expected["cost_p"])
    assert "raises the expected cost" in reason["message"]


def test_bad_label_weights_are_refused_and_nothing_is_stored(client):
    external(client, "1")
    client.put(f"/models/{LINE}/classes", json={"class_names": [str(d) for d in range(10)]})
    assert client.put(f"/models/{LINE}/policy", json={"max_nfr": 0.5}).status_code == 200
    for weights, code in (({"negative_flip_cost": {"three": 2.0}}, "unknown_label"),
                          ({"positive_flip_gain": {"3": -1.0}}, "invalid_request"),
                          ({"negative_flip_cost": {"3": float("nan")}}, "invalid_request"),
                          ({"negative_flip_cost": {"3": 0.0}}, "invalid_request"),
                          ({"negative_flip_cost": {}}, "invalid_request")):
        body = json.dumps({"max_expected_cost": 0.1, **weights})  # NaN, which httpx refuses
        for send, path in ((client.put, f"/models/{LINE}/policy"),
                           (client.post, f"/models/{LINE}/policy/dry-run")):
            response = send(path, content=body, headers={"content-type": "application/json"})
            assert error_code(response, 422) == code, weights
    stored = client.get(f"/models/{LINE}/policy").json()
    assert (stored["version"], stored["rules"]["max_expected_cost"]) == (1, None)


def softmax_model(path: Path) -> Path:
    """A linear model of the composites ending in a Softmax over its 10 outputs."""
    weight = np.random.default_rng(0).normal(0, 0.05, (192, 10)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["z"]),
         helper.make_node("Softmax", ["z"], ["scores"], axis=1)], "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 192])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(weight, "w")])
    return save_graph(graph, path)


def test_what_disagrees_with_the_line_is_refused_at_upload(client, composites, tmp_path,
                                                           upload_model):
    external(client, "1")
    post_evalset(client, "composites", composites.evalset)
    np.savez(five := tmp_path / "five.npz", x=composites.x, y=composites.y[:, :5])
    post_evalset(client, "five", five)
    np.savez(named := tmp_path / "named.npz", x=composites.x, y=composites.y,
             classes=np.array(list("abcdefghij")))
    post_evalset(client, "named", named)
    client.put(f"/models/{LINE}/classes", json={"class_names": [str(d) for d in range(10)]})
    scores = np.zeros((composites.y.shape[0], 5))
    assert error_code(upload(client, "1", "five", "logits", scores), 422) == \
        "label_count_mismatch"
    assert error_code(upload(client, "1", "named", "labels", composites.y), 422) == \
        "class_names_mismatch"
    assert error_code(upload(client, "1", "composites", "logits", scores), 422) == \
        "label_count_mismatch"  # (N, 5) scores for 10 labels
    refused = client.post("/models", data={"name": LINE, "version": "2", "multilabel": "true",
                                           "num_classes": "5"})
    assert error_code(refused, 422) == "label_count_mismatch"
    assert error_code(client.post("/models", data={
        "name": LINE, "version": "2", "multilabel": "false", "num_classes": "10"}), 422) == \
        "line_kind_mismatch"
    assert error_code(client.post("/models", data={
        "name": LINE, "version": "2", "thresholds": "[0.5]"}), 422) == "invalid_thresholds"
    softmax = client.post("/models", data={"name": LINE, "version": "2"}, files={
        "artifact": ("m.onnx", softmax_model(tmp_path / "softmax.onnx").read_bytes())})
    assert error_code(softmax, 422) == "multilabel_softmax"
    raw = put_model(client, "other", "1", (tmp_path / "softmax.onnx").read_bytes(),
                    multilabel="true")  # the raw PUT's query makes a new line multi-label
    assert error_code(raw, 422) == "multilabel_softmax"
    for version in ("1", "2"):
        assert upload_model("single", version, num_classes=10).status_code == 201
    assert error_code(client.post("/compare/single:1/single:2", params={
        "evalset": "composites"}), 422) == "evalset_kind_mismatch"
    versions = client.get(f"/models/{LINE}").json()["versions"]
    assert [version["version"] for version in versions] == ["1"]  # nothing else stored
