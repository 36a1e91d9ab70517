"""The numbers a decision is checked against: the stored pair metrics of each eval set, and,
when the policy has a history limit, the candidate's breaks against earlier production
versions (read from their stored predictions)."""

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from service.artifacts import ArtifactStore
from service.compare.service import find_pair_metrics
from service.config import Settings
from service.datasets.models import Dataset
from service.datasets.service import get_dataset
from service.gate.history import history_breaks
from service.gate.models import Decision
from service.gate.rules import Policy, measured_metrics
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_version


def pair_evidence(*, session: Session, settings: Settings, policy: Policy,
                  line: ModelLine, baseline: ModelVersion, candidate: ModelVersion,
                  datasets: list[Dataset], before: datetime | None = None,
                  ) -> dict[str, dict[str, Any]] | None:
    """The policy's numbers per eval set; None while a pair's metrics are not stored.
    `settings` locate the artifact store for a history limit;
    `before`: the production history as it was then (for replaying a past decision)."""
    rows = [find_pair_metrics(session=session, old=baseline, new=candidate, dataset=dataset)
            for dataset in datasets]
    if not all(rows):
        return None
    history = policy.max_nfr_vs_history
    store = ArtifactStore.from_settings(settings) if history else None
    return {dataset.name: measured_metrics(row, policy, history and history_breaks(
                session=session, store=store, line=line, candidate=candidate, dataset=dataset,
                limit=history, before=before), class_names=line.class_names)
            for dataset, row in zip(datasets, rows, strict=True)}


def decision_evidence(*, session: Session, settings: Settings, decision: Decision,
                      policy: Policy, before: datetime | None = None,
                      ) -> dict[str, dict[str, Any]] | None:
    """`pair_evidence` for the pair and eval sets of a stored decision."""
    return pair_evidence(
        session=session, settings=settings, policy=policy,
        line=session.get_one(ModelLine, decision.line_id),
        baseline=get_version(session=session, version_id=decision.baseline_id),
        candidate=get_version(session=session, version_id=decision.candidate_id),
        datasets=[get_dataset(session=session, name=name) for name in decision.evalsets],
        before=before)
