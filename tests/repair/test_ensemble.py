"""Ensemble fallback on ONNX files: the mixed outputs, refusals, the weight search, the command."""

import json

import numpy as np
import onnx
import pytest

from flipgate.cli import main
from flipgate.errors import InputError
from flipgate.inference import OnnxClassifier
from flipgate.metrics import softmax
from flipgate.repair import Limits, ensemble, ensemble_graph


def logits(path, x) -> np.ndarray:
    return OnnxClassifier(path, device="cpu").predict(x)


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_ensemble_outputs_the_weighted_sum_of_both_models_logits(models, digits, tmp_path,
                                                                 weight):
    x = digits[1].x
    path = tmp_path / "mixed.onnx"
    onnx.save(ensemble_graph(models["old"], models["cnn"], weight), str(path))
    expected = (np.float32(weight) * logits(models["old"], x)
                + np.float32(1 - weight) * logits(models["cnn"], x))
    np.testing.assert_allclose(logits(path, x), expected, rtol=1e-5, atol=1e-6)


def test_probability_ensemble_averages_probabilities(models, digits, tmp_path):
    x = digits[1].x
    path = tmp_path / "mixed.onnx"
    onnx.save(ensemble_graph(models["old"], models["new"], 0.25, probabilities=True), str(path))
    expected = 0.25 * softmax(logits(models["old"], x)) + 0.75 * softmax(logits(models["new"], x))
    np.testing.assert_allclose(softmax(logits(path, x)), expected, rtol=1e-4, atol=1e-6)


def test_the_same_model_twice_does_not_clash(models, digits, tmp_path):
    path = ensemble(models["old"], models["old"], tmp_path / "twice.onnx", weight=0.5).out
    x = digits[1].x
    np.testing.assert_allclose(logits(path, x), logits(models["old"], x), rtol=1e-5, atol=1e-5)


def test_models_with_other_class_counts_are_refused(models, tmp_path):
    with pytest.raises(InputError, match="same input and class count") as refused:
        ensemble(models["old"], models["five_classes"], tmp_path / "f.onnx", weight=0.5)
    assert refused.value.code == "incompatible_models"


def nfr_and_er_increase(old_logits: np.ndarray, new_logits: np.ndarray,
                        labels: np.ndarray) -> tuple[float, float]:
    """Plain numpy: the new predictions' NFR and error-rate increase against the old ones."""
    old_right, new_right = old_logits.argmax(1) == labels, new_logits.argmax(1) == labels
    return float(np.mean(old_right & ~new_right)), float(np.mean(old_right) - np.mean(new_right))


def test_weight_chosen_on_calibration_meets_the_limits(models, digits, tmp_path):
    limits = Limits(max_nfr=0.01, max_er_increase=0.0)
    result = ensemble(models["old"], models["new"], tmp_path / "f.onnx",
                      calibration=models["calibration"], limits=limits)
    onnx.checker.check_model(onnx.load(str(result.out)), full_check=True)
    x, labels = digits[1].x, digits[1].y
    old, new = logits(models["old"], x), logits(models["new"], x)
    nfr, er_increase = nfr_and_er_increase(old, logits(result.out, x), labels)
    assert nfr <= limits.max_nfr and er_increase <= limits.max_er_increase
    assert 0 < result.share <= 1
    for point in result.curve:  # each point of the curve, measured again on the mixed logits
        mixed = np.float32(point.share) * old + np.float32(1 - point.share) * new
        measured = nfr_and_er_increase(old, mixed, labels)
        assert (point.nfr, point.er_increase) == pytest.approx(measured, abs=1e-9), point
        assert (point.share >= result.share) or not limits.met(point)


def test_command_with_a_weight(models, tmp_path, capsys):
    out = tmp_path / "fixed.onnx"
    code = main(["repair", "ensemble", str(models["old"]), str(models["wide"]), "--weight",
                 "0.5", "--out", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["weight"] == 0.5 and report["curve"] == [] and out.is_file()


def test_command_refuses_a_weight_outside_0_1(models, tmp_path, capsys):
    code = main(["repair", "ensemble", str(models["old"]), str(models["new"]), "--weight", "1.5",
                 "--out", str(tmp_path / "f.onnx")])
    assert code == 2 and "[0, 1]" in capsys.readouterr().err
