"""What the dashboard's pages show, read straight from the ORM models (read-only)."""

from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.callbacks.models import Callback
from service.compare.matrix import pair_counts_among
from service.compare.models import PairCounts, PairMetrics
from service.datasets.labels import get_labels
from service.datasets.models import Dataset, DatasetLabels
from service.datasets.service import get_dataset
from service.errors import NotFound
from service.gate.decisions import get_decision, waited_jobs
from service.gate.models import Decision, GatePolicy, Promotion, Verdict
from service.jobs.models import Job, JobKind, JobState
from service.predictions.models import Prediction
from service.predictions.service import versions_with_predictions
from service.projects.models import Project
from service.registry.models import Alias, ModelLine, ModelVersion
from service.registry.service import (
    PRODUCTION,
    get_line,
    production_aliases,
    production_version_id,
)
from service.ui.serves import JobView, job_views

DECISIONS_PER_PAGE = 20
MATRIX_WINDOW = 12
FAILED_JOBS_SHOWN = 50
FINISHED_JOBS_PER_PAGE = 25
FINISHED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class LineSummary:
    """One row of the lines page."""

    name: str
    num_classes: int
    versions: int
    latest: str | None
    production: str | None
    verdict: str | None
    decision_id: int | None  # the latest decision's
    multilabel: bool = False


@dataclass(frozen=True)
class VersionView:
    """A version with its lineage: parent, aliases and the repair that produced it."""

    row: ModelVersion
    parent: str | None
    aliases: list[str]


@dataclass(frozen=True)
class Matrix:
    """NFR, PFR and churn of every (old, new) pair among `versions` on one eval set whose
    counts are stored, and the pairs that have a full report (a page of their own). On a
    traffic set NFR and PFR are None (unknown) but where every disagreement of a reported
    pair is labelled; `intervals` holds NFR's 95% interval of the reported pairs with some
    labels. On a multi-label set (`multilabel`) NFR, PFR and churn are per sample: NFR_sample,
    PFR_sample and churn_sample."""

    versions: list[str]
    cells: dict[tuple[str, str], dict[str, float | None]]
    reported: set[tuple[str, str]]
    production: str | None = None
    promoted: frozenset[tuple[str, str]] = frozenset()  # (from, to) of production's moves
    intervals: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    multilabel: bool = False

    def value(self, old: str, new: str, metric: str) -> float | None:
        rates = self.cells.get((old, new))
        return None if rates is None else rates[metric]


@dataclass(frozen=True)
class DecisionView:
    """A decision with its versions' names."""

    row: Decision
    candidate: str
    baseline: str | None


@dataclass
class LinePage:
    """Everything the page of one line shows."""

    line: ModelLine
    versions: list[VersionView]
    evalsets: list[str]
    evalset: str | None
    matrix: Matrix
    whole_matrix: bool
    policies: list[GatePolicy]
    history: list["HistoryRow"]
    promotions: list["PromotionView"]
    decisions: list[DecisionView]
    page: int
    pages: int

    @property
    def limits(self) -> dict[str, float]:
        """The current policy's fixed limits on NFR and churn ({} without a policy)."""
        rules = self.policies[0].rules if self.policies else {}
        return {metric: rules[f"max_{metric}"] for metric in ("nfr", "churn")
                if rules.get(f"max_{metric}") is not None}


def line_summaries(session: Session) -> list[LineSummary]:
    """Every line with its version count, latest and production versions, latest verdict."""
    counts = dict(session.execute(select(ModelVersion.line_id, func.count())
                                  .group_by(ModelVersion.line_id)).all())
    latest = _names_by_line(session, select(ModelVersion.line_id, func.max(ModelVersion.id))
                            .group_by(ModelVersion.line_id))
    production = _names_by_line(session, production_aliases())
    last_decisions = select(func.max(Decision.id)).group_by(Decision.line_id)
    last = {line_id: (_value(verdict), decision_id) for line_id, decision_id, verdict in
            session.execute(select(Decision.line_id, Decision.id, Decision.verdict)
                            .where(Decision.id.in_(last_decisions)))}
    return [LineSummary(line.name, line.num_classes, counts.get(line.id, 0), latest.get(line.id),
                        production.get(line.id), *last.get(line.id, (None, None)),
                        multilabel=line.multilabel)
            for line in session.scalars(select(ModelLine).order_by(ModelLine.name))]


def _names_by_line(session: Session, line_and_version_ids: Any) -> dict[int, str]:
    """{line id: version name} for the (line id, version id) rows whose version the session
    sees (its project's)."""
    line_id, version_id = line_and_version_ids.subquery().c
    return dict(session.execute(select(line_id, ModelVersion.version)
                                .join(ModelVersion, ModelVersion.id == version_id)).all())


def _value(verdict: Any) -> str | None:
    return None if verdict is None else str(verdict.value)


def line_page(session: Session, name: str, evalset: str | None, page: int,
              whole_matrix: bool = False) -> LinePage:
    """The line's versions and history, matrix on `evalset` (default: the current policy's
    first eval set, else the first measured) over the last MATRIX_WINDOW versions (or all),
    policies, promotions and one page of its decision log."""
    line = get_line(session=session, name=name)
    versions = versions_of(session, line)
    evalsets = measured_evalsets(session, line)
    line_policies = policies(session, line)
    chosen = evalset if evalset in evalsets else _default_evalset(line_policies, evalsets)
    total = session.scalar(select(func.count()).where(Decision.line_id == line.id)) or 0
    page, pages = paged(page, total, DECISIONS_PER_PAGE)
    shown = versions if whole_matrix else versions[-MATRIX_WINDOW:]
    history_evalset = _policy_evalset(line_policies) or chosen
    moves = promotions(session, line)
    production = next((view.row.version for view in versions if PRODUCTION in view.aliases),
                      None)
    shown_matrix = replace(matrix(session, [view.row for view in shown], chosen),
                           production=production,
                           promoted=frozenset((move.source, move.target) for move in moves
                                              if move.source is not None))
    return LinePage(line, versions, evalsets, chosen, shown_matrix,
                    whole_matrix or len(shown) == len(versions), line_policies,
                    history(session, versions, history_evalset), moves,
                    decisions(session, line, page), page, pages)


def _policy_evalset(line_policies: list[GatePolicy]) -> str | None:
    """The first eval set of the current policy, if it names one."""
    named = line_policies[0].rules.get("evalsets") if line_policies else None
    return named[0] if named else None


def _default_evalset(line_policies: list[GatePolicy], measured: list[str]) -> str | None:
    """The policy's eval set if the line is measured there, else the first measured."""
    preferred = _policy_evalset(line_policies)
    if preferred in measured:
        return preferred
    return measured[0] if measured else None


def projects_of_decision(unbound: Session, decision_id: int) -> list[str]:
    """The project that holds decision `decision_id` (none or one), read on a session bound
    to no project."""
    return list(unbound.scalars(select(Project.name).join(
        Decision, Decision.project_id == Project.id).where(Decision.id == decision_id)))


def projects_of_line(unbound: Session, name: str) -> list[str]:
    """The projects that hold a line named `name`, read on a session bound to no project."""
    return list(unbound.scalars(select(Project.name).join(
        ModelLine, ModelLine.project_id == Project.id).where(ModelLine.name == name)))


def paged(page: int, total: int, per_page: int) -> tuple[int, int]:
    """`page` moved into [1, pages], and the number of pages of `total` items."""
    pages = max(1, -(-total // per_page))
    return min(max(page, 1), pages), pages


def versions_of(session: Session, line: ModelLine) -> list[VersionView]:
    """The line's versions in registration order, with parents and aliases."""
    rows = list(session.scalars(select(ModelVersion).where(ModelVersion.line_id == line.id)
                                .order_by(ModelVersion.id)))
    names = {row.id: row.version for row in rows}
    aliases: dict[int, list[str]] = {}
    for alias in session.scalars(select(Alias).where(Alias.line_id == line.id)
                                 .order_by(Alias.name)):
        aliases.setdefault(alias.version_id, []).append(alias.name)
    return [VersionView(row, names.get(row.parent_id), aliases.get(row.id, [])) for row in rows]


def measured_evalsets(session: Session, line: ModelLine) -> list[str]:
    """The eval sets on which some pair of the line's versions has stored counts."""
    versions = select(ModelVersion.id).where(ModelVersion.line_id == line.id)
    statement = (select(Dataset.name).join(PairCounts, PairCounts.dataset_id == Dataset.id)
                 .where(PairCounts.first_version_id.in_(versions)).distinct()
                 .order_by(Dataset.name))
    return list(session.scalars(statement))


def matrix(session: Session, versions: list[ModelVersion], evalset: str | None) -> Matrix:
    """The pairs among `versions` on `evalset` with stored counts, over the versions that
    have logits there (service.compare.matrix: the API's matrix)."""
    if evalset is None:
        return Matrix([], {}, set())
    dataset = get_dataset(session=session, name=evalset)
    scored = versions_with_predictions(session=session, versions=versions, dataset=dataset)
    names = {version.id: version.version for version in scored}
    cells = {}
    for (first, second), row in pair_counts_among(session=session, versions=scored,
                                                  dataset=dataset).items():
        cells[names[first], names[second]] = known_rates(row, first, dataset)
        cells[names[second], names[first]] = known_rates(row, second, dataset)
    reported = session.execute(select(PairMetrics.old_version_id, PairMetrics.new_version_id)
                               .where(PairMetrics.dataset_id == dataset.id,
                                      PairMetrics.old_version_id.in_(names),
                                      PairMetrics.new_version_id.in_(names)))
    shown = Matrix([version.version for version in scored], cells,
                   {(names[old], names[new]) for old, new in reported},
                   multilabel=dataset.multilabel)
    return shown if dataset.labeled else _with_labels(session, shown, dataset, names)


def known_rates(counts: PairCounts, old_id: int, dataset: Dataset) -> dict[str, float | None]:
    """NFR, PFR and churn of the update from `old_id` that the counts know: on a traffic set
    churn only (its counts have no labels: NFR and PFR are None, never 0)."""
    rates: dict[str, float | None] = dict(counts.rates(old_id))
    if not dataset.labeled:
        rates.update(nfr=None, pfr=None)
    return rates


def _with_labels(session: Session, shown: Matrix, dataset: Dataset,
                 names: dict[int, str]) -> Matrix:
    """The traffic matrix `shown` with what the labels say of its reported pairs: NFR
    exact where every disagreement is labelled, else its 95% interval once some are."""
    cells, intervals = dict(shown.cells), {}
    for row in latest_reports(session, dataset, list(names)):
        pair, labelled = (names[row.old_version_id], names[row.new_version_id]), \
            row.report["disagreements"]
        if labelled["complete"] and pair in cells:
            cells[pair] = {**cells[pair], "nfr": row.report["nfr"], "pfr": row.report["pfr"]}
        elif labelled["labelled"]:
            intervals[pair] = tuple(labelled["nfr_interval"])
    return replace(shown, cells=cells, intervals=intervals)


def latest_reports(session: Session, dataset: Dataset, version_ids: list[int]
                   ) -> list[PairMetrics]:
    """The newest stored report (by label revision) of each pair among `version_ids` on
    `dataset`."""
    newest: dict[tuple[int, int], PairMetrics] = {}
    for row in session.scalars(select(PairMetrics).where(
            PairMetrics.dataset_id == dataset.id, PairMetrics.old_version_id.in_(version_ids),
            PairMetrics.new_version_id.in_(version_ids)).order_by(PairMetrics.label_revision)):
        newest[row.old_version_id, row.new_version_id] = row
    return list(newest.values())


@dataclass(frozen=True)
class HistoryRow:
    """One version's history: its last final decision's numbers on the history's eval set
    (error rate, NFR and churn against that decision's baseline) and its last promotion."""

    version: str
    evalset: str | None
    decision: DecisionView | None
    promotion: Promotion | None
    production: bool
    pending_id: int | None = None  # its latest decision that is not final yet, if any

    def metric(self, key: str) -> float | None:
        """`key` ("er_new", "nfr", "churn") of the decision on the eval set, if measured."""
        if self.decision is None or self.evalset is None:
            return None
        value = self.decision.row.metrics.get(self.evalset, {}).get(key)
        return value if isinstance(value, int | float) else None

    @property
    def measured(self) -> bool:
        """Whether its decision measured the history's eval set."""
        return (self.decision is not None and self.evalset is not None
                and self.evalset in self.decision.row.metrics)

    def interval(self, key: str) -> list[float] | None:
        """The 95% interval of `key` where the value is not known exactly (NFR on a
        traffic set, from its labels)."""
        if not self.measured:
            return None
        return self.decision.row.metrics[self.evalset].get(f"{key}_interval")

    @property
    def blocked(self) -> bool:
        return self.decision is not None and self.decision.row.verdict == Verdict.BLOCK


def history(session: Session, versions: list[VersionView], evalset: str | None
            ) -> list[HistoryRow]:
    """One row per version, in registration order."""
    ids = [view.row.id for view in versions]
    final = session.scalars(select(Decision).where(Decision.candidate_id.in_(ids),
                                                   Decision.verdict != Verdict.PENDING)
                            .order_by(Decision.id))
    last_decision = {view.row.candidate_id: view
                     for view in _decision_views(session, list(final))}
    pending = dict(session.execute(select(Decision.candidate_id, func.max(Decision.id)).where(
        Decision.candidate_id.in_(ids), Decision.verdict == Verdict.PENDING)
        .group_by(Decision.candidate_id)).all())
    last_promotion = {row.to_version_id: row for row in session.scalars(
        select(Promotion).where(Promotion.to_version_id.in_(ids)).order_by(Promotion.id))}
    return [HistoryRow(view.row.version, evalset, last_decision.get(view.row.id),
                       last_promotion.get(view.row.id), PRODUCTION in view.aliases,
                       pending.get(view.row.id))
            for view in versions]


@dataclass(frozen=True)
class PromotionView:
    """A move of the production alias with its versions' names."""

    row: Promotion
    source: str | None
    target: str


def promotions(session: Session, line: ModelLine) -> list[PromotionView]:
    """Every move of the line's production alias, the newest first."""
    rows = list(session.scalars(select(Promotion).where(Promotion.line_id == line.id)
                                .order_by(Promotion.id.desc())))
    ids = {row.to_version_id for row in rows} | {row.from_version_id for row in rows}
    names = dict(session.execute(select(ModelVersion.id, ModelVersion.version)
                                 .where(ModelVersion.id.in_(ids - {None}))).all())
    return [PromotionView(row, names.get(row.from_version_id), names[row.to_version_id])
            for row in rows]


def policies(session: Session, line: ModelLine) -> list[GatePolicy]:
    """The line's policy versions, the current one first."""
    return list(session.scalars(select(GatePolicy).where(GatePolicy.line_id == line.id)
                                .order_by(GatePolicy.version.desc())))


def decisions(session: Session, line: ModelLine, page: int) -> list[DecisionView]:
    """One page of the line's decisions, the newest first."""
    rows = list(session.scalars(select(Decision).where(Decision.line_id == line.id)
                                .order_by(Decision.id.desc())
                                .offset((page - 1) * DECISIONS_PER_PAGE)
                                .limit(DECISIONS_PER_PAGE)))
    return _decision_views(session, rows)


def _decision_views(session: Session, rows: list[Decision]) -> list[DecisionView]:
    """The decisions with their candidates' and baselines' names (one query)."""
    ids = {row.candidate_id for row in rows} | {row.baseline_id for row in rows}
    names = dict(session.execute(select(ModelVersion.id, ModelVersion.version)
                                 .where(ModelVersion.id.in_(ids - {None}))).all())
    return [DecisionView(row, names[row.candidate_id], names.get(row.baseline_id))
            for row in rows]


@dataclass(frozen=True)
class DecisionPage:
    """A decision, its line, the repair job that retrained it, the version it produced and the
    delivery of its status to the callback URL."""

    decision: DecisionView
    line: ModelLine
    repair_job: Job | None
    repaired: ModelVersion | None
    repaired_decision: Decision | None
    waiting_for: list[Job]
    callback: Callback | None
    production: "ProductionState"  # of the decision's candidate (a repair's: what it made)
    repaired_production: "ProductionState | None"  # of the version its repair produced

    @property
    def working(self) -> bool:
        """Whether a job the decision waits for is queued or running (its page reloads
        while one is; a decision waiting for people to label may wait for days)."""
        return any(job.state in (JobState.QUEUED, JobState.RUNNING)
                   for job in self.waiting_for)

    @property
    def made(self) -> dict[str, Any]:
        """How the repaired version was made (its produced_by), {} without one."""
        return (self.repaired.produced_by or {}) if self.repaired else {}

    @property
    def repair_choice(self) -> "RepairChoice | None":
        """The share an interpolation (alpha) or ensemble (weight) repair chose, on which
        calibration set, under which limits, and the curve it chose it on."""
        name = next((key for key in SHARES if key in self.made), None)
        if name is None:
            return None
        return RepairChoice(name, self.made[name], self.made.get("calibration"),
                            self.made.get("limits") or {}, self.made.get("curve") or [])

    @property
    def repair_details(self) -> dict[str, Any]:
        """The rest of what the repair recorded (its options, its training record)."""
        return {key: value for key, value in self.made.items()
                if key not in ("job_id", "method", "repair_of", "decision_id", "record",
                               "calibration", "limits", "curve", *SHARES)}


SHARES = ("weight", "alpha")  # the baseline's share: the ensemble's w, interpolation's α


@dataclass(frozen=True)
class ProductionState:
    """Whether a version went to production: its last promotion (None: never), and whether
    the production alias points at it now."""

    promotion: Promotion | None
    now: bool


def production_state(session: Session, version: ModelVersion) -> ProductionState:
    """Whether `version` went to production, and is there now."""
    promotion = session.scalar(select(Promotion).where(Promotion.to_version_id == version.id)
                               .order_by(Promotion.id.desc()).limit(1))
    return ProductionState(promotion, production_version_id(
        session=session, line_id=version.line_id) == version.id)


@dataclass(frozen=True)
class RepairChoice:
    """The baseline's share a repair chose, and what it chose it on."""

    name: str
    share: float
    calibration: str | None
    limits: dict[str, Any]
    curve: list[dict[str, Any]]


def decision_page(session: Session, decision_id: int) -> DecisionPage:
    """The decision `decision_id` with its repair and its callback's delivery, if any."""
    row = get_decision(session=session, decision_id=decision_id)
    line = session.get(ModelLine, row.line_id)
    repair_jobs = [job for job in session.scalars(select(Job).where(Job.kind == JobKind.TRAIN)
                                                  .order_by(Job.id.desc()))
                   if job.params.get("decision_id") == row.id]
    repaired = next((version for version in session.scalars(
        select(ModelVersion).where(ModelVersion.line_id == row.line_id))
        if (version.produced_by or {}).get("decision_id") == row.id), None)
    follow_up = session.scalar(select(Decision).where(Decision.repair_of_id == row.id)
                               .order_by(Decision.id.desc()).limit(1))
    waiting = (waited_jobs(session=session, decision=row) if row.verdict == Verdict.PENDING
               else [])
    callback = session.scalar(select(Callback).where(Callback.decision_id == row.id))
    return DecisionPage(_decision_views(session, [row])[0], line,
                        repair_jobs[0] if repair_jobs else None, repaired, follow_up, waiting,
                        callback, production_state(session, session.get(ModelVersion,
                                                                        row.candidate_id)),
                        production_state(session, repaired) if repaired else None)


@dataclass(frozen=True)
class JobsPage:
    """Open jobs (with progress), the most recent failures (with their errors) and one page
    of the finished jobs (with their outcome), each with what it serves."""

    open: list[JobView]
    failed: list[JobView]
    finished: list[JobView]
    finished_count: int
    page: int
    pages: int


def jobs_page(session: Session, project: str | None, page: int = 1) -> JobsPage:
    """Queued and running jobs, oldest first, the latest failed ones, and page `page` of
    the finished ones, the last finished first (linked in `project`)."""
    open_jobs = session.scalars(select(Job).where(
        Job.state.in_([JobState.QUEUED, JobState.RUNNING])).order_by(Job.id))
    failed = session.scalars(select(Job).where(Job.state == JobState.FAILED)
                             .order_by(Job.id.desc()).limit(FAILED_JOBS_SHOWN))
    total = session.scalar(select(func.count()).where(Job.state.in_(FINISHED))) or 0
    page, pages = paged(page, total, FINISHED_JOBS_PER_PAGE)
    finished = session.scalars(select(Job).where(Job.state.in_(FINISHED))
                               .order_by(Job.finished_at.desc().nulls_last(), Job.id.desc())
                               .offset((page - 1) * FINISHED_JOBS_PER_PAGE)
                               .limit(FINISHED_JOBS_PER_PAGE))
    return JobsPage(job_views(session, list(open_jobs), project),
                    job_views(session, list(failed), project),
                    job_views(session, list(finished), project), total, page, pages)


@dataclass(frozen=True)
class PairRows:
    """A stored pair and what the gallery needs to read its samples."""

    metrics: PairMetrics
    old: ModelVersion
    new: ModelVersion
    dataset: Dataset
    old_logits: str | None  # None: labels only
    new_logits: str | None  # None: labels only
    class_names: list[str] | None
    labels: DatasetLabels | None = None  # a traffic set's label revision the report read

    @property
    def multilabel(self) -> bool:
        """Whether the report is a multi-label pair's (flipgate.metrics.multilabel)."""
        return bool(self.metrics.report.get("multilabel"))

    @property
    def negative_flips(self) -> int:
        """The negative flips the report counts (on a traffic set: those known from its
        labels; on a multi-label set: the samples with a label turned wrong, on traffic too)."""
        report = self.metrics.report
        if not self.dataset.labeled:  # agreements flip nothing: the known flips are all
            return report["disagreements"]["negative_flips_known"]
        if self.multilabel:
            return report["per_sample"]["samples_with_negative_flips"]
        return len(report["flipped_indices"]["negative"])


def pair_rows(session: Session, line_name: str, old: str, new: str, evalset: str) -> PairRows:
    """The stored metrics of old -> new on `evalset` and the logits artifacts behind them."""
    line, versions, dataset = _pair_of(session, line_name, old, new, evalset)
    metrics = session.scalars(select(PairMetrics).where(
        PairMetrics.old_version_id == versions[old].id,
        PairMetrics.new_version_id == versions[new].id,
        PairMetrics.dataset_id == dataset.id)
        .order_by(PairMetrics.label_revision.desc()).limit(1)).one_or_none()
    logits = dict(session.execute(select(Prediction.version_id, Prediction.logits_sha256).where(
        Prediction.dataset_id == dataset.id,
        Prediction.version_id.in_([versions[old].id, versions[new].id]))).all())
    if metrics is None or len(logits) < 2:
        raise NotFound("pair_not_measured", f"{line_name}:{old} -> {new} has not been measured "
                       f"on {evalset!r} yet")
    labels = (None if dataset.labeled else
              get_labels(session=session, dataset=dataset, revision=metrics.label_revision))
    return PairRows(metrics, versions[old], versions[new], dataset, logits[versions[old].id],
                    logits[versions[new].id], line.class_names, labels)


def _pair_of(session: Session, line_name: str, old: str, new: str, evalset: str
             ) -> tuple[ModelLine, dict[str, ModelVersion], Dataset]:
    """The line, its versions `old` and `new` by name, and the eval set, or NotFound."""
    line = get_line(session=session, name=line_name)
    versions = {row.version: row for row in session.scalars(
        select(ModelVersion).where(ModelVersion.line_id == line.id,
                                   ModelVersion.version.in_([old, new])))}
    dataset = session.scalars(select(Dataset).where(Dataset.name == evalset)).one_or_none()
    if old not in versions or new not in versions or dataset is None:
        raise NotFound("pair_not_found", f"no versions {old!r} and {new!r} of {line_name!r} "
                       f"and eval set {evalset!r}")
    return line, versions, dataset


@dataclass(frozen=True)
class CountedPair:
    """A pair the matrix counted (NFR, PFR, churn over n samples) without a full report."""

    old: str
    new: str
    n: int
    rates: dict[str, float | None]  # NFR and PFR None (unknown) on a traffic set


def counted_pair(session: Session, line_name: str, old: str, new: str,
                 evalset: str) -> CountedPair:
    """The stored counts of old -> new on `evalset`, or NotFound."""
    _line, versions, dataset = _pair_of(session, line_name, old, new, evalset)
    row = pair_counts_among(session=session, versions=[versions[old], versions[new]],
                            dataset=dataset)
    if not row:
        raise NotFound("pair_not_measured", f"{line_name}:{old} -> {new} has not been measured "
                       f"on {evalset!r} yet")
    (counts,) = row.values()
    return CountedPair(old, new, counts.n, known_rates(counts, versions[old].id, dataset))
