"""Comparing two models, each an ONNX file, precomputed .npy logits (N, C) or predicted
labels (N,) (a classifier known only by its answers), on one eval set."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flipgate.errors import InputError
from flipgate.formats import MAX_CLASSES, EvalSet, check_labels, check_logits_match, load_logits
from flipgate.inference import DEFAULT_BATCH_SIZE, OnnxClassifier
from flipgate.labels import holds_labels, load_predicted_labels
from flipgate.metrics.matrices import predicted_classes
from flipgate.metrics.report import PairAnalysis, compare_labels
from flipgate.progress import Progress


@dataclass(frozen=True)
class Scores:
    """A model's logits (or, labels only, its predicted classes) on an eval set and where
    they came from."""

    source: Path
    logits: np.ndarray | None
    provider: str
    classes: np.ndarray | None = None

    def describe(self) -> dict[str, str]:
        return {"source": str(self.source), "provider": self.provider}

    def predicted(self) -> np.ndarray:
        """The predicted class of each sample."""
        return self.classes if self.logits is None else predicted_classes(self.logits)


@dataclass(frozen=True, eq=False)
class LabelsAnalysis:
    """A comparison in which a side is known by predicted labels only: its report has every
    count and null scores; there is nothing to plot (`values`) and no gallery."""

    report: dict
    values: None = None

    def to_dict(self) -> dict:
        return self.report


def score(
    source: str | Path, evalset: EvalSet, *, batch_size: int = DEFAULT_BATCH_SIZE,
    device: str = "auto", progress: Progress | None = None,
) -> Scores:
    """Logits of an .onnx model run on the eval set, or of an .npy file, validated."""
    source = Path(source)
    if source.suffix == ".npy" and holds_labels(source):
        classes = load_predicted_labels(source, num_classes=MAX_CLASSES)
        if classes.size != evalset.n:
            raise InputError("length_mismatch", f"{source}: {classes.size} predicted labels "
                               f"for an eval set of {evalset.n} samples")
        return Scores(source, None, "labels", classes)
    if source.suffix == ".npy":
        logits = load_logits(source, mmap=True)
        check_logits_match(logits, evalset, source=str(source))
        return Scores(source, logits, "precomputed")
    if source.suffix == ".onnx":
        model = OnnxClassifier(source, device)
        model.check_evalset(evalset)
        return Scores(source, model.predict(evalset.x, batch_size, progress), model.provider)
    raise InputError("unknown_model_format", f"{source}: a model must be an .onnx file or "
                       ".npy logits (N, C), or .npy predicted labels (N,)")


def analyse(old: Scores, new: Scores, evalset: EvalSet) -> PairAnalysis | LabelsAnalysis:
    """The per-sample comparison of two scored models; they must agree on the classes."""
    if old.logits is None or new.logits is None:
        return _analyse_labels(old, new, evalset)
    old_classes, new_classes = old.logits.shape[1], new.logits.shape[1]
    if old_classes != new_classes:
        raise InputError("class_count_mismatch", f"{old.source} has {old_classes} classes "
                           f"but {new.source} has {new_classes}")
    return PairAnalysis(old.logits, new.logits, evalset.y)


def _analyse_labels(old: Scores, new: Scores, evalset: EvalSet) -> LabelsAnalysis:
    """The labels-only comparison: the classes are the columns of a side's logits, else
    every class that a label or a prediction names."""
    sides = (old, new)
    with_logits = [side.logits.shape[1] for side in sides if side.logits is not None]
    predictions = [side.predicted() for side in sides]
    num_classes = with_logits[0] if with_logits else max(
        2, 1 + max(int(evalset.y.max()), *(int(p.max()) for p in predictions)))
    for side, predicted in zip(sides, predictions, strict=True):
        check_labels(predicted, num_classes, source=f"predictions of {side.source}")
    check_labels(evalset.y, num_classes, source="the eval set")
    return LabelsAnalysis(compare_labels(*predictions, evalset.y, num_classes,
                                         groups=evalset.groups))
