"""Comparing two models, each an ONNX file or precomputed .npy logits, on one eval set."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flipgate.errors import InputError
from flipgate.formats import EvalSet, check_logits_match, load_logits
from flipgate.inference import DEFAULT_BATCH_SIZE, OnnxClassifier
from flipgate.metrics.report import PairAnalysis
from flipgate.progress import Progress


@dataclass(frozen=True)
class Scores:
    """A model's logits on an eval set and where they came from."""

    source: Path
    logits: np.ndarray
    provider: str

    def describe(self) -> dict[str, str]:
        return {"source": str(self.source), "provider": self.provider}


def score(
    source: str | Path, evalset: EvalSet, *, batch_size: int = DEFAULT_BATCH_SIZE,
    device: str = "auto", progress: Progress | None = None,
) -> Scores:
    """Logits of an .onnx model run on the eval set, or of an .npy file, validated."""
    source = Path(source)
    if source.suffix == ".npy":
        logits = load_logits(source, mmap=True)
        check_logits_match(logits, evalset, source=str(source))
        return Scores(source, logits, "precomputed")
    if source.suffix == ".onnx":
        model = OnnxClassifier(source, device)
        model.check_evalset(evalset)
        return Scores(source, model.predict(evalset.x, batch_size, progress), model.provider)
    raise InputError("unknown_model_format", f"{source}: a model must be an .onnx file or "
                       ".npy logits")


def analyse(old: Scores, new: Scores, evalset: EvalSet) -> PairAnalysis:
    """The per-sample comparison of two scored models; they must agree on the classes."""
    old_classes, new_classes = old.logits.shape[1], new.logits.shape[1]
    if old_classes != new_classes:
        raise InputError("class_count_mismatch", f"{old.source} has {old_classes} classes "
                           f"but {new.source} has {new_classes}")
    return PairAnalysis(old.logits, new.logits, evalset.y)
