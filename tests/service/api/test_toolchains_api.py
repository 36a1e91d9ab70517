"""Classifiers exported the standard way of each toolchain (tests/toolchains.py), registered
with POST /models, scored by the inference job and compared by the metrics job: the stored
report matches numpy over the toolchain's own predictions."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from flipgate.formats.onnx_models import inspect_onnx
from tests import toolchains
from tests.conftest import save_graph
from tests.service.api.conftest import error_code, measure, npy_bytes, run_task
from tests.toolchains import Built, ece, expected_counts, mean_gap


@pytest.fixture(scope="module")
def string_labels(toolchain_folder):
    return toolchains.string_label_models(toolchain_folder)


@pytest.fixture(scope="module")
def frame(toolchain_folder):
    return toolchains.dataframe_models(toolchain_folder)


def register(client, built: Built, line: str, evalset: Path, **fields: dict[str, str]) -> None:
    """POST both models as `line:1` and `line:2` and the eval set as `eval`."""
    for version, path in (("1", built.old), ("2", built.new)):
        response = client.post("/models", data={"name": line, "version": version,
                                                 **fields.get(version, {})},
                               files={"artifact": ("model.onnx", path.read_bytes())})
        assert response.status_code == 201, response.text
    response = client.post("/evalsets", data={"name": "eval"},
                           files={"data": ("eval.npz", evalset.read_bytes())})
    assert response.status_code == 201, response.text


def assert_matches(report: dict, built: Built) -> None:
    expected = expected_counts(built)
    assert {key: report[key] for key in expected} == pytest.approx(expected)
    for side, probs in (("old", built.old_probs), ("new", built.new_probs)):
        assert report["confidence"][f"{side}_ece"] == pytest.approx(
            ece(probs, built.labels), abs=1e-4)


def test_string_labels_and_the_lines_class_names(client, string_labels, tmp_path):
    built = string_labels
    with np.load(built.evalset) as data:
        np.savez(evalset := tmp_path / "named.npz", x=data["x"], y=data["y"],
                 classes=np.array(built.classes))
    register(client, built, "cancer", evalset)
    assert client.get("/models/cancer").json()["line"]["class_names"] == built.classes
    assert_matches(measure(client, "cancer:1", "cancer:2", "eval"), built)


def test_names_without_classes_are_mapped_by_the_lines_class_names_as_the_cli_does(
        client, string_labels):
    """The scikit-learn user's two files, taken by the server as `flipgate compare` takes
    them: names mapped by the models' own class labels, the same numbers."""
    built = string_labels
    register(client, built, "cancer", built.evalset)
    assert client.get("/evalsets").json()[0]["num_classes"] == 2  # the distinct names
    report = measure(client, "cancer:1", "cancer:2", "eval")
    assert_matches(report, built)
    cli = subprocess.run([sys.executable, "-m", "flipgate.cli", "compare", str(built.old),
                          str(built.new), "--evalset", str(built.evalset), "--json"],
                         capture_output=True, text=True, check=True)
    compared = json.loads(cli.stdout)
    numbers = ("n", "nfr", "churn", "er_old", "er_new", "negative_flips", "positive_flips")
    assert {key: report[key] for key in numbers} == {key: compared[key] for key in numbers}
    matrix = client.post("/models/cancer/matrix", params={"evalset": "eval"}).json()
    run_task(client, matrix["missing"][0]["job_id"])  # the matrix maps the names the same way
    assert client.get(f"/jobs/{matrix['missing'][0]['job_id']}").json()["state"] == "succeeded"


def test_a_name_no_column_has_fails_the_measurement_naming_it(client, string_labels, tmp_path):
    built = string_labels
    with np.load(built.evalset) as data:
        names = data["y"].astype("U12")
        names[7] = "borderline"
        np.savez(evalset := tmp_path / "odd.npz", x=data["x"], y=names)
    register(client, built, "cancer", evalset)
    queued = client.post("/compare/cancer:1/cancer:2", params={"evalset": "eval"}).json()
    for job_id in queued["job_ids"]:
        run_task(client, job_id)
    errors = [client.get(f"/jobs/{job_id}").json()["error"] for job_id in queued["job_ids"]]
    assert errors[0].startswith("unknown_class_name: ") and "'borderline'" in errors[0], errors


def test_a_training_set_of_names_without_classes_is_refused(client, string_labels):
    response = client.post("/trainsets", data={"name": "train"},
                           files={"data": ("train.npz", string_labels.evalset.read_bytes())})
    assert error_code(response, 422) == "labels_need_classes"
    assert client.get("/trainsets").json() == []


def test_a_dataframe_pipeline_with_string_inputs(client, frame):
    register(client, frame, "wine", frame.evalset)
    versions = client.get("/models/wine").json()["versions"]
    assert [(v["scores_output"], v["scores_kind"]) for v in versions] == [
        ("output_probability", "probabilities")] * 2
    report = measure(client, "wine:1", "wine:2", "eval")
    assert_matches(report, frame)
    columns = ["alcohol", "malic_acid", "ash", "alcalinity_of_ash", "magnesium"]
    assert report["new"] == {"source": "wine:2", "provider": "CPUExecutionProvider",
                             "inputs": [f"{name} float32 (N, 1)" for name in columns]
                             + ["hue_level string (N, 1)"],
                             "output": "output_probability", "scores": "probabilities"}


def test_output_and_scores_fields_are_stored_and_used(client, frame):
    fields = {"1": {"scores": "logits"}, "2": {"output": "output_label"}}
    response = client.post("/models", data={"name": "wine", "version": "2", **fields["2"]},
                           files={"artifact": ("model.onnx", frame.new.read_bytes())})
    assert error_code(response, 422) == "onnx_output_unknown"
    register(client, frame, "wine", frame.evalset, **{"1": fields["1"]})
    assert client.get("/models/wine/versions/1").json()["scores_kind"] == "logits"
    report = measure(client, "wine:1", "wine:2", "eval")
    as_logits = np.exp(frame.old_probs) / np.exp(frame.old_probs).sum(1, keepdims=True)
    assert report["confidence"]["old_ece"] == pytest.approx(ece(as_logits, frame.labels),
                                                            abs=1e-4)


def test_class_names_are_set_for_a_line_and_checked(client, frame):
    register(client, frame, "wine", frame.evalset)
    named = client.put("/models/wine/classes", json={"class_names": ["a", "b", "c"]})
    assert named.status_code == 200 and named.json()["class_names"] == ["a", "b", "c"]
    too_few = client.put("/models/wine/classes", json={"class_names": ["a", "b"]})
    assert error_code(too_few, 422) == "invalid_classes"
    assert client.get("/models/wine").json()["line"]["class_names"] == ["a", "b", "c"]


def test_versions_must_agree_on_class_names(client, string_labels):
    register(client, string_labels, "cancer", string_labels.evalset.with_name(
        "cancer_targets.npz"))
    client.put("/models/cancer/classes", json={"class_names": ["healthy", "ill"]})
    response = client.post("/models", data={"name": "cancer", "version": "3"},
                           files={"artifact": ("model.onnx", string_labels.new.read_bytes())})
    assert error_code(response, 422) == "class_names_mismatch"


def test_uploaded_probabilities_are_the_models_own(client, frame):
    register(client, frame, "wine", frame.evalset)
    uploaded = client.post("/models/wine/versions/1/predictions",
                           data={"evalset": "eval", "scores": "probabilities"},
                           files={"logits": ("p.npy", npy_bytes(frame.old_probs))})
    assert uploaded.status_code == 201, uploaded.text
    report = measure(client, "wine:1", "wine:2", "eval")
    assert_matches(report, frame)
    assert report["old"]["provider"] == "uploaded"
    beyond = client.post("/models/wine/versions/2/predictions",
                         data={"evalset": "eval", "scores": "probabilities"},
                         files={"logits": ("p.npy", npy_bytes(frame.new_probs * 3))})
    assert error_code(beyond, 422) == "scores_not_probabilities"


TOOLCHAINS = {  # builder: the form fields of each version, and the (output, scores) read
    "sklearn_models": ({}, [("output_probability", "probabilities"),
                            ("probabilities", "probabilities")]),
    "boosted_models": ({}, [("probabilities", "probabilities")] * 2),
    "torch_models": ({"1": {"output": "logits"}}, [("logits", "logits"),
                                                   ("probs", "probabilities")]),
    "binary_models": ({}, [("p", "probabilities"), ("z", "logits")]),
    "transformers_models": ({}, [("logits", "logits")] * 2),
}
SLOW = {"torch_models", "binary_models", "transformers_models"}


@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [], id=name)
    for name in TOOLCHAINS])
def toolchain(request, toolchain_folder) -> tuple[str, Built]:
    return request.param, getattr(toolchains, request.param)(toolchain_folder)


def test_each_toolchains_export_is_measured_from_its_own_scores(client, toolchain):
    name, built = toolchain
    fields, read = TOOLCHAINS[name]
    register(client, built, "line", built.evalset, **fields)
    report = measure(client, "line:1", "line:2", "eval")
    assert_matches(report, built)
    for side, probs in (("old", built.old_probs), ("new", built.new_probs)):
        assert report["confidence"][f"{side}_mean_gap"] == pytest.approx(mean_gap(probs),
                                                                         abs=1e-4)
    assert [(report[side]["output"], report[side]["scores"]) for side in ("old", "new")] == read
    fed = [[spec.describe() for spec in inspect_onnx(path).inputs]
           for path in (built.old, built.new)]
    assert [report[side]["inputs"] for side in ("old", "new")] == fed


def float_columns_onnx(path: Path, widths: dict[str, int]) -> bytes:
    """A linear 3-class ONNX model over float inputs named and sized by `widths`."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", width])
              for name, width in widths.items()]
    weight = numpy_helper.from_array(np.ones((sum(widths.values()), 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Concat", list(widths), ["joined"], axis=1),
                               helper.make_node("MatMul", ["joined", "w"], ["logits"])],
                              "columns", inputs,
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                             ["N", 3])], [weight])
    return save_graph(graph, path).read_bytes()


@pytest.mark.parametrize(("widths", "differs"), [
    ({"alcohol": 1, "hue_level": 1}, "'hue_level' is hue_level string (N, 1) in an earlier "
                                     "version, hue_level float32 (N, 1) in this model"),
    ({"alcohol": 2}, "'alcohol' is alcohol float32 (N, 1) in an earlier version, "
                     "alcohol float32 (N, 2) in this model"),
])
def test_every_input_a_version_shares_with_its_line_must_agree(client, frame, tmp_path, widths,
                                                               differs):
    register(client, frame, "wine", frame.evalset)
    before = client.get("/models/wine").json()["versions"]
    response = client.post("/models", data={"name": "wine", "version": "3"},
                           files={"artifact": ("m.onnx", float_columns_onnx(tmp_path / "m.onnx",
                                                                            widths))})
    assert error_code(response, 422) == "input_signature_mismatch"
    assert differs in response.json()["error"]["message"]
    assert client.get("/models/wine").json()["versions"] == before


def test_a_version_may_add_inputs_its_line_has_not_seen(client, frame, tmp_path):
    register(client, frame, "wine", frame.evalset)
    added = float_columns_onnx(tmp_path / "m.onnx", {"alcohol": 1, "color_intensity": 1})
    response = client.post("/models", data={"name": "wine", "version": "3"},
                           files={"artifact": ("m.onnx", added)})
    assert response.status_code == 201, response.text
    assert response.json()["inputs"] == [
        {"name": "alcohol", "dtype": "float32", "shape": [None, 1]},
        {"name": "color_intensity", "dtype": "float32", "shape": [None, 1]}]
