"""A real multi-label traffic set for the traffic tests: composites of scikit-learn's 8×8
digits (shipped with it: nothing is downloaded) labelled with the digits they show, their
label sets removed, each from one of three cameras (the set's `groups`); two one-vs-rest
logistic regressions (trained on 60 and on 300 other composites), their skl2onnx exports
and their probabilities on it; the truth kept aside for the labellers."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from skl2onnx import to_onnx
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier

from flipgate.datasets import DIGIT_NAMES, digit_composites, small_digits, split


@dataclass(frozen=True)
class LabelTraffic:
    """The files of label_traffic_files and what they hold."""

    traffic: Path  # x, ids, images, classes, groups: no y
    old: Path  # the old model's probabilities (N, L), .npy; old.onnx beside it: the model
    new: Path
    truth: np.ndarray  # (N, L) bool
    old_probabilities: np.ndarray
    new_probabilities: np.ndarray
    groups: np.ndarray  # (N,) the camera of each sample

    @property
    def decisions(self) -> tuple[np.ndarray, np.ndarray]:
        """Each model's labels as its own probabilities above 0.5 say, plainly."""
        return self.old_probabilities > 0.5, self.new_probabilities > 0.5

    @property
    def changed(self) -> np.ndarray:
        """The samples whose decisions differ on any label, ascending."""
        old, new = self.decisions
        return np.flatnonzero((old != new).any(axis=1))

    def names(self, row: np.ndarray) -> list[str]:
        """The label names of a 0/1 row."""
        return [DIGIT_NAMES[j] for j in np.flatnonzero(row)]


def label_traffic_files(folder: Path) -> LabelTraffic:
    """The traffic set and both models' probabilities in `folder`."""
    train_digits, traffic_digits = split(small_digits(), 1000, seed=0)
    train, traffic = (digit_composites(n, seed=seed, digits=part) for n, seed, part in (
        (300, 1, train_digits), (240, 2, traffic_digits)))
    x, train_x = (part.x.reshape(part.n, -1) for part in (traffic, train))
    models = [OneVsRestClassifier(LogisticRegression(max_iter=300))
              .fit(train_x[:size], train.y[:size].astype(int)) for size in (60, 300)]
    probabilities = [model.predict_proba(x) for model in models]
    groups = np.random.default_rng(4).choice(np.array(["cam-a", "cam-b", "cam-c"]), traffic.n)
    for name, model, values in zip(("old", "new"), models, probabilities, strict=True):
        np.save(folder / f"{name}.npy", values)
        onnx = to_onnx(model, x[:1], options={"zipmap": False})
        (folder / f"{name}.onnx").write_bytes(onnx.SerializeToString())
    np.savez(folder / "traffic.npz", x=x, ids=np.array([f"req-{i}" for i in range(traffic.n)]),
             images=traffic.images, classes=np.array(DIGIT_NAMES), groups=groups)
    return LabelTraffic(folder / "traffic.npz", folder / "old.npy", folder / "new.npy",
                        traffic.y, *probabilities, groups)


def annotated_sets(tasks: list[dict], truth: np.ndarray) -> list[dict]:
    """The tasks as Label Studio's JSON export writes them once someone chose each sample's
    true label set (no result at all for an empty set, as Label Studio saves it)."""
    def result(task: dict, number: int) -> list[dict]:
        chosen = [DIGIT_NAMES[j] for j in np.flatnonzero(truth[task["data"]["index"]])]
        return [{"from_name": "label", "to_name": "sample", "type": "choices",
                 "value": {"choices": chosen}, "id": f"r{number}",
                 "origin": "manual"}] if chosen else []

    return [{"id": number, "data": task["data"], "predictions": task["predictions"],
             "annotations": [{"id": number, "completed_by": 1, "was_cancelled": False,
                              "result": result(task, number), "ground_truth": False}]}
            for number, task in enumerate(tasks, start=1)]
