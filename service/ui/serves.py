"""What each job serves, for the jobs page: the line, versions, eval set or decision named in
its params, each as text and a link to its dashboard page."""

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import urls
from service.jobs.models import Job, JobKind
from service.registry.models import ModelLine, ModelVersion

VERSION_KEYS = ("version_id", "old_version_id", "new_version_id")


@dataclass(frozen=True)
class JobView:
    """A job and what it serves: (text, link) pairs, empty when its params name nothing the
    dashboard shows."""

    row: Job
    serves: list[tuple[str, str]]


def job_views(session: Session, jobs: list[Job], project: str | None) -> list[JobView]:
    """The jobs with what they serve, linked in `project` (one query for all their
    versions)."""
    ids = {job.params[key] for job in jobs for key in VERSION_KEYS if key in job.params}
    versions = {version_id: (line, version) for version_id, line, version in session.execute(
        select(ModelVersion.id, ModelLine.name, ModelVersion.version)
        .join(ModelLine, ModelLine.id == ModelVersion.line_id)
        .where(ModelVersion.id.in_(ids)))}
    return [JobView(job, served_links(job.kind, job.params, versions, project)) for job in jobs]


def served_links(kind: JobKind, params: dict[str, Any], versions: dict[int, tuple[str, str]],
                 project: str | None) -> list[tuple[str, str]]:
    """What a job of `kind` with `params` serves, linked in `project`; `versions`:
    {id: (line, version)}."""
    evalset = params.get("evalset")
    on = f" on {evalset}" if evalset else ""
    if kind == JobKind.INFERENCE and params.get("version_id") in versions:
        line, version = versions[params["version_id"]]
        return [(f"{line}:{version}{on}", urls.ui_line(line, project=project))]
    if kind == JobKind.METRICS and {params.get("old_version_id"),
                                    params.get("new_version_id")} <= versions.keys():
        (line, old), (_, new) = (versions[params[key]]
                                 for key in ("old_version_id", "new_version_id"))
        return [(f"{line}: {old} → {new}{on}", urls.ui_pair(line, old, new, evalset, project))]
    if kind == JobKind.MATRIX and params.get("line"):
        return [(f"{params['line']}: matrix{on}",
                 urls.ui_line(params["line"], evalset, project) + "#matrix")]
    if kind == JobKind.TRAIN and params.get("decision_id"):
        made = f" → {params['version']}" if params.get("version") else ""
        return [(f"{params.get('method', 'repair')} repair of decision #{params['decision_id']}"
                 f"{made}", urls.ui_decision(params["decision_id"], project))]
    return []
