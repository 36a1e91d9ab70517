"""The end-to-end demo: real MNIST classifiers as ONNX. An old one; a new architecture trained
plainly (the update `flipgate compare` shows, and the one the gate blocks); and the same new
architecture trained with Focal Distillation towards the old one (an update the gate approves)."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flipgate.datasets import mnist_digits, save_evalset, split
from flipgate.formats.evalsets import EvalSet
from flipgate.inference import OnnxClassifier
from flipgate.train import recipes
from flipgate.train.config import TrainConfig

NUM_CLASSES = 10
TRAIN_SIZE = 2500
OLD_TRAIN_SIZE = 1000


@dataclass(frozen=True)
class DemoFiles:
    old_model: Path
    new_model: Path
    evalset: Path
    fd_model: Path
    train_set: Path


@dataclass(frozen=True)
class DemoModel:
    """How one demo version is made: its architecture, training samples, seed and method."""

    name: str
    arch: str
    train_size: int
    seed: int
    method: str = "baseline"


OLD = DemoModel("old", "mlp:hidden=64", OLD_TRAIN_SIZE, seed=0)
NEW = DemoModel("new", "mlp:hidden=256,256", TRAIN_SIZE, seed=1)
FOCAL = DemoModel("fd", "mlp:hidden=256,256", TRAIN_SIZE, seed=2, method="fd")


def prepare_demo(
    folder: Path, progress: Callable[[str], Callable[[int, int], None]]
) -> DemoFiles:
    """Split MNIST 2,500/2,500, train the old (small, 1,000 samples) model, then the new one
    plainly and with FD towards the old one; export them with their run records."""
    train, evalset = split(mnist_digits(), TRAIN_SIZE, seed=0)
    old = _train_and_export(OLD, train, folder, progress)
    new = _train_and_export(NEW, train, folder, progress)
    focal = _train_and_export(FOCAL, train, folder, progress,
                              old_logits=OnnxClassifier(old).predict(train.x))
    return DemoFiles(old, new, save_evalset(evalset, folder / "mnist-eval.npz"), focal,
                     save_evalset(train, folder / "mnist-train.npz"))


def _train_and_export(
    spec: DemoModel, train: EvalSet, folder: Path,
    progress: Callable[[str], Callable[[int, int], None]],
    old_logits: np.ndarray | None = None,
) -> Path:
    data = EvalSet(train.x[: spec.train_size], train.y[: spec.train_size])
    old = None if old_logits is None else old_logits[: spec.train_size]
    trained = recipes.train(spec.method, spec.arch, data, NUM_CLASSES,
                            TrainConfig(seed=spec.seed), old_logits=old,
                            progress=progress)
    return trained.save(folder / f"{spec.name}.onnx", data.sample_shape)
