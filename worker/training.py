"""The repair task: retrain a blocked candidate, or mix it with its baseline on their ONNX
files; register the result and gate it again (it runs on worker.runtime; the request is
checked and queued by service.gate.repair_requests, what follows it is
service.flows.repair_trained)."""

import itertools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flipgate.formats.evalsets import load_training_set
from flipgate.progress import ProgressFactory
from flipgate.repair import Limits, RepairResult, ensemble, interpolate
from flipgate.scores import label_logits
from flipgate.train.config import TrainConfig
from flipgate.train.methods import METHODS
from service import flows, urls
from service.celery_app import TRAIN_TASK
from service.datasets.models import Dataset
from service.datasets.service import get_dataset
from service.gate.decisions import get_decision
from service.gate.repair_requests import (
    ONNX_REPAIRS,
    allowed_architecture,
    artifacts_named,
    pair_artifacts,
)
from service.predictions.service import score_label_probabilities, score_version
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_version
from worker.runtime import JobProgress, WorkerContext, finishing, job_session, job_task


def repair(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
    """Repair a blocked candidate as service.gate.repair_requests queued it: on the ONNX files
    or by retraining."""
    (repair_on_onnx if params["method"] in ONNX_REPAIRS else retrain)(ctx, job_id, params)


def retrain(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
    """Retrain a blocked candidate with a flip-reducing method, then register the new version
    with its lineage and gate it like the original."""
    # checked when requested; again before any import
    allowed_architecture(params["arch"], ctx.settings)
    from flipgate.train import recipes  # torch: loaded by the first retraining, not at start

    with job_session(ctx, job_id) as session:
        decision = get_decision(session=session, decision_id=params["decision_id"])
        line = session.get_one(ModelLine, decision.line_id)
        thresholds = get_version(session=session, version_id=decision.candidate_id).thresholds
        dataset = get_dataset(session=session, name=params["dataset"])
        old = (None if params["old_version_id"] is None
               else get_version(session=session, version_id=params["old_version_id"]))
    data = load_training_set(ctx.store.local_path(dataset.sha256), source=dataset.name,
                             multilabel=line.multilabel)
    old_logits = None if old is None else old_model_logits(ctx, old, dataset)
    trained = recipes.train(
        params["method"], params["arch"], data, line.num_classes, TrainConfig(**params["config"]),
        METHODS[params["method"]].options(**params["options"]), old_logits,
        progress=phase_progress(ctx, job_id, METHODS[params["method"]].phases))
    with tempfile.TemporaryDirectory() as folder:
        path = trained.save(Path(folder) / "model.onnx", data.sample_shape)
        finish_repair(ctx, job_id, params, path, metadata={"arch": params["arch"]},
                      produced_by={"dataset": params["dataset"], "record": trained.record},
                      thresholds=thresholds)


def old_model_logits(ctx: WorkerContext, old: ModelVersion, dataset: Dataset) -> np.ndarray:
    """The old model's logits on the training set that training distils: per label on a
    multi-label set, the logit log p − log(1 − p) of each label's probability."""
    if not dataset.multilabel:
        return score_version(store=ctx.store, version=old, dataset=dataset)[0]
    return label_logits(score_label_probabilities(store=ctx.store, version=old,
                                                  dataset=dataset)[0])


def repair_on_onnx(ctx: WorkerContext, job_id: int, params: dict[str, Any]) -> None:
    """Mix the blocked candidate with its baseline (flipgate.repair: interpolation or the
    ensemble), the baseline's share chosen on the calibration set; register and gate it."""
    with job_session(ctx, job_id) as session:
        decision = get_decision(session=session, decision_id=params["decision_id"])
        pair = pair_artifacts(session=session, store=ctx.store, decision=decision)
        thresholds = tuple(get_version(session=session, version_id=version_id).thresholds
                           for version_id in (decision.baseline_id, decision.candidate_id))
        multilabel = session.get_one(ModelLine, decision.line_id).multilabel
        calibration = get_dataset(session=session, name=params["calibration"])
    with tempfile.TemporaryDirectory() as folder:
        with artifacts_named(pair):
            result = _mixed(params, *(path for path, _ in pair),
                            ctx.store.local_path(calibration.sha256),
                            Path(folder) / "model.onnx", JobProgress(ctx, job_id),
                            PairKind(multilabel, thresholds))
        details = {key: value for key, value in result.to_dict().items() if key != "out"}
        finish_repair(ctx, job_id, params, result.out,
                      produced_by={**details, "calibration": params["calibration"]})


@dataclass(frozen=True)
class PairKind:
    """What the pair is: multi-label or not, and the thresholds each version decides at (the
    versions', which may differ from what their models' metadata declares)."""

    multilabel: bool
    thresholds: tuple[list[float] | None, list[float] | None]


def _mixed(params: dict[str, Any], old: Path, new: Path, calibration: Path, out: Path,
           progress: JobProgress, kind: PairKind) -> RepairResult:
    """The job's repair of the ONNX pair, written to `out`."""
    limits = Limits(**params["limits"])
    if params["method"] == "interpolate":
        return interpolate(old, new, calibration, out, limits, progress=progress,
                           thresholds=kind.thresholds)
    return ensemble(old, new, out, calibration=calibration, limits=limits, progress=progress,
                    probabilities=params["options"]["probabilities"],
                    multilabel=kind.multilabel, thresholds=kind.thresholds)


def finish_repair(ctx: WorkerContext, job_id: int, params: dict[str, Any], path: Path, *,
                  produced_by: dict[str, Any], metadata: dict[str, Any] | None = None,
                  thresholds: list[float] | None = None) -> None:
    """What follows the training happens (service.flows.repair_trained: the new version,
    gated again, deciding at `thresholds` on a multi-label line); the job succeeds in the
    same commit, its result linking both."""
    with finishing(ctx, job_id) as (session, result):
        version, decision = flows.repair_trained(
            session=session, settings=ctx.settings, store=ctx.store, job_id=job_id, path=path,
            produced_by=produced_by, metadata=metadata, thresholds=thresholds)
        line = session.get_one(ModelLine, version.line_id).name
        result.update(version=version.version, decision_id=decision.id,
                      repaired_decision_id=params["decision_id"],
                      version_url=urls.version(line, version.version),
                      decision_url=urls.decision(decision.id))


def phase_progress(ctx: WorkerContext, job_id: int, phases: int) -> ProgressFactory:
    """Progress callbacks for a recipe's phases, each filling its share of the job's 0..1."""
    counter = itertools.count()

    def for_phase(_label: str) -> JobProgress:
        index = min(next(counter), phases - 1)
        return JobProgress(ctx, job_id, start=index / phases, span=1 / phases)

    return for_phase


train = job_task(TRAIN_TASK, repair)
