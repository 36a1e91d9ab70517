"""ELODI's student trains `student_epochs` times as long as its teacher (issue 25)."""

import numpy as np
import pytest

from flipgate.formats.evalsets import EvalSet
from flipgate.train.config import TrainConfig
from flipgate.train.methods import Elodi
from flipgate.train.recipes import train

SAMPLES, FEATURES, CLASSES, BATCH = 40, 5, 3, 16


@pytest.fixture(scope="module")
def data() -> EvalSet:
    x = np.random.default_rng(0).normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    return EvalSet(x, x[:, :CLASSES].argmax(axis=1).astype(np.int64))


def steps_per_phase(data: EvalSet, options: Elodi, epochs: int) -> dict[str, int]:
    """Train ELODI and return each progress bar's total (the steps its phase ran)."""
    totals: dict[str, int] = {}

    def bar(label: str):
        def update(done: int, total: int) -> None:
            totals[label] = total
        return update

    config = TrainConfig(epochs=epochs, batch_size=BATCH)
    train("elodi", "mlp:hidden=8", data, CLASSES, config, options, progress=bar)
    return totals


def test_the_student_trains_student_epochs_times_the_teachers_steps(data):
    totals = steps_per_phase(data, Elodi(members=2), epochs=2)
    teacher, student = totals["ELODI teacher (2 members)"], totals["ELODI student"]
    assert teacher == 2 * -(-SAMPLES // BATCH)  # 2 epochs of 3 batches
    assert student == Elodi.student_epochs * teacher


def test_student_epochs_one_is_the_papers_recipe(data):
    totals = steps_per_phase(data, Elodi(members=2, student_epochs=1.0), epochs=3)
    assert totals["ELODI student"] == totals["ELODI teacher (2 members)"]


def test_student_epochs_must_be_positive():
    with pytest.raises(ValueError, match="student_epochs"):
        Elodi(student_epochs=0.0)
