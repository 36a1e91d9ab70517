"""Weight interpolation on ONNX files: exact ends, refusals, the α search and the command."""

import json

import numpy as np
import onnx
import pytest

from flipgate.cli import main
from flipgate.errors import InputError
from flipgate.formats.evalsets import load_evalset
from flipgate.inference import OnnxClassifier
from flipgate.metrics import count_flips
from flipgate.repair import Limits, interpolate, interpolate_graph


def logits(path, x) -> np.ndarray:
    return OnnxClassifier(path, device="cpu").predict(x)


@pytest.mark.parametrize(("alpha", "equals"), [(1.0, "old"), (0.0, "new")])
def test_interpolation_ends_are_the_two_models_exactly(models, digits, tmp_path, alpha, equals):
    x = digits[1].x
    path = tmp_path / "blend.onnx"
    onnx.save(interpolate_graph(models["old"], models["new"], alpha), str(path))
    assert np.array_equal(logits(path, x), logits(models[equals], x))


def test_halfway_blend_differs_from_both(models, digits, tmp_path):
    x = digits[1].x
    path = tmp_path / "half.onnx"
    onnx.save(interpolate_graph(models["old"], models["new"], 0.5), str(path))
    blended = logits(path, x)
    assert not np.allclose(blended, logits(models["old"], x))
    assert not np.allclose(blended, logits(models["new"], x))


@pytest.mark.parametrize(("other", "reason"), [
    ("wide", "initializer"), ("cnn", "differ"), ("five_classes", "outputs differ")])
def test_structurally_different_models_are_refused(models, other, reason):
    with pytest.raises(InputError, match=reason) as refused:
        interpolate_graph(models["old"], models[other], 0.5)
    assert refused.value.code == "structure_mismatch"


def test_search_finds_the_smallest_alpha_meeting_the_limits(models, tmp_path):
    limits = Limits(max_nfr=0.01, max_er_increase=0.005)
    result = interpolate(models["old"], models["new"], models["calibration"],
                         tmp_path / "fixed.onnx", limits)
    calibration = load_evalset(models["calibration"])
    old = logits(models["old"], calibration.x).argmax(axis=1)
    fixed = logits(result.out, calibration.x).argmax(axis=1)
    rates = count_flips(old, fixed, calibration.y).rates()
    onnx.checker.check_model(onnx.load(str(result.out)), full_check=True)
    assert rates["nfr"] <= 0.01 and rates["er_new"] - rates["er_old"] <= 0.005
    shares = [point.share for point in result.curve]
    assert shares == sorted(shares) and shares[0] == 0.0 and shares[-1] == 1.0
    assert all(not limits.met(p) for p in result.curve if p.share < result.share)
    assert result.curve[-1].nfr == 0.0  # α = 1 is the old model


def test_command_writes_the_model_and_prints_the_curve(models, tmp_path, capsys):
    out = tmp_path / "fixed.onnx"
    code = main(["repair", "interpolate", str(models["old"]), str(models["new"]),
                 "--calibration", str(models["calibration"]), "--out", str(out),
                 "--max-nfr", "0.02", "--max-er-increase", "0.01", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and out.is_file()
    assert 0 <= report["alpha"] <= 1 and len(report["curve"]) >= 21
    assert report["limits"] == {"max_nfr": 0.02, "max_er_increase": 0.01}


def test_command_refuses_other_structures_with_exit_2(models, tmp_path, capsys):
    out = tmp_path / "fixed.onnx"
    code = main(["repair", "interpolate", str(models["old"]), str(models["cnn"]),
                 "--calibration", str(models["calibration"]), "--out", str(out)])
    assert code == 2 and not out.exists()
    assert "cannot be interpolated" in capsys.readouterr().err


def test_unreachable_limits_are_refused(models, tmp_path):
    with pytest.raises(InputError) as refused:
        interpolate(models["old"], models["new"], models["calibration"], tmp_path / "f.onnx",
                    Limits(max_nfr=0.0, max_er_increase=-0.5))
    assert refused.value.code == "limits_unreachable"
