"""ONNX Runtime inference: provider choice, batching, fixed batch sizes and exported ensembles."""

import numpy as np
import pytest
import torch

from flipgate.errors import InputError
from flipgate.export import AveragedEnsemble, export_onnx
from flipgate.inference import CUDA, OnnxClassifier

from .conftest import linear_onnx

RNG = np.random.default_rng(1)
WEIGHT, BIAS = RNG.normal(size=(6, 3)), RNG.normal(size=3)


@pytest.fixture
def linear_path(tmp_path):
    return linear_onnx(tmp_path / "linear.onnx", WEIGHT, BIAS, ("N", 6))


def test_logits_equal_the_linear_map_for_any_batch_size(linear_path):
    model = OnnxClassifier(linear_path)
    x = RNG.random((37, 6), dtype=np.float32)
    expected = x @ WEIGHT.astype(np.float32) + BIAS.astype(np.float32)
    for batch_size in (1, 7, 37, 1000):
        np.testing.assert_allclose(model.predict(x, batch_size), expected, rtol=1e-5, atol=1e-5)


def test_progress_reports_every_batch(linear_path):
    seen = []
    OnnxClassifier(linear_path).predict(
        RNG.random((10, 6), dtype=np.float32), 4, progress=lambda done, total: seen.append(done))
    assert seen == [4, 8, 10]


def test_fixed_batch_model_gets_padded_batches(tmp_path):
    model = OnnxClassifier(linear_onnx(tmp_path / "fixed.onnx", WEIGHT, BIAS, (4, 6)))
    assert model.spec.fixed_batch == 4
    x = RNG.random((10, 6), dtype=np.float32)
    np.testing.assert_allclose(model.predict(x, batch_size=999),
                               x @ WEIGHT.astype(np.float32) + BIAS.astype(np.float32),
                               rtol=1e-5, atol=1e-5)


def test_without_a_gpu_auto_runs_on_cpu_and_cuda_is_refused(linear_path):
    if OnnxClassifier(linear_path).provider == CUDA:
        pytest.skip("a usable GPU is present")
    assert OnnxClassifier(linear_path).provider == "CPUExecutionProvider"
    assert OnnxClassifier(linear_path, device="cpu").provider == "CPUExecutionProvider"
    with pytest.raises(InputError, match="CUDA execution provider is not usable") as error:
        OnnxClassifier(linear_path, device="cuda")
    assert error.value.code == "cuda_unavailable"


def test_exported_ensemble_averages_its_members(tmp_path):
    torch.manual_seed(0)
    members = [torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 4)) for _ in range(3)]
    x = RNG.random((5, 3, 4), dtype=np.float32)
    with torch.no_grad():
        expected = torch.stack([m(torch.from_numpy(x)) for m in members]).mean(0).numpy()
        single = members[0](torch.from_numpy(x)).numpy()
    ensemble = OnnxClassifier(export_onnx(AveragedEnsemble(members), (3, 4),
                                          tmp_path / "ensemble.onnx"))
    assert ensemble.spec.input_shape == (None, 3, 4) and ensemble.num_classes == 4
    np.testing.assert_allclose(ensemble.predict(x), expected, rtol=1e-5, atol=1e-5)
    one = OnnxClassifier(export_onnx(members[0], (3, 4), tmp_path / "one.onnx"))
    np.testing.assert_allclose(one.predict(x), single, rtol=1e-5, atol=1e-5)


def test_model_producing_nan_is_refused(tmp_path):
    model = OnnxClassifier(linear_onnx(tmp_path / "nan.onnx", WEIGHT, np.full(3, np.nan),
                                       ("N", 6)))
    with pytest.raises(InputError, match="NaN or infinite logits"):
        model.predict(RNG.random((3, 6), dtype=np.float32))


def test_logits_streamed_to_a_file_from_a_memory_mapped_eval_set(linear_path, tmp_path):
    x = RNG.random((1001, 6), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    model, seen = OnnxClassifier(linear_path), []
    path = model.predict_to_file(mapped, tmp_path / "logits.npy", batch_size=100,
                                 progress=lambda done, total: seen.append(done))
    written = np.load(path)
    assert written.dtype == np.float32 and written.shape == (1001, 3)
    np.testing.assert_array_equal(written, model.predict(x, batch_size=100))
    assert seen == [*range(100, 1001, 100), 1001]


def test_a_failed_stream_leaves_no_file(tmp_path):
    model = OnnxClassifier(linear_onnx(tmp_path / "nan.onnx", WEIGHT, np.full(3, np.nan),
                                       ("N", 6)))
    target = tmp_path / "logits.npy"
    with pytest.raises(InputError, match="NaN or infinite logits") as error:
        model.predict_to_file(RNG.random((5, 6), dtype=np.float32), target)
    assert error.value.code == "model_output_not_finite" and not target.exists()
