"""Comparing two multi-label models on an eval set whose y is a matrix (N, L): each an ONNX
file (one score per label, see flipgate.onnx_io), precomputed .npy scores (N, L) (logits
unless told they are probabilities), or an .npy of 0/1 decisions (N, L) (a version known only
by its answers). Each version decides label j when its probability exceeds the label's
threshold: 0.5, or those given, or those its ONNX metadata declares."""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flipgate.compare import ReadAs
from flipgate.errors import InputError
from flipgate.formats.evalsets import EvalSet
from flipgate.formats.files import existing_file
from flipgate.formats.npy import NUMPY_READ_ERRORS, single_npy_header, unreadable
from flipgate.inference import DEFAULT_BATCH_SIZE, MultiLabelOnnx
from flipgate.metrics.multilabel import DEFAULT_THRESHOLD, compare_multilabel
from flipgate.progress import Progress
from flipgate.scores import LOGITS, label_probabilities


@dataclass(frozen=True)
class LabelScores:
    """A multi-label model's probabilities (N, L) on an eval set and its thresholds, or,
    labels only, its decisions (N, L); where they came from and, for a model run here,
    which inputs it was fed and which output read as what."""

    source: Path
    probabilities: np.ndarray | None
    provider: str
    decisions: np.ndarray | None = None
    thresholds: tuple[float, ...] | None = None
    interface: dict[str, object] = field(default_factory=dict)

    def side(self) -> np.ndarray:
        """What the metrics read: the probabilities, else the decisions."""
        return self.decisions if self.probabilities is None else self.probabilities

    def effective_thresholds(self, num_labels: int) -> list[float] | None:
        """Each label's threshold (None for a labels-only version)."""
        if self.probabilities is None:
            return None
        return list(self.thresholds or (DEFAULT_THRESHOLD,) * num_labels)

    def describe(self, num_labels: int) -> dict[str, object]:
        return {"source": str(self.source), "provider": self.provider, **self.interface,
                "thresholds": self.effective_thresholds(num_labels)}


def score_labels(source: str | Path, evalset: EvalSet, *, read: ReadAs | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE, device: str = "auto",
                 progress: Progress | None = None) -> LabelScores:
    """A multi-label model's scores on the eval set, validated: an .onnx model run (read as
    `read` says), .npy scores or .npy decisions; `read.thresholds` override the model's."""
    source, read = Path(source), read or ReadAs()
    if source.suffix == ".npy":
        scores = npy_label_scores(source, label_shape(evalset), read)
    elif source.suffix == ".onnx":
        model = MultiLabelOnnx(source, device, output=read.output, scores=read.scores)
        model.check_evalset(evalset)
        probabilities = model.predict(model.feeds(evalset), batch_size, progress)
        scores = LabelScores(source, probabilities, model.provider,
                             thresholds=read.thresholds or model.spec.thresholds,
                             interface=model.spec.describe())
    else:
        raise InputError("unknown_model_format", f"{source}: a multi-label model must be an "
                         ".onnx file, .npy scores (N, L) or .npy 0/1 decisions (N, L)")
    _check_thresholds(scores, scores.side().shape[1])
    return scores


def label_shape(evalset: EvalSet) -> tuple[int, int | None]:
    """The (N, L) a multi-label set's scores have: its y's, or on a traffic set N and the
    number of its `classes` (None without them: the models' count applies)."""
    if evalset.labeled:
        return evalset.y.shape
    return evalset.n, len(evalset.classes) if evalset.classes else None


def npy_label_scores(path: Path, shape: tuple[int, int | None], read: ReadAs, *,
                     source: str | None = None) -> LabelScores:
    """Float scores (N, L) of the .npy `path` (messages name it `source`) as probabilities
    (logits unless `read.scores` says otherwise), or integer / bool decisions (N, L) of 0s
    and 1s; `shape` is the eval set's (`label_shape`; L None: any)."""
    array = _load_npy(path, source or str(path))
    path = Path(source or path)
    if array.shape[0] != shape[0] or shape[1] not in (None, array.shape[1]):
        raise InputError("label_count_mismatch", f"{path}: shape {array.shape}, but the eval "
                         f"set's labels have shape {tuple(shape)} (N samples × L labels)")
    if np.issubdtype(array.dtype, np.floating):
        probabilities = label_probabilities(array, read.scores or LOGITS, source=str(path))
        return LabelScores(path, probabilities, "precomputed", thresholds=read.thresholds)
    if not np.isin(array, (0, 1)).all():
        raise InputError("labels_not_binary", f"{path}: multi-label decisions must hold only "
                         "0 and 1")
    if read.thresholds:
        raise InputError("invalid_thresholds", f"{path}: holds decisions (0/1), to which "
                         "thresholds do not apply")
    return LabelScores(path, None, "labels", decisions=array.astype(bool))


def _load_npy(path: Path, source: str) -> np.ndarray:
    """An (N, L) array of floats, integers or bools from an .npy, its header checked first."""
    path = existing_file(path, "scores", source)
    try:
        header = single_npy_header(path, source=source, what="scores")
        if len(header.shape) != 2 or header.dtype.kind not in "fiub":
            raise InputError("scores_shape", f"{source}: multi-label scores must be an (N, L) "
                             f"array of floats or of 0/1, got {header.dtype} {header.shape}")
        return np.load(path, allow_pickle=False)
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise unreadable(error, source, "scores_corrupt", "a readable .npy array") from error


def _check_thresholds(scores: LabelScores, num_labels: int) -> None:
    if scores.thresholds is not None and len(scores.thresholds) != num_labels:
        raise InputError("invalid_thresholds", f"{scores.source}: {len(scores.thresholds)} "
                         f"thresholds for {num_labels} labels")


@dataclass(frozen=True, eq=False)
class MultiLabelAnalysis:
    """A multi-label comparison: its report and both scored sides (for the gallery); nothing
    of the single-label plots (`values`)."""

    report: dict
    sides: tuple[LabelScores, LabelScores]
    values: None = None

    def to_dict(self) -> dict:
        return self.report


def analyse_multilabel(old: LabelScores, new: LabelScores,
                       evalset: EvalSet) -> MultiLabelAnalysis:
    """The multi-label report of two scored models (docs/metrics.md §Multi-label)."""
    num_labels = evalset.y.shape[1]
    report = compare_multilabel(evalset.y, old.side(), new.side(),
                                thresholds=(old.thresholds, new.thresholds),
                                label_names=evalset.classes, groups=evalset.groups)
    report["old"], report["new"] = old.describe(num_labels), new.describe(num_labels)
    return MultiLabelAnalysis(report, (old, new))
