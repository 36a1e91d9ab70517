"""One comparison of two model files on an eval-set file, end to end (what `flipgate compare`
and the demo run): both models scored, the pair or traffic report as a JSON-ready dict, and
the files asked for (the HTML page; on a traffic set the disagreements' export and the
labelling configuration) as bytes for the caller to write."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from flipgate.compare import (
    LabelsAnalysis,
    ReadAs,
    Scores,
    TrafficAnalysis,
    analyse,
    analyse_traffic,
    score,
    traffic_classes,
)
from flipgate.errors import InputError
from flipgate.formats.evalsets import EvalSet, load_evalset
from flipgate.formats.files import file_sha256
from flipgate.inference import DEFAULT_BATCH_SIZE
from flipgate.progress import ProgressFactory

if TYPE_CHECKING:
    import numpy as np

    from flipgate.compare_multilabel import LabelScores
    from flipgate.metrics.report import PairAnalysis


@dataclass(frozen=True)
class TrafficOutputs:
    """What a comparison on a traffic set does beyond the report: the labels file it reads,
    the disagreements' export (a file and its format) and the labelling configuration it
    writes."""

    labels: Path | None = None
    disagreements: Path | None = None
    export_format: str = "json"
    label_config: Path | None = None
    multilabel: bool = False  # the set is traffic of multi-label models

    @property
    def asked(self) -> bool:
        """Whether any of them is asked for (they apply to traffic sets only)."""
        return bool(self.labels or self.disagreements or self.label_config or self.multilabel)

    def analyse(self, scored: list[Scores], evalset_path: Path) -> TrafficAnalysis:
        """The traffic comparison, with the labels of `labels` when given."""
        labels = None if self.labels is None else self.read_labels(scored)
        return analyse_traffic(*scored, set_sha256=file_sha256(evalset_path), labels=labels)

    def read_labels(self, scored: list[Scores]) -> "np.ndarray":
        """The labels file's labels as an (N,) array, UNLABELLED where none is given."""
        import numpy as np

        from flipgate.metrics.traffic import UNLABELLED
        from flipgate.traffic import class_name_list, merge_labels, read_labels_file

        evalset = scored[0].evalset
        num_classes = traffic_classes(*scored, [side.predicted() for side in scored])
        index, columns = read_labels_file(self.labels, evalset=evalset, num_classes=num_classes,
                                          class_names=class_name_list(num_classes,
                                                                      evalset.classes))
        return merge_labels(np.full(evalset.n, UNLABELLED, np.int64), index, columns)[0]

    def files(self, analysis: TrafficAnalysis, scored: list[Scores],
              names: tuple[str, str]) -> dict[Path, bytes]:
        """The disagreements' export and the labelling configuration, when asked for."""
        from flipgate.traffic import (
            class_name_list,
            disagreement_rows,
            label_studio_config,
            top_probabilities,
            write_export,
        )

        evalset = scored[0].evalset
        classes = class_name_list(analysis.report["num_classes"], evalset.classes)
        files = {}
        if self.disagreements:
            confidences = tuple(top_probabilities(side.logits, analysis.order) for side in scored)
            rows = disagreement_rows(analysis.order, analysis.predictions, confidences,
                                     evalset=evalset, class_names=classes)
            files[self.disagreements] = write_export(rows, self.export_format,
                                                     version_names=names)
        if self.label_config:
            files[self.label_config] = label_studio_config(classes, evalset).encode()
        return files


    def label_sets(self, evalset: EvalSet, label_names: list[str]) -> "np.ndarray":
        """The labels file's label sets as a 0/1 matrix (N, L), whole rows UNLABELLED where
        none is given (all of them without a file)."""
        from flipgate.metrics.multilabel_traffic import unlabelled_label_sets
        from flipgate.traffic import merge_labels, read_labels_file

        known = unlabelled_label_sets(evalset.n, len(label_names))
        if self.labels is None:
            return known
        index, matrix = read_labels_file(self.labels, evalset=evalset, multilabel=True,
                                         class_names=label_names, num_classes=len(label_names))
        return merge_labels(known, index, matrix)[0]

    def label_set_files(self, evalset: EvalSet, order: "np.ndarray",
                        decisions: "tuple[np.ndarray, np.ndarray]", label_names: list[str],
                        names: tuple[str, str]) -> dict[Path, bytes]:
        """A multi-label pair's disagreements' export and its multiple-choice labelling
        configuration, when asked for."""
        from flipgate.traffic import label_set_rows, label_studio_config, write_export

        files = {}
        if self.disagreements:
            rows = label_set_rows(order, decisions, evalset=evalset, label_names=label_names)
            files[self.disagreements] = write_export(rows, self.export_format,
                                                     version_names=names, multilabel=True)
        if self.label_config:
            files[self.label_config] = label_studio_config(label_names, evalset,
                                                           multiple=True).encode()
        return files


@dataclass(frozen=True)
class Comparison:
    """A comparison's report (JSON-ready) and the files it made, by path, in order."""

    report: dict
    files: dict[Path, bytes] = field(default_factory=dict)


def compare_files(
    old: Path, new: Path, evalset_path: Path, *, html: Path | None = None,
    batch_size: int | None = None, device: str = "auto", gallery: bool = True,
    reads: tuple[ReadAs, ReadAs] | None = None, traffic: TrafficOutputs = TrafficOutputs(),
    progress: ProgressFactory | None = None,
) -> Comparison:
    """Score both models (each read as `reads` says, default as the graph tells, in batches
    of `batch_size`, default DEFAULT_BATCH_SIZE; one `progress` callback each) and compare
    them: the report, and the HTML page for `html` (with the flip gallery unless `gallery`
    is false); on a traffic set, the traffic report and what `traffic` asks for."""
    evalset = load_evalset(evalset_path, mmap=True, multilabel=True)
    reads = reads or (ReadAs(), ReadAs())
    if evalset.labeled and traffic.asked:
        raise InputError("not_traffic", f"{evalset_path}: --labels, --disagreements, "
                         "--label-config and --multilabel apply to traffic sets (eval sets "
                         "without `y`; a labeled set's kind is its y's)")
    if evalset.multilabel or traffic.multilabel:
        scored = _score_labels((old, new), evalset, reads,
                               batch_size=batch_size or DEFAULT_BATCH_SIZE, device=device,
                               progress=progress)
        if traffic.multilabel:
            return _label_traffic(scored, evalset, evalset_path, traffic, html)
        return _compare_multilabel(scored, evalset, html=html, gallery=gallery)
    if any(read.thresholds for read in reads):
        raise InputError("thresholds_need_multilabel", f"{evalset_path}: thresholds apply to "
                         "multi-label eval sets (y of shape (N, L)); this one has one label "
                         "per sample")
    scored = _score_both((old, new), evalset, reads,
                         batch_size=batch_size or DEFAULT_BATCH_SIZE, device=device,
                         progress=progress)
    analysis = analyse(*scored) if evalset.labeled else traffic.analyse(scored, evalset_path)
    classes = scored[0].evalset.classes or scored[1].evalset.classes
    report = {**analysis.to_dict(), "class_names": list(classes) if classes else None,
              "old": scored[0].describe(), "new": scored[1].describe()}
    names = (str(old), str(new))
    files = {} if evalset.labeled else traffic.files(analysis, scored, names)
    if html:
        files[html] = _html_page(analysis, report, evalset, names, gallery=gallery).encode()
    return Comparison(report, files)


def _score_both(sources: tuple[Path, Path], evalset: EvalSet, reads: tuple[ReadAs, ReadAs], *,
                batch_size: int, device: str, progress: ProgressFactory | None) -> list[Scores]:
    """Both models' scores on the eval set, a progress callback each."""
    return [score(source, evalset, batch_size=batch_size, device=device, read=read,
                  progress=progress(f"scoring {source.name}") if progress else None)
            for source, read in zip(sources, reads, strict=True)]


def _score_labels(sources: tuple[Path, Path], evalset: EvalSet, reads: tuple[ReadAs, ReadAs],
                  *, batch_size: int, device: str,
                  progress: ProgressFactory | None) -> "list[LabelScores]":
    """Both multi-label models' scores on the eval set, a progress callback each; on a
    traffic set, of one label count."""
    from flipgate.compare_multilabel import score_labels

    scored = [score_labels(source, evalset, read=read, batch_size=batch_size, device=device,
                           progress=progress(f"scoring {source.name}") if progress else None)
              for source, read in zip(sources, reads, strict=True)]
    shapes = [side.side().shape for side in scored]
    if shapes[0] != shapes[1]:
        raise InputError("label_count_mismatch", f"{sources[0]} scores {shapes[0][1]} labels, "
                         f"{sources[1]} {shapes[1][1]}")
    return scored


def _compare_multilabel(scored: "list[LabelScores]", evalset: EvalSet, *, html: Path | None,
                        gallery: bool) -> Comparison:
    """`compare_files` on a multi-label eval set: its report and its HTML page."""
    from flipgate.compare_multilabel import analyse_multilabel

    analysis = analyse_multilabel(*scored, evalset)
    if not html:
        return Comparison(analysis.report)
    from flipgate.reporting.html import multilabel_gallery, render_html

    flips = multilabel_gallery(analysis, evalset) if gallery else ""
    page = render_html(None, analysis.report, old_name=str(scored[0].source),
                       new_name=str(scored[1].source), gallery=flips)
    return Comparison(analysis.report, {html: page.encode()})


def _label_traffic(scored: "list[LabelScores]", evalset: EvalSet, evalset_path: Path,
                   traffic: TrafficOutputs, html: Path | None) -> Comparison:
    """`compare_files` on the traffic of multi-label models: the multi-label traffic report,
    with the labels file's label sets, the files `traffic` asks for and the HTML page."""
    from flipgate.metrics.multilabel import decided
    from flipgate.metrics.multilabel_traffic import multilabel_traffic_report
    from flipgate.metrics.traffic import disagreement_order
    from flipgate.reporting.html import render_html
    from flipgate.traffic import class_name_list

    num_labels = scored[0].side().shape[1]
    label_names = class_name_list(num_labels, evalset.classes)
    decisions = tuple(decided(side.side(), side.thresholds) for side in scored)
    order = disagreement_order(*decisions, file_sha256(evalset_path))
    report = multilabel_traffic_report(
        *(side.side() for side in scored), order=order, label_names=label_names,
        thresholds=tuple(side.thresholds for side in scored),
        labels=traffic.label_sets(evalset, label_names), groups=evalset.groups)
    report["old"], report["new"] = (side.describe(num_labels) for side in scored)
    names = (str(scored[0].source), str(scored[1].source))
    files = traffic.label_set_files(evalset, order, decisions, label_names, names)
    if html:
        files[html] = render_html(None, report, old_name=names[0], new_name=names[1]).encode()
    return Comparison(report, files)


def _html_page(analysis: "PairAnalysis | LabelsAnalysis | TrafficAnalysis", report: dict,
               evalset: EvalSet, names: tuple[str, str], *, gallery: bool) -> str:
    """The comparison's HTML page, with its flip gallery when asked and there are values."""
    from flipgate.reporting.html import flip_gallery, render_html

    flips = flip_gallery(analysis, evalset, class_names=report["class_names"]) \
        if gallery and analysis.values else ""
    return render_html(analysis.values, report, old_name=names[0], new_name=names[1],
                       gallery=flips, class_names=report["class_names"])
