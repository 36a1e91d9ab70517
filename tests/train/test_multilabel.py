"""Multi-label training: the losses on per-label logits against plain numpy, the methods that
do not apply refused, every method that does trains a model scoring each label, and `flipgate
train` does the same from a multi-label training set on real digits."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from scipy.special import expit, log_expit
from torch.nn import functional as F

from flipgate.datasets import DIGIT_NAMES, digit_composites, save_evalset, small_digits
from flipgate.errors import InputError
from flipgate.formats.evalsets import EvalSet, validate_evalset
from flipgate.inference import MultiLabelOnnx
from flipgate.train import methods
from flipgate.train.config import TrainConfig
from flipgate.train.loop import Batch, stacked_cross_entropy
from flipgate.train.losses import (
    AntiDistillation,
    ELODILoss,
    FocalDistillation,
    KnowledgeDistillation,
    as_classes,
)
from flipgate.train.methods import resolve_options
from flipgate.train.recipes import train
from tests.conftest import numpy_mlp

B, L = 5, 4


def arrays(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Logits of a new model, an old model and a reference (B, L), and labels (B, L); one old
    logit is exactly 0 (σ = 0.5: decided absent)."""
    rng = np.random.default_rng(seed)
    z, old, reference = (2 * rng.normal(size=(B, L)) for _ in range(3))
    old[0, 0] = 0.0
    return z, old, reference, rng.random((B, L)) < 0.4


def tensors(*values: np.ndarray) -> list[torch.Tensor]:
    return [torch.tensor(value, dtype=torch.float64 if value.dtype != bool else torch.bool)
            for value in values]


def bce(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-(sample, label) binary cross-entropy of logits z."""
    return -(y * log_expit(z) + (1 - y) * log_expit(-z))


def binary_kl(target: np.ndarray, z: np.ndarray, temperature: float) -> np.ndarray:
    """T² · KL(Bernoulli(σ(target/T)) ‖ Bernoulli(σ(z/T))) per pair."""
    p, q = expit(target / temperature), expit(z / temperature)
    return temperature**2 * (p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q)))


def old_right(old: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Where the old model's decision σ(z) > 0.5 matches the label."""
    return (expit(old) > 0.5) == y


def test_cross_entropy_of_the_two_class_view_is_the_mean_binary_cross_entropy() -> None:
    z, _, _, y = arrays(0)
    value = F.cross_entropy(*as_classes(*tensors(z, y)))
    assert value.item() == pytest.approx(bce(z, y).mean(), rel=1e-12)


@pytest.mark.parametrize("divergence", ["kl", "lm"])
def test_fd_on_labels_is_bce_plus_each_labels_distillation_weighted_where_old_was_right(
        divergence: str) -> None:
    z, old, _, y = arrays(1)
    loss = FocalDistillation(alpha=0.5, beta=3.0, temperature=2.0, lam=0.7,
                             divergence=divergence)
    value = loss(*as_classes(*tensors(z, y, old)))
    weights = 0.5 + 3.0 * old_right(old, y)
    distance = binary_kl(old, z, 2.0) if divergence == "kl" else 0.5 * (z - old) ** 2
    expected = bce(z, y).mean() + 0.7 * (weights * distance).mean()
    assert value.item() == pytest.approx(expected, rel=1e-10)


def test_fd_pulls_each_label_towards_the_old_logit_harder_where_the_old_model_was_right(
        ) -> None:
    """The gradient of FD minus that of BCE, label by label: λ·w·(z − z_old) / (B·L) with
    w = α + β where the old model decided that label of that sample right, α elsewhere."""
    z, old, _, y = arrays(2)
    logits, labels, old_logits = tensors(z, y, old)
    logits.requires_grad_()
    loss = FocalDistillation(alpha=1.0, beta=5.0, lam=2.0, divergence="lm")
    fd_grad, = torch.autograd.grad(loss(*as_classes(logits, labels, old_logits)), logits)
    bce_grad, = torch.autograd.grad(F.cross_entropy(*as_classes(logits, labels)), logits)
    weights = np.where(old_right(old, y), 6.0, 1.0)
    np.testing.assert_allclose((fd_grad - bce_grad).numpy(), 2.0 * weights * (z - old) / z.size,
                               rtol=1e-10, atol=1e-14)
    assert 0 < old_right(old, y).mean() < 1  # both weights occur


def test_kd_on_labels_is_bce_plus_each_labels_tempered_kl() -> None:
    z, old, _, y = arrays(3)
    value = KnowledgeDistillation(lam=0.3, temperature=4.0)(*as_classes(*tensors(z, y, old)))
    expected = bce(z, y).mean() + 0.3 * binary_kl(old, z, 4.0).mean()
    assert value.item() == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_elodi_distils_each_labels_logit_towards_the_ensembles(p: float) -> None:
    z, _, reference, y = arrays(4)
    value = ELODILoss(alpha=0.3, p=p)(*as_classes(*tensors(z, y, reference), None))
    expected = 0.7 * bce(z, y).mean() + 0.3 * (np.abs(z - reference) ** p).mean()
    assert value.item() == pytest.approx(expected, rel=1e-10)


def test_elodi_legacy_term_mixes_the_old_models_logit_per_label() -> None:
    z, old, reference, y = arrays(5)
    value = ELODILoss(alpha=0.5, p=1.0, legacy_weight=0.75)(
        *as_classes(*tensors(z, y, reference, old)))
    inhibition = 0.75 * np.abs(z - reference).mean() + 0.25 * np.abs(z - old).mean()
    assert value.item() == pytest.approx(0.5 * bce(z, y).mean() + 0.5 * inhibition, rel=1e-10)


def test_anti_distillation_sums_the_members_binary_cross_entropy() -> None:
    z, old, reference, y = arrays(6)
    members = np.stack([z, old, reference])
    value = AntiDistillation(lam=0.0)(*tensors(members, y))
    assert value.item() == pytest.approx(3 * bce(members, y[None]).mean(), rel=1e-10)


def test_stacked_cross_entropy_sums_each_members_mean_binary_cross_entropy() -> None:
    z, old, _, y = arrays(7)
    _, _, _, other_y = arrays(8)
    logits, labels = tensors(np.stack([z, old]), np.stack([y, other_y]))
    value = stacked_cross_entropy(logits, Batch(torch.zeros(2, B), labels, torch.zeros(2, B), 0))
    assert value.item() == pytest.approx(bce(z, y).mean() + bce(old, other_y).mean(), rel=1e-10)


@pytest.mark.parametrize(("method", "options", "names"), [
    ("entropy", None, "entropy of the softmax"),
    ("codistill", None, "symmetric KL of the softmax"),
    ("elodi", methods.Elodi(k=1), "K = 1"),
])
def test_methods_that_need_a_softmax_over_classes_are_refused(method, options, names) -> None:
    with pytest.raises(InputError, match=names) as refused:
        resolve_options(method, options, has_old=False, multilabel=True)
    assert refused.value.code == "method_not_multilabel"
    resolve_options(method, options, has_old=False)  # single-label: as before


@pytest.fixture(scope="module")
def tiny_set():
    """64 samples of 6 features, 3 labels that depend on the features."""
    x = np.random.default_rng(0).normal(size=(64, 6)).astype(np.float32)
    return validate_evalset(x, x[:, :3] > 0, multilabel=True)


def test_a_refused_method_trains_nothing(tiny_set) -> None:
    with pytest.raises(InputError, match="does not apply to a multi-label model"):
        train("entropy", "mlp:hidden=8", tiny_set, 3, TrainConfig(epochs=1))


def test_the_model_needs_one_output_per_label(tiny_set) -> None:
    with pytest.raises(InputError, match="3 labels") as refused:
        train("baseline", "mlp:hidden=8", tiny_set, 4, TrainConfig(epochs=1))
    assert refused.value.code == "label_count_mismatch"


SMALL = {"elodi": methods.Elodi(members=2, student_epochs=1.0),
         "paragon": methods.Paragon(members=2), "anti_distill": methods.AntiDistill(members=2)}


@pytest.mark.parametrize("method", ["baseline", "kd", "fd", "elodi", "paragon", "anti_distill"])
def test_every_applicable_method_trains_a_model_that_scores_each_label(method, tiny_set,
                                                                        tmp_path) -> None:
    config = TrainConfig(epochs=1, batch_size=16)
    old = None
    if methods.METHODS[method].old == "required":
        old_model = train("baseline", "mlp:hidden=8", tiny_set, 3, config).module
        old = old_model(torch.from_numpy(tiny_set.x)).detach().numpy()
    trained = train(method, "mlp:hidden=8", tiny_set, 3, config, SMALL.get(method), old)
    assert trained.record["multilabel"] is True
    path = trained.save(tmp_path / "model.onnx", tiny_set.sample_shape)
    model = MultiLabelOnnx(path, device="cpu")
    model.check_evalset(tiny_set)
    logits = trained.module(torch.from_numpy(tiny_set.x)).detach().numpy()
    np.testing.assert_allclose(model.predict(model.feeds(tiny_set)), expit(logits), atol=1e-6)


ARCH = "mlp:hidden=16"
CLI_CONFIG = TrainConfig(epochs=2, batch_size=32)


@pytest.fixture(scope="module")
def composites(tmp_path_factory) -> tuple[EvalSet, dict[str, Path]]:
    """240 composites of scikit-learn's real 8×8 digits labelled with the digits they show,
    as a 0/1 matrix and as label-name sets with `classes`; an old model trained on them."""
    folder = tmp_path_factory.mktemp("multilabel_cli")
    data = digit_composites(240, seed=0, digits=small_digits())
    names = np.array([[DIGIT_NAMES[j] for j in np.flatnonzero(row)] + [""] * (3 - row.sum())
                      for row in data.y])
    np.savez(folder / "names.npz", x=data.x, y=names, classes=np.array(DIGIT_NAMES))
    old = train("baseline", ARCH, data, 10, TrainConfig(epochs=1, seed=7))
    return data, {"matrix": save_evalset(data, folder / "matrix.npz"),
                  "names": folder / "names.npz",
                  "old": old.save(folder / "old.onnx", data.sample_shape)}


def onnx_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    """What the exported graph computes, run as it is."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def onnx_weights(path: Path) -> dict[str, np.ndarray]:
    return {tensor.name: numpy_helper.to_array(tensor)
            for tensor in onnx.load(str(path)).graph.initializer}


def torch_logits(module: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    """The torch model's logits computed in numpy from its weights."""
    return numpy_mlp({name: value.numpy() for name, value in module.state_dict().items()}, x)


def cli_train(run_cli, data: Path, out: Path, method: str, *extra: str | Path):
    return run_cli("train", "--method", method, "--arch", ARCH, "--train", data, "--out", out,
                   "--epochs", CLI_CONFIG.epochs, "--batch-size", CLI_CONFIG.batch_size, *extra)


@pytest.mark.parametrize("labels", ["matrix", "names"])
def test_flipgate_train_exports_one_logit_per_label_as_the_library_trains_them(
        composites, labels, tmp_path, run_cli) -> None:
    data, files = composites
    out = tmp_path / "model.onnx"
    result = cli_train(run_cli, files[labels], out, "baseline")
    assert result.code == 0, result.err
    assert "on 240 samples" in result.out and "10 labels, multi-label" in result.out
    logits = onnx_outputs(out, data.x)
    assert logits.shape == (240, 10)
    np.testing.assert_allclose(logits, numpy_mlp(onnx_weights(out), data.x), atol=1e-5)
    module = train("baseline", ARCH, data, 10, CLI_CONFIG).module  # the same seed
    np.testing.assert_allclose(logits, torch_logits(module, data.x), atol=1e-5)
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["multilabel"] is True and record["num_classes"] == 10


@pytest.mark.parametrize(("method", "flags", "options"), [
    ("fd", ["--beta", "3"], methods.FD(beta=3.0)),
    ("kd", [], None),
    ("elodi", ["--members", "2", "--student-epochs", "1"],
     methods.Elodi(members=2, student_epochs=1.0)),
])
def test_flipgate_train_distils_each_label_towards_the_old_models_logit(
        composites, method, flags, options, tmp_path, run_cli) -> None:
    """The CLI's model equals the library's trained towards the old model's logits computed
    here from its weights."""
    data, files = composites
    out = tmp_path / f"{method}.onnx"
    result = cli_train(run_cli, files["matrix"], out, method, *flags, "--old", files["old"])
    assert result.code == 0, result.err
    old_logits = numpy_mlp(onnx_weights(files["old"]), data.x).astype(np.float32)
    module = train(method, ARCH, data, 10, CLI_CONFIG, options, old_logits).module
    np.testing.assert_allclose(onnx_outputs(out, data.x), torch_logits(module, data.x),
                               atol=1e-4)


@pytest.mark.parametrize(("method", "extra", "message"), [
    ("entropy", [], "method 'entropy' does not apply to a multi-label model"),
    ("codistill", [], "method 'codistill' does not apply to a multi-label model"),
    ("elodi", ["--k", "1"], "K = 1"),
    ("baseline", ["--num-classes", "4"], "the training set has 10 labels"),
])
def test_flipgate_train_refuses_what_a_multilabel_set_cannot_train(
        composites, method, extra, message, tmp_path, run_cli) -> None:
    out = tmp_path / "refused.onnx"
    result = cli_train(run_cli, composites[1]["matrix"], out, method, *extra)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("flipgate train: error: ") and message in result.err
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_flipgate_train_refuses_an_old_model_scoring_other_labels(composites, tmp_path,
                                                                  run_cli) -> None:
    data, files = composites
    other = train("baseline", ARCH, replace(data, y=data.y[:, :4]), 4, TrainConfig(epochs=1))
    old = other.save(tmp_path / "old4.onnx", data.sample_shape)
    result = cli_train(run_cli, files["matrix"], tmp_path / "new.onnx", "fd", "--old", old)
    assert result.code == 2 and "the model scores 4 labels" in result.err
    assert not (tmp_path / "new.onnx").exists()
