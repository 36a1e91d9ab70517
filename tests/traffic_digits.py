"""A real traffic set for the traffic tests: sklearn's digits (shipped with it: nothing is
downloaded) with `y` removed, and two classifiers' logits on it."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

NAMES = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                  "nine"])


@dataclass(frozen=True)
class Digits:
    """The files of digits_files and what they hold."""

    folder: Path
    old: Path
    new: Path
    traffic: Path
    labeled: Path
    truth: np.ndarray
    old_pred: np.ndarray
    new_pred: np.ndarray


def digits_files(folder: Path) -> Digits:
    """Two logistic regressions trained on different parts of digits, their logits on the
    rest, and that rest as a traffic set (ids, images, groups) and as a labeled set, in
    `folder`."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    models = [LogisticRegression(max_iter=300).fit(x[a:b], y[a:b]) for a, b in ((0, 200),
                                                                                  (200, 900))]
    rest, truth = x[900:], y[900:]
    logits = [model.decision_function(rest).astype(np.float32) for model in models]
    for name, values in zip(("old.npy", "new.npy"), logits, strict=True):
        np.save(folder / name, values)
    shown = {"classes": NAMES, "images": (rest.reshape(-1, 8, 8) * 255).astype(np.uint8)}
    np.savez(folder / "traffic.npz", x=rest, ids=np.array([f"req-{i}" for i in range(len(rest))]),
             groups=np.arange(len(rest)) % 2, **shown)
    np.savez(folder / "labeled.npz", x=rest, y=truth, **shown)
    return Digits(folder, folder / "old.npy", folder / "new.npy", folder / "traffic.npz",
                  folder / "labeled.npz", truth, *(values.argmax(1) for values in logits))


def annotated(task: dict, number: int, choice: str) -> dict:
    """The task as Label Studio's JSON export writes it once someone chose `choice`."""
    result = {**task["predictions"][0]["result"][0], "value": {"choices": [choice]},
              "id": f"r{number}", "origin": "manual"}
    return {"id": number, "data": task["data"], "predictions": task["predictions"],
            "annotations": [{"id": number, "completed_by": 1, "was_cancelled": False,
                             "result": [result], "ground_truth": False}]}
