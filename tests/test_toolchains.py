"""`flipgate compare` on classifiers exported the standard way of each toolchain (built in
tests/toolchains.py on data that ships with a package), checked against numpy over the
toolchain's own predictions."""

import html
import json

import numpy as np
import pytest

from tests import toolchains
from tests.toolchains import Built, ece, expected_counts, mean_gap


def compare(run_cli, built: Built, *flags: str) -> dict:
    result = run_cli("compare", built.old, built.new, "--evalset", built.evalset, "--json",
                     *flags)
    assert result.code == 0, result.err
    return json.loads(result.out)


def checked(run_cli, built: Built) -> dict:
    """The report of `flipgate compare --json`, its counts, rates and probability metrics
    checked against the toolchains' own predictions."""
    report = compare(run_cli, built)
    assert_counts(report, built)
    assert_probabilities(report, built)
    return report


def assert_counts(report: dict, built: Built) -> None:
    expected = expected_counts(built)
    assert {key: report[key] for key in expected} == pytest.approx(expected)


def assert_probabilities(report: dict, built: Built) -> None:
    """ECE and the confidence gap are those of the models' own probabilities."""
    confidence = report["confidence"]
    for side, probs in (("old", built.old_probs), ("new", built.new_probs)):
        assert confidence[f"{side}_ece"] == pytest.approx(ece(probs, built.labels), abs=1e-4)
        assert confidence[f"{side}_mean_gap"] == pytest.approx(mean_gap(probs), abs=1e-4)


def read_as(report: dict) -> list[tuple[str, str]]:
    return [(report[side]["output"], report[side]["scores"]) for side in ("old", "new")]


@pytest.fixture(scope="module")
def sklearn_built(toolchain_folder):
    return toolchains.sklearn_models(toolchain_folder)


def test_scikit_learn_zipmap_and_tensor_probabilities(run_cli, sklearn_built):
    report = checked(run_cli, sklearn_built)
    assert read_as(report) == [("output_probability", "probabilities"),
                               ("probabilities", "probabilities")]
    assert report["old"]["inputs"] == ["X float32 (N, 13)"]


def test_scores_read_as_logits_when_told(run_cli, sklearn_built):
    report = compare(run_cli, sklearn_built, "--new-scores", "logits")
    assert read_as(report)[1] == ("probabilities", "logits")
    probs = np.exp(sklearn_built.new_probs)  # a softmax of probabilities taken as logits
    probs /= probs.sum(1, keepdims=True)
    assert report["confidence"]["new_ece"] == pytest.approx(ece(probs, sklearn_built.labels),
                                                            abs=1e-4)


def test_string_labels_are_mapped_by_the_models_class_labels(run_cli, toolchain_folder):
    built = toolchains.string_label_models(toolchain_folder)
    report = checked(run_cli, built)
    assert report["class_names"] == built.classes == ["benign", "malignant"]
    targets = run_cli("compare", built.old, built.new, "--evalset",
                      toolchain_folder / "cancer_targets.npz")
    assert targets.code == 2 and "cannot be told apart from column indices" in targets.err


def test_a_dataframe_pipeline_takes_one_array_per_column(run_cli, toolchain_folder):
    built = toolchains.dataframe_models(toolchain_folder)
    report = checked(run_cli, built)
    assert report["old"]["inputs"][-1] == "hue_level string (N, 1)"
    assert len(report["new"]["inputs"]) == 6


def test_lightgbm_and_xgboost_via_onnxmltools(run_cli, toolchain_folder):
    built = toolchains.boosted_models(toolchain_folder)
    report = checked(run_cli, built)
    assert read_as(report) == [("probabilities", "probabilities")] * 2


@pytest.mark.slow
def test_pytorch_two_outputs_and_a_final_softmax(run_cli, toolchain_folder):
    built = toolchains.torch_models(toolchain_folder)
    report = checked(run_cli, built)
    assert read_as(report) == [("logits", "logits"), ("probs", "probabilities")]
    chosen = run_cli("compare", built.old, built.new, "--evalset", built.evalset,
                     "--old-output", "embedding")
    assert chosen.code == 2 and "two_outputs.onnx has 32 classes but" in chosen.err


@pytest.mark.slow
def test_a_sigmoid_column_and_a_float16_logit_are_binary_classifiers(run_cli, toolchain_folder):
    built = toolchains.binary_models(toolchain_folder)
    report = checked(run_cli, built)
    assert read_as(report) == [("p", "probabilities"), ("z", "logits")]
    assert report["new"]["inputs"] == ["x float16 (N, 30)"]


@pytest.mark.slow
def test_hugging_face_classifiers_with_different_inputs(run_cli, toolchain_folder, tmp_path):
    built = toolchains.transformers_models(toolchain_folder)
    report = checked(run_cli, built)
    assert [len(report[side]["inputs"]) for side in ("old", "new")] == [2, 3]
    assert report["class_names"] == built.classes
    page = tmp_path / "report.html"
    assert run_cli("compare", built.old, built.new, "--evalset", built.evalset,
                   "--html", page).code == 0
    flipped = report["flipped_indices"]["negative"]
    texts = np.load(built.evalset)["text"]
    assert flipped and all(html.escape(str(texts[i]))[:40] in page.read_text() for i in flipped)
    assert "<img" not in page.read_text()


def test_repairs_refuse_models_they_cannot_rewrite(run_cli, sklearn_built, tmp_path):
    result = run_cli("repair", "ensemble", sklearn_built.old, sklearn_built.new, "--weight",
                     "0.5", "--out", tmp_path / "fixed.onnx")
    assert result.code == 2 and "a repair rewrites models of one float32 input" in result.err
    assert not (tmp_path / "fixed.onnx").exists()
