"""ONNX models and a calibration set of real MNIST digits for the repair tests."""

from pathlib import Path

import pytest
import torch

from flipgate.datasets import mnist_digits, save_evalset, split
from flipgate.export import export_onnx
from flipgate.formats.evalsets import EvalSet
from flipgate.train.config import TrainConfig
from flipgate.train.recipes import train
from flipgate.train.zoo import build_model

SHAPE = (28, 28)


@pytest.fixture(scope="session")
def digits() -> tuple[EvalSet, EvalSet]:
    """800 training digits and 600 held-out calibration digits."""
    train_set, rest = split(mnist_digits(), 800, seed=1)
    return train_set, EvalSet(rest.x[:600], rest.y[:600])


@pytest.fixture(scope="session")
def models(tmp_path_factory, digits) -> dict[str, Path]:
    """Trained old and new mlps (two seeds), a wider mlp, an untrained cnn, a 5-class mlp."""
    folder = tmp_path_factory.mktemp("repair_models")
    train_set, calibration = digits
    paths = {"calibration": save_evalset(calibration, folder / "calibration.npz")}
    for name, seed in (("old", 0), ("new", 1)):
        trained = train("baseline", "mlp:hidden=32", train_set, 10, TrainConfig(epochs=2,
                                                                               seed=seed))
        paths[name] = trained.save(folder / f"{name}.onnx", SHAPE)
    for name, spec, classes in (("wide", "mlp:hidden=64", 10), ("cnn", "cnn:channels=4,8", 10),
                                ("five_classes", "mlp:hidden=32", 5)):
        torch.manual_seed(2)
        paths[name] = export_onnx(build_model(spec, SHAPE, classes), SHAPE,
                                  folder / f"{name}.onnx")
    return paths
