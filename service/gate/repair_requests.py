"""Repairing a blocked candidate: a job that retrains its architecture on the line's training
data with a flip-reducing method, or (interpolate, ensemble) mixes it with the baseline on
their ONNX files with the baseline's share chosen on a calibration eval set; either way it
registers the result and gates it again. On a multi-label line the data sets must be
multi-label and the method one that applies to per-label logits (docs/methods.md).

Everything the job needs is checked and resolved here, when it is requested, so that a bad
request is refused at once instead of failing in the worker.
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

import flipgate.errors
from flipgate.repair import Limits, same_structure
from flipgate.repair.search import DEFAULT_LIMITS
from flipgate.train.config import TrainConfig, is_custom_architecture
from flipgate.train.methods import METHODS, resolve_options
from service.config import Settings
from service.datasets.models import Dataset, DatasetRole
from service.datasets.service import get_dataset_of_role
from service.errors import Conflict, InvalidInput, describe_problems, library_input
from service.gate.decisions import get_decision
from service.gate.models import Decision, Verdict
from service.gate.policies import current_policy
from service.gate.rules import DEFAULT_POLICY, Policy
from service.gate.schemas import ONNX_REPAIR_OPTIONS, RepairRequest
from service.jobs.enqueue import create_job
from service.jobs.models import Job, JobKind
from service.names import VERSION, check_name
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_version, qualified_name
from service.storage import ArtifactStore

if TYPE_CHECKING:
    import torch

ONNX_REPAIRS = tuple(ONNX_REPAIR_OPTIONS)
TRAINING_FIELDS = ("config", "arch", "dataset")
CALIBRATION_FIELDS = ("calibration", "max_nfr", "max_er_increase")
STRUCTURE_CHECK_MAX_BYTES = 64 * 2**20  # larger pairs are compared by the job, not the request


def request_repair(*, session: Session, settings: Settings, store: ArtifactStore,
                   decision_id: int, repair: RepairRequest, requested_by: str) -> Job:
    """Queue the job that repairs the blocked candidate of a decision."""
    decision = get_decision(session=session, decision_id=decision_id)
    if decision.verdict != Verdict.BLOCK:
        raise Conflict("not_blocked", f"decision {decision_id} is {decision.verdict}; only a "
                       "blocked candidate can be repaired")
    _refuse_external(session, decision)
    if repair.method in ONNX_REPAIRS:
        params = _onnx_repair_params(session, store, decision, repair)
    elif repair.method in METHODS:
        params = _training_params(session, settings, decision, repair)
    else:
        raise InvalidInput("unknown_method", f"unknown method {repair.method!r}; choose from "
                           f"{', '.join([*METHODS, *ONNX_REPAIRS])}")
    candidate = get_version(session=session, version_id=decision.candidate_id)
    params.update(decision_id=decision.id, method=repair.method, requested_by=requested_by,
                  version=_new_version_name(session, repair, candidate))
    return create_job(session=session, kind=JobKind.TRAIN, params=params)


def _refuse_external(session: Session, decision: Decision) -> None:
    """Every repair needs the weights of the candidate (and the ONNX ones the baseline's)."""
    for version_id in (decision.baseline_id, decision.candidate_id):
        version = get_version(session=session, version_id=version_id)
        if version.external:
            raise InvalidInput("external_version", f"version {version.version} is external "
                               "(registered without a model file): it cannot be retrained, "
                               "interpolated or ensembled; register a repaired version yourself")


def _training_params(session: Session, settings: Settings, decision: Decision,
                     repair: RepairRequest) -> dict[str, Any]:
    """What a retraining job needs: options, settings, architecture, data, the old model."""
    _refuse_fields(repair, CALIBRATION_FIELDS)
    candidate = get_version(session=session, version_id=decision.candidate_id)
    baseline = get_version(session=session, version_id=decision.baseline_id)
    old = baseline if _targets_old_model(repair.method, baseline) else None
    line = session.get_one(ModelLine, decision.line_id)
    options = _options(repair, has_old=old is not None, multilabel=line.multilabel)
    arch = _arch(repair, candidate, settings)
    dataset = _training_dataset(session, repair, line)
    if not is_custom_architecture(arch):  # the operator's own factories are not sized
        _check_repair_size(settings, repair.method, options, arch, candidate, dataset,
                           has_old=bool(old))
    return {"options": asdict(options), "config": asdict(_config(repair, candidate)),
            "arch": arch, "dataset": dataset.name, "old_version_id": old and old.id}


TRAINING_BYTES_PER_PARAMETER = 16  # float32 weights, gradients and Adam's two moments


def _check_repair_size(settings: Settings, method: str, options: Any, arch: str,
                       candidate: ModelVersion, dataset: Dataset, *, has_old: bool) -> None:
    """422 `repair_too_large` when the models training holds at once (each replica, the old
    model) and the training set, as float32, would take more than FLIPGATE_MAX_REPAIR_MB."""
    model = _meta_model(arch, candidate)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    models = METHODS[method].models(options) + has_old
    samples = dataset.n * math.prod(dataset.sample_shape) * 4
    needed = models * parameters * TRAINING_BYTES_PER_PARAMETER + samples
    limit = settings.max_repair_mb * 2**20
    if needed > limit:
        raise InvalidInput("repair_too_large", f"the repair would need about "
                           f"{needed / 2**30:.1f} GiB ({models} models of {parameters:,} "
                           f"parameters and {samples / 2**30:.2f} GiB of training data), over "
                           f"FLIPGATE_MAX_REPAIR_MB ({limit / 2**30:.1f} GiB); use fewer "
                           "members or a smaller architecture")


def _onnx_repair_params(session: Session, store: ArtifactStore, decision: Decision,
                        repair: RepairRequest) -> dict[str, Any]:
    """What a repair on the ONNX files needs: its options, calibration set and limits."""
    _refuse_fields(repair, TRAINING_FIELDS)
    try:
        options = ONNX_REPAIR_OPTIONS[repair.method].model_validate(repair.options)
    except ValidationError as error:
        raise InvalidInput("invalid_options", f"options of {repair.method!r}: "
                           f"{describe_problems(error.errors())}") from error
    policy = _current_rules(session, decision)
    candidate = get_version(session=session, version_id=decision.candidate_id)
    calibration = _calibration_set(session, decision, policy, repair.calibration, candidate)
    if repair.method == "interpolate":
        _check_interpolable(session, store, decision)
    return {"options": options.model_dump(), "calibration": calibration.name,
            "limits": asdict(_limits(repair, policy))}


def _refuse_fields(repair: RepairRequest, fields: tuple[str, ...]) -> None:
    """422 when the request sets a field that the method does not use."""
    given = [name for name in fields if name in repair.model_fields_set]
    if given:
        raise InvalidInput("not_applicable", f"{', '.join(given)}: not used by method "
                           f"{repair.method!r}")


def _current_rules(session: Session, decision: Decision) -> Policy:
    """The line's policy now: the one the repaired version will be gated by."""
    row = current_policy(session=session, line=session.get_one(ModelLine, decision.line_id))
    return DEFAULT_POLICY if row is None else Policy.model_validate(row.rules)


def _calibration_set(session: Session, decision: Decision, policy: Policy, name: str | None,
                     candidate: ModelVersion) -> Dataset:
    """The calibration eval set: none the gate decides the candidate on (by name or content:
    tuning on the gate's own data would game it), and one the line's models can score."""
    if name is None:
        raise InvalidInput("calibration_required", "name the eval set to choose the "
                           "baseline's share on in 'calibration'")
    dataset = get_dataset_of_role(session=session, name=name, role=DatasetRole.EVAL)
    if not dataset.labeled:
        raise InvalidInput("calibration_needs_labels", f"{name!r} is a traffic set (no "
                           "labels); calibrate on a labeled eval set")
    gated = session.scalars(select(Dataset).where(
        Dataset.name.in_([*decision.evalsets, *policy.evalsets]),
        (Dataset.name == name) | (Dataset.sha256 == dataset.sha256))).first()
    if gated is not None:
        raise InvalidInput("calibration_is_gated", f"eval set {name!r} "
                           f"{'is' if gated.name == name else 'holds the same data as'} "
                           f"{gated.name!r}, which the gate decides on; calibrate on other data")
    _check_kind(dataset, session.get_one(ModelLine, decision.line_id), "calibration_mismatch")
    _check_scorable(dataset, candidate)
    return dataset


def _check_scorable(dataset: Dataset, version: ModelVersion) -> None:
    """422 unless the data set's samples fit the version's input and its labels its classes."""
    expected = version.input_shape[1:]
    fits = len(expected) == len(dataset.sample_shape) and all(
        size is None or size == actual for size, actual in zip(expected, dataset.sample_shape,
                                                               strict=True))
    if not fits or dataset.num_classes > version.num_classes:
        raise InvalidInput("calibration_mismatch", f"eval set {dataset.name!r} holds samples "
                           f"shaped {dataset.sample_shape} with {dataset.num_classes} classes; "
                           f"the line's models take {expected} and have {version.num_classes}")


def _limits(repair: RepairRequest, policy: Policy) -> Limits:
    """The request's limits, else the policy's bounds on NFR and on the error rate's change,
    else the library's defaults (NFR 0.01, no error increase)."""
    max_nfr = next(value for value in (repair.max_nfr, policy.max_nfr, DEFAULT_LIMITS.max_nfr)
                   if value is not None)
    if repair.max_er_increase is not None:
        return Limits(max_nfr=max_nfr, max_er_increase=repair.max_er_increase)
    bounds = [policy.max_er_increase,
              None if policy.min_er_decrease is None else -policy.min_er_decrease]
    return Limits(max_nfr=max_nfr, max_er_increase=min(
        (bound for bound in bounds if bound is not None), default=DEFAULT_LIMITS.max_er_increase))


def _check_interpolable(session: Session, store: ArtifactStore, decision: Decision) -> None:
    """422 structure_mismatch when the pair's graphs differ (checked here only while both
    files are small; the job checks the others)."""
    pair = pair_artifacts(session=session, store=store, decision=decision)
    if sum(path.stat().st_size for path, _ in pair) <= STRUCTURE_CHECK_MAX_BYTES:
        with artifacts_named(pair):
            same_structure(*(path for path, _ in pair))


def pair_artifacts(*, session: Session, store: ArtifactStore,
                   decision: Decision) -> list[tuple[Path, str]]:
    """The stored ONNX files of the decision's baseline and candidate, with their names."""
    versions = (get_version(session=session, version_id=decision.baseline_id),
                get_version(session=session, version_id=decision.candidate_id))
    return [(store.model_path(version.artifact_sha256),
             qualified_name(session=session, version=version)) for version in versions]


@contextmanager
def artifacts_named(pair: list[tuple[Path, str]]) -> Iterator[None]:
    """The library's InputError as InvalidInput, with stored files called by their versions."""
    try:
        yield
    except flipgate.errors.InputError as error:
        message = error.message
        for path, name in pair:
            message = message.replace(str(path), name)
        raise InvalidInput(error.code, message) from error


def _targets_old_model(method: str, baseline: ModelVersion) -> bool:
    """Whether training distils towards the baseline: always for methods that need an old
    model, and for ELODI when the baseline was not itself trained with ELODI (legacy term)."""
    uses = METHODS[method].old
    return uses == "required" or (uses == "optional" and training_record(baseline).get(
        "method") != method)


def _options(repair: RepairRequest, *, has_old: bool, multilabel: bool) -> Any:
    """The method's options as training will use them (422 `method_not_multilabel` for a
    method that does not apply to a multi-label line's per-label logits)."""
    try:
        options = METHODS[repair.method].options(**repair.options)
        with library_input():
            return resolve_options(repair.method, options, has_old=has_old,
                                   multilabel=multilabel)
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


def _arch(repair: RepairRequest, candidate: ModelVersion, settings: Settings) -> str:
    """The architecture to retrain: the request's, else the candidate's recorded one."""
    arch = repair.arch or candidate.meta.get("arch") or training_record(candidate).get("arch")
    if not isinstance(arch, str) or not arch:
        raise InvalidInput("unknown_architecture", f"version {candidate.version} records no "
                           "architecture (metadata 'arch' or a run record); give 'arch'")
    if not is_custom_architecture(allowed_architecture(arch, settings)):
        _check_zoo_architecture(arch, candidate)
    return arch


def _check_zoo_architecture(arch: str, candidate: ModelVersion) -> None:
    """Build the zoo model on torch's meta device (no memory): its options parse, lie within
    the zoo's bounds and fit the candidate's samples and classes."""
    try:
        _meta_model(arch, candidate)
    except ValueError as error:
        raise InvalidInput("invalid_architecture", f"architecture {arch!r}: {error}") from error


def _meta_model(arch: str, candidate: ModelVersion) -> "torch.nn.Module":
    """The zoo model of `arch` for the candidate's samples and classes, on torch's meta device
    (no memory). torch is imported here, by the first repair request, not when the server
    starts (a second of every start)."""
    import torch

    from flipgate.train.zoo import build_model

    with torch.device("meta"):
        return build_model(arch, tuple(candidate.input_shape[1:]), candidate.num_classes)


def allowed_architecture(arch: str, settings: Settings) -> str:
    """`arch` if it names a zoo architecture, or a custom factory (package.module:function)
    that FLIPGATE_CUSTOM_ARCHITECTURES lists; nothing a request names is imported otherwise."""
    if is_custom_architecture(arch) and arch not in settings.custom_architectures:
        raise InvalidInput("architecture_not_allowed", f"architecture {arch!r} is a custom "
                           "factory the server does not allow; use a zoo architecture (mlp, "
                           "cnn, resnet) or ask the operator to list it in "
                           "FLIPGATE_CUSTOM_ARCHITECTURES")
    return arch


def training_record(version: ModelVersion) -> dict[str, Any]:
    """The run record of how a version was trained (flipgate train's JSON), if known."""
    record = (version.produced_by or {}).get("record") or version.meta.get("record") or {}
    return record if isinstance(record, dict) else {}


def _training_dataset(session: Session, repair: RepairRequest, line: ModelLine) -> Dataset:
    """The request's training set, else the line's; of the line's kind (and, multi-label,
    of its label count)."""
    name = repair.dataset
    if name is None:
        if line.training_dataset_id is None:
            raise InvalidInput("no_training_dataset", f"line {line.name!r} has no training "
                               "data set: set one with PUT /models/{name}/training-dataset "
                               "or name one in the request")
        dataset = session.get_one(Dataset, line.training_dataset_id)
    else:
        dataset = get_dataset_of_role(session=session, name=name, role=DatasetRole.TRAIN)
    _check_kind(dataset, line, "training_set_mismatch")
    return dataset


def _check_kind(dataset: Dataset, line: ModelLine, code: str) -> None:
    """422 `code` unless the data set is of the line's kind, with its L for a multi-label
    line."""
    kinds = [_kind(dataset.multilabel, dataset.num_classes), _kind(line.multilabel,
                                                                   line.num_classes)]
    if kinds[0] != kinds[1]:
        raise InvalidInput(code, f"data set {dataset.name!r} is {kinds[0]}; line "
                           f"{line.name!r} is {kinds[1]}")


def _kind(multilabel: bool, count: int | None) -> str:
    return f"multi-label of {count} labels" if multilabel else "single-label"


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
