"""Pair metrics: queueing their measurement, storing the metrics job's report, and reading
it back (a request never computes one). A line's matrix is service.compare.matrix."""

import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Select, select
from sqlalchemy.orm import Session, defer

from flipgate.formats.evalsets import load_evalset
from flipgate.metrics import PlotValues, compare_labels, measure_pair
from flipgate.metrics.multilabel import DEFAULT_THRESHOLD, compare_multilabel, decided
from flipgate.metrics.multilabel_traffic import multilabel_traffic_report
from flipgate.metrics.traffic import disagreement_order, traffic_report
from flipgate.onnx_io import InputSpec
from flipgate.progress import Progress
from flipgate.reporting.html import render_html
from flipgate.traffic import (
    class_name_list,
    disagreement_rows,
    label_set_rows,
    top_probabilities,
    write_export,
)
from service import urls
from service.compare.models import REPORT_SCALARS, PairMetrics
from service.datasets.labels import get_labels, label_revision, read_revision_labels
from service.datasets.models import Dataset, DatasetLabels
from service.datasets.service import get_dataset, read_groups, read_label_matrix, read_labels
from service.db import insert_or_conflict
from service.errors import Conflict, InvalidInput, NotFound
from service.jobs.enqueue import queue_job
from service.jobs.models import Job, JobKind
from service.jobs.service import find_open_job
from service.predictions.models import Prediction, PredictionSource
from service.predictions.service import (
    get_predictions,
    queue_missing_inference,
    read_logits,
    read_predicted_classes,
    versions_with_predictions,
)
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import (
    check_evalset_fits,
    get_version,
    qualified_name,
    resolve_reference,
)
from service.storage import ArtifactStore


@dataclass(frozen=True)
class Pair:
    """An old and a new version and the data set they are compared on (on a traffic set,
    with the label revision they are measured with: 0 before any label, and on labeled
    sets)."""

    old: ModelVersion
    new: ModelVersion
    dataset: Dataset
    label_revision: int = 0


def store_pair_metrics(*, session: Session, old: ModelVersion, new: ModelVersion,
                       dataset: Dataset, report: dict[str, Any],
                       html_sha256: str | None = None) -> PairMetrics:
    """Keep a `compare_logits` report of old → new on a data set (and the address of its HTML
    page); a stored triple is returned."""
    _check_report(old, new, dataset, report)
    revision = report.get("label_revision", 0)
    existing = find_pair_metrics(session=session, old=old, new=new, dataset=dataset,
                                 label_revision=revision)
    if existing is not None:
        return existing
    row = PairMetrics(old_version=old, new_version=new, dataset=dataset, html_sha256=html_sha256,
                      label_revision=revision, **report_columns(report))
    return insert_or_conflict(session, row, code="pair_metrics_exist", message=f"versions "
                              f"{old.id} → {new.id} on {dataset.name!r} are being stored")


def report_columns(report: dict[str, Any]) -> dict[str, Any]:
    """The columns of a pair's stored row that come from its `compare_logits` report (its
    per-sample figures, for a multi-label report; a multi-label traffic report's top-level
    keys are per sample already, and the figures it lacks are None)."""
    if report.get("multilabel") and not report.get("traffic"):
        return {"report": report, **multilabel_columns(report)}
    low, high = report["nfr_ci"] or (None, None)  # None on traffic: labels unknown
    return {"report": report, "nfr_ci_low": low, "nfr_ci_high": high,
            "export_sha256": report.get("export_sha256"),
            **{name: report.get(name) for name in REPORT_SCALARS}}


def multilabel_columns(report: dict[str, Any]) -> dict[str, Any]:
    """A multi-label report's columns: NFR, PFR and churn are its per-sample shares (NFR_sample,
    docs/metrics.md), the flips its samples with a label turned wrong (right), the error
    rates the shares of samples whose label set is wrong (1 - subset accuracy); the figures
    of single-label pairs are None."""
    per_sample, n = report["per_sample"], report["n"]
    low, high = per_sample["nfr_ci"]
    return {**dict.fromkeys(REPORT_SCALARS), "n": n, "nfr": per_sample["nfr"],
            "pfr": per_sample["pfr"], "churn": per_sample["churn"],
            "negative_flips": per_sample["samples_with_negative_flips"],
            "positive_flips": round(per_sample["pfr"] * n),
            "er_old": 1.0 - report["quality"]["old"]["subset_accuracy"],
            "er_new": 1.0 - report["quality"]["new"]["subset_accuracy"],
            "schurn": report["pooled"]["schurn"], "nfr_ci_low": low, "nfr_ci_high": high}


MULTILABEL_KEYS = ("per_sample", "pooled", "quality", "per_label")


def _check_report(old: ModelVersion, new: ModelVersion, dataset: Dataset,
                  report: dict[str, Any]) -> None:
    """Two distinct versions, and a complete report over every sample of the data set."""
    if old.id == new.id:
        raise InvalidInput("same_version", f"version {old.id} cannot be compared with itself")
    required = MULTILABEL_KEYS if report.get("multilabel") else (*REPORT_SCALARS, "nfr_ci")
    if report.get("multilabel") and report.get("traffic"):
        required = (*MULTILABEL_KEYS, "changed", "churn", "nfr_ci", "disagreements")
    missing = sorted(set(required) - report.keys())
    if missing or report["n"] != dataset.n:
        raise InvalidInput("invalid_report", f"not a compare report over the {dataset.n} "
                           f"samples of {dataset.name!r} (missing keys: {missing})")


def find_pair_metrics(*, session: Session, old: ModelVersion, new: ModelVersion,
                      dataset: Dataset, label_revision: int | None = None) -> PairMetrics | None:
    """The stored pair metrics of old → new on a data set, if any: measured with the label
    revision `label_revision`, or the newest when None (a labeled set has only 0)."""
    return session.scalars(_pair_metrics(old, new, dataset, label_revision)).one_or_none()


def find_report_parts(*, session: Session, old: ModelVersion, new: ModelVersion,
                      dataset: Dataset, keys: tuple[str, ...]
                      ) -> tuple[PairMetrics, dict[str, Any]] | None:
    """The newest stored pair metrics of old → new on a data set, if any, with only the
    `keys` of its report (None where it has none), read in the query: a report holds the
    index of every flipped sample, which the gate never reads."""
    statement = (_pair_metrics(old, new, dataset).options(defer(PairMetrics.report))
                 .add_columns(*(PairMetrics.report[key] for key in keys)))
    found = session.execute(statement).one_or_none()
    if found is None:
        return None
    row, *values = found
    return row, dict(zip(keys, values, strict=True))


def _pair_metrics(old: ModelVersion, new: ModelVersion, dataset: Dataset,
                  label_revision: int | None = None) -> Select[tuple[PairMetrics]]:
    """The statement of find_pair_metrics."""
    statement = select(PairMetrics).where(
        PairMetrics.dataset_id == dataset.id, PairMetrics.old_version_id == old.id,
        PairMetrics.new_version_id == new.id)
    if label_revision is not None:
        statement = statement.where(PairMetrics.label_revision == label_revision)
    return statement.order_by(PairMetrics.label_revision.desc()).limit(1)


def resolve_pair(*, session: Session, old: str, new: str, evalset: str) -> Pair:
    """The versions named by two references ("line:version" or "line@alias") and an eval set."""
    dataset = get_dataset(session=session, name=evalset)
    pair = Pair(old=resolve_reference(session=session, reference=old),
                new=resolve_reference(session=session, reference=new), dataset=dataset,
                label_revision=label_revision(session=session, dataset=dataset))
    if pair.old.id == pair.new.id or pair.old.num_classes != pair.new.num_classes:
        raise InvalidInput("incomparable_versions", f"{old} and {new} must be two different "
                           "versions with the same number of classes")
    for version in (pair.old, pair.new):
        check_evalset_fits(line=session.get_one(ModelLine, version.line_id), dataset=dataset)
    return pair


def stored_report(*, session: Session, pair: Pair) -> dict[str, Any] | None:
    """The pair's stored report with the keys of `flipgate compare --json`, if measured."""
    row = find_pair_metrics(session=session, old=pair.old, new=pair.new, dataset=pair.dataset)
    if row is None:
        return None
    return {**row.report, **pair_inputs(session=session, pair=pair).sources()}


def stored_html(*, session: Session, store: ArtifactStore, pair: Pair) -> bytes:
    """The HTML page that the pair's metrics job drew; NotFound `report_html_not_stored` for
    a pair measured before pages were kept (no request draws one)."""
    row = find_pair_metrics(session=session, old=pair.old, new=pair.new, dataset=pair.dataset)
    if row is None or row.html_sha256 is None:
        raise NotFound("report_html_not_stored", "this pair was measured before HTML reports "
                       "were kept; its JSON report is stored (format=json)")
    with store.open(row.html_sha256) as readable:
        return readable.read()


EXPORT_TYPES = {"json": "application/json", "csv": "text/csv; charset=utf-8",
                "label-studio": "application/json"}  # the export's media type by format


def stored_export(*, session: Session, store: ArtifactStore, pair: Pair,
                  export_format: str) -> bytes | None:
    """The disagreements' export of a pair measured on a traffic set, in `export_format`
    (None when no report is stored yet); InvalidInput `not_a_traffic_set` on a labeled set."""
    if pair.dataset.labeled:
        raise InvalidInput("not_a_traffic_set", f"{pair.dataset.name!r} has labels; the "
                           "disagreements are exported from traffic sets (sets without `y`)")
    row = find_pair_metrics(session=session, old=pair.old, new=pair.new, dataset=pair.dataset)
    if row is None:
        return None
    with store.open(row.export_sha256) as readable:
        rows = json.loads(readable.read())
    names = (qualified_name(session=session, version=pair.old),
             qualified_name(session=session, version=pair.new))
    return write_export(rows, export_format, version_names=names,
                        multilabel=pair.dataset.multilabel)


@dataclass(frozen=True)
class PairInputs:
    """The stored logits of both versions and the data set that a pair's report is computed
    from, and the versions' names; measuring needs no session (the metrics job does it
    outside any transaction)."""

    old: Prediction
    new: Prediction
    dataset: Dataset
    names: tuple[str, str]
    class_names: list[str] | None
    num_classes: int
    read_as: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    labels: DatasetLabels | None = None  # the label revision of a traffic set, if any
    thresholds: tuple[list[float] | None, list[float] | None] = (None, None)  # multi-label

    @property
    def labels_only(self) -> bool:
        """Whether a side has predicted labels but no scores (an external version's upload)."""
        return self.old.logits_sha256 is None or self.new.logits_sha256 is None

    def measure(self, store: ArtifactStore, *, chunk_rows: int | None = None,
                progress: Progress | None = None) -> tuple[dict[str, Any], str]:
        """The pair's report (with its per-group table when the eval set has groups) and the
        address of its HTML page (stored), from one pass over both logits memory-mapped
        `chunk_rows` samples at a time: memory stays a few chunks plus a few values per
        sample, whatever N is. On a traffic set, its traffic report."""
        if not self.dataset.labeled:
            measured = (self.measure_label_traffic(store) if self.dataset.multilabel
                        else self.measure_traffic(store))
            return self._store_page(store, *measured)
        if self.dataset.multilabel:
            return self._store_page(store, self.measure_labels(store, chunk_rows, progress),
                                    None)
        labels = read_labels(store=store, dataset=self.dataset, class_names=self.class_names)
        groups = read_groups(store=store, dataset=self.dataset)
        if self.labels_only:
            report, values = compare_labels(
                *(read_predicted_classes(store=store, prediction=side)
                  for side in (self.old, self.new)), labels, self.num_classes,
                groups=groups), None
        else:
            old, new = (read_logits(store=store, prediction=side) for side in (self.old, self.new))
            report, values = measure_pair(old, new, labels, chunk_size=chunk_rows,
                                          progress=progress, groups=groups)
        return self._store_page(store, report, values)

    def measure_labels(self, store: ArtifactStore, chunk_rows: int | None,
                       progress: Progress | None) -> dict[str, Any]:
        """The multi-label report (flipgate.metrics.multilabel, as `flipgate compare` gives
        it, with its per-group table when the eval set has groups) of both sides' stored
        probabilities at their versions' thresholds, or of their decisions where a side has
        only those."""
        sides, thresholds = self.label_sides(store)
        return compare_multilabel(read_label_matrix(store=store, dataset=self.dataset), *sides,
                                  thresholds=thresholds, chunk_size=chunk_rows,
                                  label_names=self.label_names, progress=progress,
                                  groups=read_groups(store=store, dataset=self.dataset))

    @property
    def label_names(self) -> list[str]:
        """A multi-label set's label names: the set's, else the line's, else the columns."""
        return class_name_list(self.num_classes, self.dataset.label_names or self.class_names)

    def label_sides(self, store: ArtifactStore) -> tuple[list[np.ndarray], tuple]:
        """Both multi-label sides as stored (probabilities, or decisions where a side has only
        those) and the thresholds of each (None for decisions)."""
        sides = [read_logits(store=store, prediction=side) if side.logits_sha256
                 else read_predicted_classes(store=store, prediction=side)
                 for side in (self.old, self.new)]
        thresholds = tuple(limit if side.logits_sha256 else None for side, limit in zip(
            (self.old, self.new), self.thresholds, strict=True))
        return sides, thresholds

    def measure_label_traffic(self, store: ArtifactStore) -> tuple[dict[str, Any], None]:
        """The multi-label traffic report (flipgate.metrics.multilabel_traffic) with the
        revision's label sets and the set's groups, and the disagreements' export rows stored
        beside it, in the order that `flipgate compare --multilabel` computes from the same
        decisions and set."""
        sides, thresholds = self.label_sides(store)
        decisions = tuple(decided(side, limit) for side, limit in zip(sides, thresholds,
                                                                         strict=True))
        evalset = load_evalset(store.local_path(self.dataset.sha256), mmap=True)
        order = disagreement_order(*decisions, self.dataset.sha256)
        report = multilabel_traffic_report(
            *sides, order=order, thresholds=thresholds, label_names=self.label_names,
            labels=read_revision_labels(store=store, labels=self.labels, n=self.dataset.n,
                                        num_labels=self.num_classes), groups=evalset.groups)
        rows = label_set_rows(order, decisions, evalset=evalset, label_names=self.label_names)
        return self._traffic_entries(store, report, rows), None

    def _traffic_entries(self, store: ArtifactStore, report: dict[str, Any],
                         rows: list[dict]) -> dict[str, Any]:
        """A traffic report with its label revision and its export's rows, stored."""
        export = store.put_stream(io.BytesIO(json.dumps(rows, allow_nan=False).encode()))
        return {**report, "label_revision": self.labels.revision if self.labels else 0,
                "export_sha256": export.sha256}

    def _store_page(self, store: ArtifactStore, report: dict[str, Any],
                    values: PlotValues | None) -> tuple[dict[str, Any], str]:
        """The report and the address of its HTML page, drawn and stored."""
        page = render_html(values, {**report, **self.sources()},
                           old_name=self.names[0], new_name=self.names[1],
                           class_names=self.class_names)
        return report, store.put_stream(io.BytesIO(page.encode())).sha256

    def measure_traffic(self, store: ArtifactStore) -> tuple[dict[str, Any], None]:
        """The traffic report (flipgate.metrics.traffic) with the revision's labels, and the
        disagreements' export rows stored beside it (`export_sha256`), in the order that
        `flipgate compare` computes from the same predictions and set."""
        predictions = tuple(read_predicted_classes(store=store, prediction=side)
                            for side in (self.old, self.new))
        logits = None if self.labels_only else tuple(
            read_logits(store=store, prediction=side) for side in (self.old, self.new))
        evalset = load_evalset(store.local_path(self.dataset.sha256), mmap=True)
        order = disagreement_order(*predictions, self.dataset.sha256)
        report = traffic_report(
            *predictions, num_classes=self.num_classes, order=order, class_names=self.class_names,
            groups=evalset.groups, scores=logits, schurn_alpha=1.0,
            labels=read_revision_labels(store=store, labels=self.labels, n=self.dataset.n))
        confidences = tuple(top_probabilities(side, order) for side in (logits or (None, None)))
        rows = disagreement_rows(order, predictions, confidences, evalset=evalset,
                                 class_names=class_name_list(self.num_classes, self.class_names))
        return self._traffic_entries(store, report, rows), None

    def sources(self) -> dict[str, dict[str, Any]]:
        """The "old" and "new" entries of the report (on a multi-label set, with each
        label's threshold: null for a side known by its decisions)."""
        return {side: {"source": name, "provider": prediction.provider or prediction.source.value,
                       **(read_as if prediction.source == PredictionSource.COMPUTED else {}),
                       **self._thresholds_of(prediction, limit)}
                for side, name, prediction, read_as, limit in zip(
                    ("old", "new"), self.names, (self.old, self.new), self.read_as,
                    self.thresholds, strict=True)}

    def _thresholds_of(self, prediction: Prediction,
                       limit: list[float] | None) -> dict[str, list[float] | None]:
        """A multi-label side's thresholds entry (nothing on other sets)."""
        if not self.dataset.multilabel:
            return {}
        scored = prediction.logits_sha256 is not None
        return {"thresholds": (limit or [DEFAULT_THRESHOLD] * self.num_classes) if scored
                else None}


def pair_inputs(*, session: Session, pair: Pair) -> PairInputs:
    """The stored predictions of the pair's versions on its data set (and the label
    revision it is measured with, on a traffic set)."""
    return PairInputs(*(get_predictions(session=session, version=version, dataset=pair.dataset)
                        for version in (pair.old, pair.new)), pair.dataset,
                      (qualified_name(session=session, version=pair.old),
                       qualified_name(session=session, version=pair.new)),
                      session.get_one(ModelLine, pair.new.line_id).class_names,
                      pair.new.num_classes, (read_as(pair.old), read_as(pair.new)),
                      get_labels(session=session, dataset=pair.dataset,
                                 revision=pair.label_revision),
                      (pair.old.thresholds, pair.new.thresholds))


def read_as(version: ModelVersion) -> dict[str, Any]:
    """Which inputs the version's model is fed, which output its inference jobs read and as
    what (nothing for versions registered before outputs were chosen)."""
    if version.scores_output is None:
        return {}
    fed = [InputSpec.from_json(spec).describe() for spec in version.inputs or ()]
    return {"inputs": fed, "output": version.scores_output, "scores": version.scores_kind}


def metrics_params(pair: Pair) -> dict[str, Any]:
    """The params of the metrics job of a pair (read back by `pair_from_params`); on a
    traffic set with labels, the label revision too."""
    revision = {"label_revision": pair.label_revision} if pair.label_revision else {}
    return {"old_version_id": pair.old.id, "new_version_id": pair.new.id,
            "evalset": pair.dataset.name, **revision}


def pair_from_params(*, session: Session, params: dict[str, Any]) -> Pair:
    """The pair a metrics job measures."""
    return Pair(old=get_version(session=session, version_id=params["old_version_id"]),
                new=get_version(session=session, version_id=params["new_version_id"]),
                dataset=get_dataset(session=session, name=params["evalset"]),
                label_revision=params.get("label_revision", 0))


def queue_measurement(*, session: Session, pair: Pair) -> list[Job]:
    """The jobs that store the pair's metrics: an inference job per version without logits
    on the data set and the metrics job that waits for them, last (the open ones when they
    are queued already); none when the metrics are stored or an external version's
    predictions are missing."""
    stored = find_pair_metrics(session=session, old=pair.old, new=pair.new, dataset=pair.dataset,
                               label_revision=pair.label_revision)
    if stored is not None or unscorable(session=session, pair=pair):
        return []
    inference = queue_missing_inference(session=session, versions=[pair.old, pair.new],
                                        dataset=pair.dataset)
    return [*inference, queue_job(session=session, kind=JobKind.METRICS,
                                  params=metrics_params(pair), waits_for=inference)]


def unscorable(*, session: Session, pair: Pair) -> list[ModelVersion]:
    """The pair's external versions without predictions on its data set: no job can compute
    them, so the pair waits for their upload."""
    present = versions_with_predictions(session=session, versions=[pair.old, pair.new],
                                        dataset=pair.dataset)
    return [version for version in (pair.old, pair.new)
            if version.external and version not in present]


def check_scorable(*, session: Session, pair: Pair) -> None:
    """Conflict `predictions_missing` when an external version of the pair has no uploaded
    predictions on its data set."""
    if missing := unscorable(session=session, pair=pair):
        names = [qualified_name(session=session, version=version) for version in missing]
        raise Conflict("predictions_missing", f"{', '.join(names)} is external (no model "
                       f"file): upload its predictions on {pair.dataset.name!r} first (POST "
                       f"{urls.predictions('{name}', '{version}')})")


def open_measurement(*, session: Session, pair: Pair) -> Job | None:
    """The queued or running metrics job of the pair, if any."""
    return find_open_job(session=session, kind=JobKind.METRICS, params=metrics_params(pair))
