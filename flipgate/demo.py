"""The end-to-end demo: two real MNIST classifiers, an old and a better new one, as ONNX."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flipgate.datasets import mnist_digits, save_evalset, split
from flipgate.formats import EvalSet
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


@dataclass(frozen=True)
class DemoModel:
    """How one demo version is made: its architecture, training samples and seed."""

    name: str
    arch: str
    train_size: int
    seed: int


OLD = DemoModel("old", "mlp:hidden=64", OLD_TRAIN_SIZE, seed=0)
NEW = DemoModel("new", "mlp:hidden=256,256", TRAIN_SIZE, seed=1)


def prepare_demo(
    folder: Path, progress: Callable[[str], Callable[[int, int], None]]
) -> DemoFiles:
    """Split MNIST 2,500/2,500, train the old (small, 1,000 samples) and new model, export."""
    train, evalset = split(mnist_digits(), TRAIN_SIZE, seed=0)
    paths = [_train_and_export(spec, train, folder, progress) for spec in (OLD, NEW)]
    return DemoFiles(*paths, save_evalset(evalset, folder / "mnist-eval.npz"))


def _train_and_export(
    spec: DemoModel, train: EvalSet, folder: Path,
    progress: Callable[[str], Callable[[int, int], None]],
) -> Path:
    data = EvalSet(train.x[: spec.train_size], train.y[: spec.train_size])
    trained = recipes.train("baseline", spec.arch, data, NUM_CLASSES, TrainConfig(seed=spec.seed),
                            progress=progress)
    return trained.save(folder / f"{spec.name}.onnx", data.sample_shape)
