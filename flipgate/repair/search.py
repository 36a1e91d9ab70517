"""Choosing the old model's share (α or w) on a calibration set: the ER/NFR curve and its search.

On a multi-label calibration set (y a 0/1 matrix (N, L)) a curve point's NFR is NFR_sample
(the share of samples with at least one label that turned wrong, the figure a multi-label
gate's max_nfr limits), its churn the share of samples with a changed label, and its error
the Hamming loss (the share of wrong (sample, label) pairs); each model decides a label when
its probability exceeds its thresholds, the repaired model's mixed with the same share."""

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from flipgate.errors import InputError
from flipgate.formats.evalsets import EvalSet, load_evalset
from flipgate.inference import MultiLabelOnnx, OnnxClassifier
from flipgate.metrics import count_flips
from flipgate.metrics.multilabel import predicted_labels
from flipgate.repair.graphs import Thresholds
from flipgate.scores import LOGITS, label_probabilities

Progress = Callable[[int, int], None]
GRID_STEPS = 20  # the curve is measured at share 0, 0.05, ..., 1
REFINEMENTS = 5  # then bisected between the last failing and first passing grid points


@dataclass(frozen=True)
class Limits:
    """What the repaired model must meet on the calibration set, against the old model."""

    max_nfr: float = 0.01
    max_er_increase: float = 0.0

    def met(self, point: "CurvePoint") -> bool:
        return point.nfr <= self.max_nfr and point.er_increase <= self.max_er_increase


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class CurvePoint:
    """The repaired model at one share of the old model, measured against the old model."""

    share: float
    er: float
    nfr: float
    churn: float
    er_increase: float


@dataclass(frozen=True)
class RepairResult:
    """A written repair: the old model's share (α or w), the curve it was chosen on, the file."""

    method: str
    share: float
    curve: list[CurvePoint]
    out: Path
    limits: Limits | None

    def to_dict(self) -> dict:
        """JSON-ready: `alpha` for interpolation, `weight` for the ensemble."""
        name = "alpha" if self.method == "interpolate" else "weight"
        return {"method": self.method, name: self.share, "out": str(self.out),
                "limits": asdict(self.limits) if self.limits else None,
                "curve": [asdict(point) for point in self.curve]}


def calibration_set(source: str | Path | EvalSet, *, multilabel: bool = False) -> EvalSet:
    """The labeled calibration set (class indices or, multi-label, a label matrix (N, L));
    refused when `multilabel` asks for a label matrix and the set has class indices."""
    data = source if isinstance(source, EvalSet) else load_evalset(source, multilabel=True)
    if multilabel and not data.multilabel:
        raise InputError("calibration_not_multilabel", "the models were declared multi-label "
                         "but the calibration set's y holds class indices, not a 0/1 label "
                         "matrix (N, L)")
    return data


class Calibration:
    """A labeled calibration set and the old model's predictions on it."""

    def __init__(self, data: EvalSet, old: str | Path) -> None:
        model = OnnxClassifier(old, device="cpu")
        self.data = data
        model.check_evalset(self.data)
        self.old_predictions = model.predict(self.data.x).argmax(axis=1)

    def measure(self, share: float, logits: np.ndarray) -> CurvePoint:
        """ER, NFR and churn of `logits` against the old model's predictions."""
        rates = count_flips(self.old_predictions, logits.argmax(axis=1), self.data.y).rates()
        return CurvePoint(share, rates["er_new"], rates["nfr"], rates["churn"],
                          rates["er_new"] - rates["er_old"])


class LabelCalibration:
    """A labeled multi-label calibration set, the old model's decisions on it (with its
    thresholds: those of share 1) and the repaired model's thresholds at each share."""

    def __init__(self, data: EvalSet, old: str | Path, thresholds: Thresholds) -> None:
        model = MultiLabelOnnx(old, device="cpu")
        self.data = model.check_evalset(data)
        self.old_decisions = predicted_labels(model.predict(model.feeds(data)), thresholds(1.0))
        self.thresholds = thresholds

    def measure(self, share: float, logits: np.ndarray) -> CurvePoint:
        """Hamming loss, NFR_sample and churn_sample of per-label `logits` (N, L), decided
        with the thresholds at `share`, against the old model's decisions."""
        decisions = predicted_labels(label_probabilities(logits, LOGITS), self.thresholds(share))
        y, old = self.data.y, self.old_decisions
        turned_wrong = (old == y) & (decisions != y)
        er, er_old = float((decisions != y).mean()), float((old != y).mean())
        return CurvePoint(share, er, float(turned_wrong.any(axis=1).mean()),
                          float((decisions != old).any(axis=1).mean()), er - er_old)


def calibration_for(data: EvalSet, old: str | Path, thresholds: Thresholds,
                    ) -> Calibration | LabelCalibration:
    """What measures a curve point on `data`: per label when it is multi-label."""
    return LabelCalibration(data, old, thresholds) if data.multilabel else Calibration(data, old)


def smallest_share(measure: Callable[[float], CurvePoint], limits: Limits,
                   progress: Progress | None = None) -> tuple[float, list[CurvePoint]]:
    """The smallest share of the old model meeting `limits` (grid, then bisection) and the
    curve of every share measured, in order of share."""
    total = GRID_STEPS + 1 + REFINEMENTS
    curve = []
    for step in range(GRID_STEPS + 1):
        curve.append(measure(step / GRID_STEPS))
        if progress:
            progress(step + 1, total)
    passing = [point.share for point in curve if limits.met(point)]
    if not passing:
        raise InputError("limits_unreachable", f"no share of the old model meets NFR <= "
                           f"{limits.max_nfr} and an ER increase <= {limits.max_er_increase} "
                           "on the calibration set, not even the old model alone")
    low, high = passing[0] - 1 / GRID_STEPS, passing[0]
    for step in range(REFINEMENTS if low >= 0 else 0):
        point = measure((low + high) / 2)
        curve.append(point)
        low, high = (low, point.share) if limits.met(point) else (point.share, high)
        if progress:
            progress(GRID_STEPS + 2 + step, total)
    return high, sorted(curve, key=lambda point: point.share)
