"""Repairing a blocked candidate: a training job that retrains its architecture on the line's
training data with a flip-reducing method, registers the result and gates it again.

Everything the job needs is checked and resolved here, when it is requested, so that a bad
request is refused at once instead of failing in the worker.
"""

from dataclasses import asdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from flipgate.train.config import TrainConfig
from flipgate.train.methods import METHODS, resolve_options
from service.datasets.models import Dataset, DatasetRole
from service.datasets.service import get_dataset_of_role
from service.errors import Conflict, InvalidInput
from service.gate.decisions import get_decision
from service.gate.models import Decision, Verdict
from service.gate.schemas import RepairRequest
from service.jobs.enqueue import create_job
from service.jobs.models import Job, JobKind
from service.names import VERSION, check_name
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_version


def request_repair(*, session: Session, decision_id: int, repair: RepairRequest,
                   requested_by: str) -> Job:
    """Queue the training job that repairs the blocked candidate of a decision."""
    decision = get_decision(session=session, decision_id=decision_id)
    if decision.verdict != Verdict.BLOCK:
        raise Conflict("not_blocked", f"decision {decision_id} is {decision.verdict}; only a "
                       "blocked candidate can be repaired")
    if repair.method not in METHODS:
        raise InvalidInput("unknown_method", f"unknown method {repair.method!r}; choose from "
                           f"{', '.join(METHODS)}")
    candidate = get_version(session=session, version_id=decision.candidate_id)
    baseline = get_version(session=session, version_id=decision.baseline_id)
    old = baseline if _targets_old_model(repair.method, baseline) else None
    params = {
        "decision_id": decision.id, "method": repair.method, "requested_by": requested_by,
        "options": _options(repair, has_old=old is not None),
        "config": asdict(_config(repair, candidate)), "arch": _arch(repair, candidate),
        "dataset": _training_dataset(session, repair, decision).name,
        "version": _new_version_name(session, repair, candidate),
        "old_version_id": old and old.id,
    }
    return create_job(session=session, kind=JobKind.TRAIN, params=params)


def _targets_old_model(method: str, baseline: ModelVersion) -> bool:
    """Whether training distils towards the baseline: always for methods that need an old
    model, and for ELODI when the baseline was not itself trained with ELODI (legacy term)."""
    uses = METHODS[method].old
    return uses == "required" or (uses == "optional" and training_record(baseline).get(
        "method") != method)


def _options(repair: RepairRequest, *, has_old: bool) -> dict[str, Any]:
    """The method's options as training will use them."""
    try:
        options = METHODS[repair.method].options(**repair.options)
        return asdict(resolve_options(repair.method, options, has_old=has_old))
    except (TypeError, ValueError) as error:
        raise InvalidInput("invalid_options", f"options of {repair.method!r}: {error}") from error


def _config(repair: RepairRequest, candidate: ModelVersion) -> TrainConfig:
    """The request's settings over those the candidate was trained with."""
    recorded = training_record(candidate).get("train", {})
    fields = {name: recorded[name] for name in TrainConfig.__dataclass_fields__
              if name in recorded}
    try:
        return TrainConfig(**{**fields, **repair.config.model_dump(exclude_none=True)})
    except (TypeError, ValueError) as error:
        raise InvalidInput("invalid_config", f"training settings: {error}") from error


def _arch(repair: RepairRequest, candidate: ModelVersion) -> str:
    """The architecture to retrain: the request's, else the candidate's recorded one."""
    arch = repair.arch or candidate.meta.get("arch") or training_record(candidate).get("arch")
    if not isinstance(arch, str) or not arch:
        raise InvalidInput("unknown_architecture", f"version {candidate.version} records no "
                           "architecture (metadata 'arch' or a run record); give 'arch'")
    return arch


def training_record(version: ModelVersion) -> dict[str, Any]:
    """The run record of how a version was trained (flipgate train's JSON), if known."""
    record = (version.produced_by or {}).get("record") or version.meta.get("record") or {}
    return record if isinstance(record, dict) else {}


def _training_dataset(session: Session, repair: RepairRequest, decision: Decision) -> Dataset:
    """The request's training set, else the line's."""
    name = repair.dataset
    if name is None:
        line = session.get_one(ModelLine, decision.line_id)
        if line.training_dataset_id is None:
            raise InvalidInput("no_training_dataset", f"line {line.name!r} has no training "
                               "data set: set one with PUT /models/{name}/training-dataset "
                               "or name one in the request")
        return session.get_one(Dataset, line.training_dataset_id)
    return get_dataset_of_role(session=session, name=name, role=DatasetRole.TRAIN)


def _new_version_name(session: Session, repair: RepairRequest, candidate: ModelVersion) -> str:
    """The name of the version the job will register; it must be free now."""
    name = check_name(repair.version or f"{candidate.version}-{repair.method}", "version",
                      VERSION)
    taken = session.scalar(select(ModelVersion.id).where(ModelVersion.line_id == candidate.line_id,
                                                         ModelVersion.version == name))
    if taken is not None:
        raise Conflict("version_exists", f"version {name!r} exists; name the repaired "
                       "version with 'version'")
    return name
