"""The jobs that follow a new version: inference on the data sets its line was measured on,
and metrics against its parent and the line's production version once both logits exist."""

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.datasets.models import Dataset, DatasetRole
from service.datasets.service import get_dataset
from service.jobs.models import Job, JobKind
from service.jobs.service import queue_job, send_after_commit, waiting_for
from service.predictions.models import Prediction
from service.predictions.service import queue_missing_inference, versions_with_predictions
from service.registry.models import Alias, ModelVersion
from service.registry.service import get_version

PRODUCTION = "production"


def queue_follow_up(*, session: Session, version: ModelVersion) -> list[Job]:
    """Queue the inference and metrics jobs of a newly registered version; a metrics job
    whose inference is pending waits for it (params "after") instead of being sent."""
    baselines = _baselines(session, version)
    return [job for dataset in measured_datasets(session=session, line_id=version.line_id)
            for job in _follow_up_on(session, version, baselines, dataset)]


def _baselines(session: Session, version: ModelVersion) -> list[ModelVersion]:
    """The version's parent and its line's production version, each once, if comparable."""
    production = session.scalar(select(Alias.version_id).where(
        Alias.line_id == version.line_id, Alias.name == PRODUCTION))
    ids = [id_ for id_ in dict.fromkeys([version.parent_id, production])
           if id_ not in (None, version.id)]
    return [baseline for baseline in (get_version(session=session, version_id=id_) for id_ in ids)
            if baseline.num_classes == version.num_classes]


def measured_datasets(*, session: Session, line_id: int) -> list[Dataset]:
    """The eval sets on which some version of the line has logits."""
    measured = (select(Prediction.dataset_id)
                .join(ModelVersion, ModelVersion.id == Prediction.version_id)
                .where(ModelVersion.line_id == line_id))
    return list(session.scalars(select(Dataset).where(
        Dataset.id.in_(measured), Dataset.role == DatasetRole.EVAL).order_by(Dataset.id)))


def _follow_up_on(session: Session, version: ModelVersion, baselines: list[ModelVersion],
                  dataset: Dataset) -> list[Job]:
    """The inference jobs of the versions lacking logits on `dataset`, and a metrics job of
    each baseline → version that waits for them."""
    inference = queue_missing_inference(session=session, versions=[*baselines, version],
                                        dataset=dataset)
    return [*inference, *(queue_metrics(session=session, old=old, new=version, dataset=dataset,
                                        after=inference) for old in baselines)]


def queue_metrics(*, session: Session, old: ModelVersion, new: ModelVersion, dataset: Dataset,
                  after: list[Job]) -> Job:
    """A metrics job of old → new, sent now when `after` is empty, else waiting for it."""
    params = {"old_version_id": old.id, "new_version_id": new.id, "evalset": dataset.name}
    if after:
        params["after"] = [job.id for job in after]
    return queue_job(session=session, kind=JobKind.METRICS, params=params, send=not after)


def send_ready_metrics(*, session: Session, job: Job) -> list[Job]:
    """After `job` succeeded: the metrics jobs waiting for it whose logits all exist now,
    sent once the session commits."""
    ready = [waiting for waiting in waiting_for(session=session, job=job)
             if waiting.kind == JobKind.METRICS and _logits_exist(session, waiting)]
    for waiting in ready:
        send_after_commit(session=session, job=waiting)
    return ready


def _logits_exist(session: Session, job: Job) -> bool:
    """Whether both versions of a metrics job have logits on its eval set."""
    versions = [get_version(session=session, version_id=job.params[key])
                for key in ("old_version_id", "new_version_id")]
    dataset = get_dataset(session=session, name=job.params["evalset"])
    return len(versions_with_predictions(session=session, versions=versions,
                                         dataset=dataset)) == len(versions)
