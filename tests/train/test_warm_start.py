"""Warm starts: `flipgate train --init OLD.onnx` starts every method from the old weights."""

import numpy as np
import pytest
import torch

from flipgate.cli import main
from flipgate.datasets import mnist_digits, save_evalset, split
from flipgate.errors import InputError
from flipgate.export import read_weights
from flipgate.formats.evalsets import EvalSet
from flipgate.inference import OnnxClassifier
from flipgate.metrics import count_flips
from flipgate.train.config import TrainConfig
from flipgate.train.methods import METHODS
from flipgate.train.recipes import train
from flipgate.train.zoo import build_model

ARCH = "mlp:hidden=32"


@pytest.fixture(scope="module")
def digits() -> tuple[EvalSet, EvalSet]:
    """1,000 training digits and 1,000 held-out ones."""
    train_set, rest = split(mnist_digits(), 1000, seed=2)
    return train_set, EvalSet(rest.x[:1000], rest.y[:1000])


@pytest.fixture(scope="module")
def old_model(tmp_path_factory, digits):
    """An mlp trained on the first 500 training digits, exported to ONNX."""
    head = EvalSet(digits[0].x[:500], digits[0].y[:500])
    trained = train("baseline", ARCH, head, 10, TrainConfig(epochs=3, seed=0))
    return trained.save(tmp_path_factory.mktemp("warm") / "old.onnx", (28, 28))


@pytest.mark.parametrize("arch", ["mlp:hidden=32", "cnn:channels=4,8", "resnet:widths=4,8"])
def test_weights_read_back_reproduce_the_exported_model(tmp_path, digits, arch):
    torch.manual_seed(3)
    trained = train("baseline", arch, EvalSet(digits[0].x[:64], digits[0].y[:64]), 10,
                    TrainConfig(epochs=1))
    path = trained.save(tmp_path / "model.onnx", (28, 28))
    module = build_model(arch, (28, 28), 10)
    module.load_state_dict(read_weights(path, module))
    with torch.no_grad():
        logits = module.eval()(torch.from_numpy(digits[1].x[:50])).numpy()
    np.testing.assert_allclose(logits, OnnxClassifier(path, "cpu").predict(digits[1].x[:50]),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_starts_from_the_old_weights(old_model, digits, method):
    """With a vanishing learning rate, whatever a method trains stays the old model."""
    x = digits[1].x
    old_logits = OnnxClassifier(old_model, "cpu").predict(digits[0].x[:100])
    targets_old = METHODS[method].old == "required"
    trained = train(method, ARCH, EvalSet(digits[0].x[:100], digits[0].y[:100]), 10,
                    TrainConfig(epochs=1, batch_size=50, lr=1e-12),
                    old_logits=old_logits if targets_old else None, init=old_model)
    with torch.no_grad():
        logits = trained.module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(logits, OnnxClassifier(old_model, "cpu").predict(x), atol=1e-4)
    assert trained.record["init"] == str(old_model)


def test_warm_start_removes_negative_flips(old_model, digits):
    """Fine-tuning the old model on more data flips fewer of its right answers than a fresh
    model trained on the same data."""
    held_out = digits[1]
    old = OnnxClassifier(old_model, "cpu").predict(held_out.x).argmax(axis=1)
    nfr = {}
    for init in (None, old_model):
        model = train("baseline", ARCH, digits[0], 10, TrainConfig(epochs=3, seed=1),
                      init=init).module
        with torch.no_grad():
            new = model(torch.from_numpy(held_out.x)).argmax(dim=1).numpy()
        nfr[init is not None] = count_flips(old, new, held_out.y).rates()["nfr"]
    assert nfr[True] < 0.75 * nfr[False], nfr


@pytest.mark.parametrize(("arch", "message"), [
    ("mlp:hidden=64", "is shaped"), ("cnn:channels=4,8", "has no weight named")])
def test_another_architecture_is_refused(old_model, tmp_path, digits, arch, message):
    with pytest.raises(InputError, match=message):
        train("baseline", arch, digits[0], 10, TrainConfig(epochs=1), init=old_model)


def test_command_refuses_a_mismatch_with_exit_2(old_model, tmp_path, digits, capsys):
    data = save_evalset(digits[0], tmp_path / "train.npz")
    out = tmp_path / "new.onnx"
    code = main(["train", "--method", "baseline", "--arch", "mlp:hidden=64", "--train", str(data),
                 "--init", str(old_model), "--out", str(out), "--epochs", "1"])
    assert code == 2 and not out.exists()
    assert "is shaped (32, 784)" in capsys.readouterr().err
