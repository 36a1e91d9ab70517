"""Comparing two models, each an ONNX file or precomputed .npy logits, on one eval set."""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flipgate.errors import InputError
from flipgate.formats import EvalSet, check_logits_match, load_logits
from flipgate.inference import DEFAULT_BATCH_SIZE, OnnxClassifier
from flipgate.metrics.report import PairAnalysis
from flipgate.progress import Progress


@dataclass(frozen=True)
class Scores:
    """A model's logits on an eval set (its labels as this model's columns), where they came
    from and, for a model run here, which inputs it was fed and which output read as what."""

    source: Path
    logits: np.ndarray
    provider: str
    evalset: EvalSet
    interface: dict[str, object] = field(default_factory=dict)

    def describe(self) -> dict[str, object]:
        return {"source": str(self.source), "provider": self.provider, **self.interface}


@dataclass(frozen=True)
class ReadAs:
    """Which output of an ONNX model holds its scores and what they are (logits or
    probabilities); None: chosen and detected from the graph (see flipgate.onnx_io)."""

    output: str | None = None
    scores: str | None = None


def score(
    source: str | Path, evalset: EvalSet, *, batch_size: int = DEFAULT_BATCH_SIZE,
    device: str = "auto", progress: Progress | None = None, read: ReadAs = ReadAs(),
) -> Scores:
    """Logits of an .onnx model run on the eval set (read as `read` says), or of an .npy
    file, validated."""
    source = Path(source)
    if source.suffix == ".npy":
        if evalset.labels_named:
            raise InputError("labels_need_classes", f"{source}: y holds class names; to "
                               "compare .npy logits add an array `classes` to the eval set")
        logits = load_logits(source, mmap=True)
        check_logits_match(logits, evalset, source=str(source))
        return Scores(source, logits, "precomputed", evalset)
    if source.suffix == ".onnx":
        model = OnnxClassifier(source, device, output=read.output, scores=read.scores)
        matched = model.check_evalset(evalset)
        return Scores(source, model.predict(model.feeds(evalset), batch_size, progress),
                      model.provider, matched, model.spec.describe())
    raise InputError("unknown_model_format", f"{source}: a model must be an .onnx file or "
                       ".npy logits")


def analyse(old: Scores, new: Scores) -> PairAnalysis:
    """The per-sample comparison of two scored models; they must agree on the classes."""
    old_classes, new_classes = old.logits.shape[1], new.logits.shape[1]
    if old_classes != new_classes:
        raise InputError("class_count_mismatch", f"{old.source} has {old_classes} classes "
                           f"but {new.source} has {new_classes}")
    if not np.array_equal(old.evalset.y, new.evalset.y):
        raise InputError("class_names_mismatch", f"{old.source} and {new.source} map the "
                           "eval set's labels to different columns (their class names differ)")
    return PairAnalysis(old.logits, new.logits, old.evalset.y)
