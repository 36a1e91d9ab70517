"""Comparing two models, each an ONNX file, precomputed .npy logits (N, C) or predicted
labels (N,) (a classifier known only by its answers), on one eval set."""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flipgate.errors import InputError
from flipgate.formats.evalsets import MAX_CLASSES, EvalSet, check_labels
from flipgate.formats.logits import check_logits_match, load_logits
from flipgate.inference import DEFAULT_BATCH_SIZE, OnnxClassifier
from flipgate.labels import holds_labels, load_predicted_labels
from flipgate.metrics.matrices import predicted_classes
from flipgate.metrics.report import PairAnalysis, compare_labels
from flipgate.metrics.traffic import disagreement_order, traffic_report
from flipgate.progress import Progress


@dataclass(frozen=True)
class Scores:
    """A model's logits on an eval set (its labels as this model's columns), or, labels only,
    its predicted classes; where they came from and, for a model run here, which inputs it
    was fed and which output read as what."""

    source: Path
    logits: np.ndarray | None
    provider: str
    evalset: EvalSet
    interface: dict[str, object] = field(default_factory=dict)
    classes: np.ndarray | None = None

    def describe(self) -> dict[str, object]:
        return {"source": str(self.source), "provider": self.provider, **self.interface}

    def predicted(self) -> np.ndarray:
        """The predicted class of each sample."""
        return self.classes if self.logits is None else predicted_classes(self.logits)


@dataclass(frozen=True)
class ReadAs:
    """Which output of an ONNX model holds its scores and what they are (logits or
    probabilities); None: chosen and detected from the graph (see flipgate.onnx_io). A
    multi-label model's `thresholds` (one per label) override those it declares."""

    output: str | None = None
    scores: str | None = None
    thresholds: tuple[float, ...] | None = None


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
    device: str = "auto", progress: Progress | None = None, read: ReadAs = ReadAs(),
) -> Scores:
    """Logits of an .onnx model run on the eval set (read as `read` says), or of an .npy
    file, validated."""
    source = Path(source)
    if source.suffix == ".npy" and evalset.labels_named:
        raise InputError("labels_need_classes", f"{source}: y holds class names; to "
                           "compare .npy predictions add an array `classes` to the eval set")
    if source.suffix == ".npy" and holds_labels(source):
        classes = load_predicted_labels(source, num_classes=MAX_CLASSES)
        if classes.size != evalset.n:
            raise InputError("length_mismatch", f"{source}: {classes.size} predicted labels "
                               f"for an eval set of {evalset.n} samples")
        return Scores(source, None, "labels", evalset, classes=classes)
    if source.suffix == ".npy":
        logits = load_logits(source, mmap=True)
        check_logits_match(logits, evalset, source=str(source))
        return Scores(source, logits, "precomputed", evalset)
    if source.suffix == ".onnx":
        model = OnnxClassifier(source, device, output=read.output, scores=read.scores)
        matched = model.check_evalset(evalset)
        return Scores(source, model.predict(model.feeds(evalset), batch_size, progress),
                      model.provider, matched, model.spec.describe())
    raise InputError("unknown_model_format", f"{source}: a model must be an .onnx file or "
                       ".npy logits (N, C), or .npy predicted labels (N,)")


def analyse(old: Scores, new: Scores) -> PairAnalysis | LabelsAnalysis:
    """The per-sample comparison of two scored models; they must agree on the classes."""
    if old.logits is None or new.logits is None:
        return _analyse_labels(old, new)
    old_classes, new_classes = old.logits.shape[1], new.logits.shape[1]
    if old_classes != new_classes:
        raise InputError("class_count_mismatch", f"{old.source} has {old_classes} classes "
                           f"but {new.source} has {new_classes}")
    if not np.array_equal(old.evalset.y, new.evalset.y):
        raise InputError("class_names_mismatch", f"{old.source} and {new.source} map the "
                           "eval set's labels to different columns (their class names differ)")
    return PairAnalysis(old.logits, new.logits, old.evalset.y)


def _analyse_labels(old: Scores, new: Scores) -> LabelsAnalysis:
    """The labels-only comparison: the classes are the columns of a side's logits (its eval
    set's labels mapped to them), else every class that a label or a prediction names."""
    sides = (old, new)
    evalset = next((side.evalset for side in sides if side.logits is not None), old.evalset)
    with_logits = [side.logits.shape[1] for side in sides if side.logits is not None]
    predictions = [side.predicted() for side in sides]
    num_classes = with_logits[0] if with_logits else max(
        2, 1 + max(int(evalset.y.max()), *(int(p.max()) for p in predictions)))
    for side, predicted in zip(sides, predictions, strict=True):
        check_labels(predicted, num_classes, source=f"predictions of {side.source}")
    check_labels(evalset.y, num_classes, source="the eval set")
    return LabelsAnalysis(compare_labels(*predictions, evalset.y, num_classes,
                                         groups=evalset.groups))


@dataclass(frozen=True, eq=False)
class TrafficAnalysis:
    """A comparison on a traffic set: its report, the disagreements' export order and both
    predicted classes; no plots and no gallery (`values`)."""

    report: dict
    order: np.ndarray
    predictions: tuple[np.ndarray, np.ndarray]
    values: None = None

    def to_dict(self) -> dict:
        return self.report


def traffic_classes(old: Scores, new: Scores, predictions: list[np.ndarray]) -> int:
    """The class count of a traffic comparison: the logits' columns, else the set's class
    names, else every class a prediction names."""
    columns = {side.logits.shape[1] for side in (old, new) if side.logits is not None}
    if len(columns) > 1:
        raise InputError("class_count_mismatch", f"{old.source} and {new.source} have "
                         "different numbers of classes")
    classes = old.evalset.classes
    num_classes = (columns.pop() if columns else len(classes) if classes
                   else max(2, 1 + max(int(pred.max()) for pred in predictions)))
    for side, predicted in zip((old, new), predictions, strict=True):
        check_labels(predicted, num_classes, source=f"predictions of {side.source}")
    return num_classes


def analyse_traffic(old: Scores, new: Scores, *, set_sha256: str,
                    labels: np.ndarray | None = None) -> TrafficAnalysis:
    """The traffic report of two scored models on a traffic set whose file has the digest
    `set_sha256` (it seeds the export order), with the labels known so far."""
    predictions = [side.predicted() for side in (old, new)]
    num_classes = traffic_classes(old, new, predictions)
    order = disagreement_order(*predictions, set_sha256)
    evalset = old.evalset
    scores = None if old.logits is None or new.logits is None else (old.logits, new.logits)
    report = traffic_report(*predictions, num_classes=num_classes, order=order,
                            class_names=list(evalset.classes) if evalset.classes else None,
                            groups=evalset.groups, scores=scores, labels=labels)
    return TrafficAnalysis(report, order, (predictions[0], predictions[1]))
