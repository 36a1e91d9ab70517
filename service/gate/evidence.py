"""The numbers a decision is checked against: the stored pair metrics of each eval set, and,
when the policy has a history limit, the candidate's breaks against earlier production
versions (read from their stored predictions)."""

import functools
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from service.compare.models import PairMetrics
from service.compare.service import find_report_parts
from service.config import Settings
from service.datasets.models import Dataset
from service.datasets.service import get_dataset
from service.gate.history import HistoryInputs, history_inputs
from service.gate.models import Decision
from service.gate.rules import LABEL_COST_KEYS, MEASURED_REPORT_KEYS, Policy, measured_metrics
from service.gate.traffic import TRAFFIC_REPORT_KEYS, traffic_metrics
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_version
from service.storage import ArtifactStore, open_store

HistoryRead = dict[tuple[int, ...], dict[str, Any]]  # HistoryInputs.key -> its breaks


def pair_evidence(*, session: Session, settings: Settings, policy: Policy,
                  line: ModelLine, baseline: ModelVersion, candidate: ModelVersion,
                  datasets: list[Dataset], before: datetime | None = None,
                  known: HistoryRead | None = None) -> dict[str, dict[str, Any]] | None:
    """The policy's numbers per eval set; None while a pair's metrics are not stored.
    `settings` locate the artifact store for a history limit (opened only when it is read),
    whose breaks are read from it unless `known` (read_history of history_plan, before the
    transaction) holds them;
    `before`: the production history as it was then (for replaying a past decision)."""
    rows = _rows(session, baseline, candidate, datasets, _report_keys(policy, line))
    if not all(rows):
        return None
    limit, store = policy.max_nfr_vs_history, functools.cache(lambda: open_store(settings))

    def history(dataset: Dataset) -> dict[str, Any] | None:
        if not limit:
            return None
        inputs = history_inputs(session=session, line=line, candidate=candidate,
                                dataset=dataset, limit=limit, before=before)
        return (known or {}).get(inputs.key) or inputs.breaks(store())

    return {dataset.name: measured_metrics(row, report, policy, history(dataset),
                                           class_names=line.class_names)
            if dataset.labeled else traffic_metrics(row, report)
            for dataset, (row, report) in zip(datasets, rows, strict=True)}


def history_plan(*, session: Session, policy: Policy, line: ModelLine, baseline: ModelVersion,
                 candidate: ModelVersion, datasets: list[Dataset]) -> list[HistoryInputs]:
    """What `pair_evidence` would read from disk for the policy's history limit: nothing
    without one, or while a pair's metrics are not stored (and nothing for traffic sets,
    where the limit does not apply)."""
    limit = policy.max_nfr_vs_history
    if not limit or not all(_rows(session, baseline, candidate, datasets)):
        return []
    return [history_inputs(session=session, line=line, candidate=candidate, dataset=dataset,
                           limit=limit) for dataset in datasets if dataset.labeled]


def read_history(store: ArtifactStore, plan: list[HistoryInputs]) -> HistoryRead:
    """The breaks of each planned history, read from the stored arrays (no database)."""
    return {inputs.key: inputs.breaks(store) for inputs in plan}


REPORT_KEYS = MEASURED_REPORT_KEYS + TRAFFIC_REPORT_KEYS


def _report_keys(policy: Policy, line: ModelLine) -> tuple[str, ...]:
    """The parts of a report the policy reads: REPORT_KEYS, and each label's flipped and
    fixed samples when a multi-label line's policy weighs costs (only then: they grow with
    the flips)."""
    return REPORT_KEYS + (LABEL_COST_KEYS if line.multilabel and policy.weighs_costs else ())


def _rows(session: Session, baseline: ModelVersion, candidate: ModelVersion,
          datasets: list[Dataset], keys: tuple[str, ...] = REPORT_KEYS,
          ) -> list[tuple[PairMetrics, dict[str, Any]] | None]:
    """Each data set's stored pair metrics, with the `keys` of its report."""
    return [find_report_parts(session=session, old=baseline, new=candidate, dataset=dataset,
                              keys=keys) for dataset in datasets]


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
