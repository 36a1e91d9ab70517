"""One self-contained HTML page for an old/new comparison: numbers, tables and inline SVG plots.

The page loads nothing: CSS is inline and the plots are SVG drawn by flipgate.reporting.charts
(text in the page's font), so it opens offline and can be attached to a CI run as one file.
"""

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from flipgate.formats.evalsets import EvalSet
from flipgate.metrics.report import PairAnalysis, PlotValues
from flipgate.reporting.charts import (
    BarRow,
    DensityPanel,
    Sample,
    Segment,
    Series,
    Swatch,
    density_panels,
    grouped_bars,
    stacked_bars,
)
from flipgate.reporting.gallery import (
    GALLERY_CSS,
    FlipSample,
    SampleView,
    gallery_from_arrays,
    gallery_html,
)
from flipgate.reporting.multilabel import (
    LABEL_HEADER,
    MULTILABEL_GROUP_HEADER,
    label_row,
    multilabel_group_row,
    multilabel_headline_rows,
    multilabel_hints,
    worst_labels_first,
)
from flipgate.reporting.rows import (
    CLASS_HEADER,
    GROUP_HEADER,
    class_label,
    class_row,
    group_row,
    headline_rows,
    verdict_hints,
    worst_class,
)
from flipgate.reporting.traffic import (
    change_section,
    group_churn_table,
    traffic_note,
    traffic_rows,
)

if TYPE_CHECKING:
    from flipgate.compare_multilabel import MultiLabelAnalysis

REGRESS, PROGRESS, COMMON, KEPT = "#d62728", "#2ca02c", "#8c8c8c", "#1f77b4"
MAX_PLOT_CLASSES = 30
GALLERY_LIMIT = 200  # negative flips drawn in a report file
GALLERY_LABELS = 10  # labels of a multi-label comparison whose flips are drawn
LABEL_GALLERY_LIMIT = 24  # negative flips drawn per label
PRESENCE = ["absent", "present"]  # a label's two values, as a multi-label gallery names them

REPORT_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 1100px; padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: .25rem .7rem; border-bottom: 1px solid #e3e3e3; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.worst td { background: #fde8e8; color: #a01010; font-weight: 600; }
.classes { max-height: 32rem; overflow-y: auto; display: inline-block; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 1rem; }
figure { margin: 0; } figure svg { width: 100%; height: auto; }
figcaption { color: #555; font-size: .9rem; }
"""


def _overlap_plot(values: PlotValues, old_name: str, new_name: str) -> str:
    """(a) Old and new errors as offset bars: progress | common | regress."""
    counts = values.counts
    progress, common, regress = counts.positive_flips, counts.both_wrong, counts.negative_flips
    rows = [BarRow(f"{old_name} wrong", [Segment(0, progress, "progress", PROGRESS),
                                         Segment(progress, common, "common", COMMON)]),
            BarRow(f"{new_name} wrong", [Segment(progress, common, "common", COMMON),
                                         Segment(progress + common, regress, "regress",
                                                 REGRESS)])]
    swatches = [Swatch(f"progress {progress}", "progress", PROGRESS),
                Swatch(f"common {common}", "common", COMMON),
                Swatch(f"regress {regress}", "regress", REGRESS)]
    return stacked_bars("overlap", "error overlap of the old and the new model", rows, swatches,
                        "samples", "no errors under either model")


def _plot_classes(report: dict) -> list[dict]:
    entries = report.get("per_class") or []
    if len(entries) <= MAX_PLOT_CLASSES:
        return entries
    busiest = sorted(entries, key=lambda e: -(e["negative_flips"] + e["positive_flips"]))
    return sorted(busiest[:MAX_PLOT_CLASSES], key=lambda e: e["class"])


def _class_flips_plot(report: dict, class_names: list[str] | None) -> str:
    """(b) Negative and positive flips per true class as grouped bars."""
    entries = _plot_classes(report)
    series = [Series("negative flips", "negative", REGRESS,
                     [e["negative_flips"] for e in entries]),
              Series("positive flips", "positive", PROGRESS,
                     [e["positive_flips"] for e in entries])]
    return grouped_bars("class-flips", "negative and positive flips per true class",
                        [class_label(e["class"], class_names) for e in entries], series,
                        "samples")


def _displacement_plot(values: PlotValues) -> str:
    """(c) ‖z_new − z_old‖ of negative flips vs. samples whose prediction is kept."""
    samples = [Sample("kept", "kept", KEPT, values.displacement[values.kept]),
               Sample("negative flips", "negative", REGRESS,
                      values.displacement[values.flipped["negative"]])]
    return density_panels("displacement", "logit displacement densities",
                          [DensityPanel("", samples)], "logit displacement ‖z_new − z_old‖₂")


def _confidence_plot(values: PlotValues, old_name: str, new_name: str) -> str:
    """(d) Confidence gap p_top1 − p_top2 of negative flips vs. all samples, per model."""
    negative = values.flipped["negative"]
    panels = [DensityPanel(f"under {name} ({role})",
                           [Sample("all samples", "all", KEPT, gap),
                            Sample("negative flips", "negative", REGRESS, gap[negative])])
              for name, role, gap in ((old_name, "old", values.old_gap),
                                      (new_name, "new", values.new_gap))]
    return density_panels("confidence", "confidence gap densities under each model", panels,
                          "confidence gap p_top1 − p_top2", np.linspace(0.0, 1.0, 21))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]],
           row_classes: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = []
    for i, row in enumerate(rows):
        css = row_classes[i] if row_classes else ""
        cells = "".join(f"<td>{html.escape(cell)}</td>" for cell in row)
        body.append(f'<tr class="{html.escape(css)}">{cells}</tr>' if css else f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _class_section(report: dict, class_names: list[str] | None) -> str:
    entries = report.get("per_class") or []
    worst = worst_class(report)
    rows = [class_row(entry, class_names) for entry in entries]
    css = ["worst" if entry is worst else "" for entry in entries]
    return f'<h2>Per class</h2><div class="classes">{_table(CLASS_HEADER, rows, css)}</div>'


def _group_section(report: dict, header: list[str] = GROUP_HEADER,
                   row: Callable[[dict], list[str]] = group_row) -> str:
    """The per-group table, when the eval set names a group per sample (else nothing)."""
    entries = report.get("per_group") or []
    if not entries:
        return ""
    rows = [row(entry) for entry in entries]
    return f'<h2>Per group</h2><div class="classes">{_table(header, rows)}</div>'


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _plots_section(values: PlotValues, report: dict, old_name: str, new_name: str,
                   class_names: list[str] | None) -> str:
    many = len(report.get("per_class") or []) > MAX_PLOT_CLASSES
    plots = [
        (_overlap_plot(values, old_name, new_name),
         "Error overlap: progress (old wrong, new right), common (both wrong), "
         "regress (old right, new wrong)."),
        (_class_flips_plot(report, class_names),
         "Negative and positive flips per true class"
         + (f" ({MAX_PLOT_CLASSES} classes with the most flips)." if many else ".")),
        (_displacement_plot(values),
         "Logit displacement of negatively flipped samples vs. samples whose prediction is "
         "kept (normalized densities)."),
        (_confidence_plot(values, old_name, new_name),
         "Confidence gap of the negatively flipped samples vs. all samples, under each model."),
    ]
    items = [_figure(svg, caption) for svg, caption in plots]
    return f'<h2>Plots</h2><div class="plots">{"".join(items)}</div>'


LABELS_ONLY_NOTE = (
    "<h2>Plots</h2><p>A side of this comparison is known by its predicted labels only (an "
    "external version whose labels were uploaded), so the numbers that need scores (SChurn, "
    "confidence gaps, ECE, logit displacement, flip ranks, prediction difference Δ1, Δ2, "
    "Δ<sup>L</sup>1) are null and not plotted; every count, rate, interval and table above "
    "comes from the labels.</p>")


def report_body(values: PlotValues | None, report: dict, *, old_name: str, new_name: str,
                class_names: list[str] | None = None) -> str:
    """The report's sections (headline, verdict hints, per-class table, plots) as HTML;
    without `values` (labels only) a note says why there are no plots; a traffic report's
    own sections for a traffic set."""
    if report.get("traffic"):
        return traffic_body(report)
    if report.get("multilabel"):
        return multilabel_body(report, old_name=old_name, new_name=new_name)
    hints = verdict_hints(report, old_name=old_name, new_name=new_name, class_names=class_names)
    hint_items = "".join(f"<li>{html.escape(hint)}</li>" for hint in hints)
    return "\n".join([
        f"<h2>Headline</h2>{_table(['Metric', 'Value'], headline_rows(report))}",
        f"<h2>Verdict hints</h2><ul>{hint_items}</ul>",
        _class_section(report, class_names),
        _group_section(report),
        LABELS_ONLY_NOTE if values is None
        else _plots_section(values, report, old_name, new_name, class_names),
    ])


def traffic_body(report: dict) -> str:
    """A traffic report's sections: headline, why the label entries are null, the changed
    predictions (churn per label, multi-label) and churn per group."""
    note = traffic_note(report)
    group_header, groups = group_churn_table(report)
    title, header, rows = change_section(report)
    return "\n".join([
        f"<h2>Headline (traffic)</h2>{_table(['Metric', 'Value'], traffic_rows(report))}",
        f"<p>{html.escape(note)}</p>" if note else "",
        f"<h2>{html.escape(title)}</h2>{_table(header, rows)}",
        f"<h2>Churn per group</h2>{_table(group_header, groups)}" if groups else "",
    ])


def multilabel_body(report: dict, *, old_name: str, new_name: str) -> str:
    """A multi-label report's sections: headline, hints, the per-label table, the worst
    labels first, and the per-group table when the eval set has groups."""
    hints = multilabel_hints(report, old_name=old_name, new_name=new_name)
    hint_items = "".join(f"<li>{html.escape(hint)}</li>" for hint in hints)
    rows = [label_row(entry) for entry in worst_labels_first(report)]
    return "\n".join([
        f"<h2>Headline (multi-label)</h2>"
        f"{_table(['Metric', 'Value'], multilabel_headline_rows(report))}",
        f"<h2>Verdict hints</h2><ul>{hint_items}</ul>",
        f'<h2>Per label, highest NFR first</h2><div class="classes">'
        f"{_table(LABEL_HEADER, rows)}</div>",
        _group_section(report, MULTILABEL_GROUP_HEADER, multilabel_group_row),
    ])


@dataclass(frozen=True)
class LabelRows:
    """What a multi-label gallery reads of the samples it draws, row for row: their labels
    (k, L), each version's probabilities (k, L) and their rows of the arrays it shows."""

    y: np.ndarray
    old: np.ndarray
    new: np.ndarray
    arrays: Mapping[str, np.ndarray]


def multilabel_gallery(analysis: "MultiLabelAnalysis", evalset: EvalSet) -> str:
    """The label_gallery of a comparison held in memory; nothing when a side has no
    probabilities."""
    old, new = (side.probabilities for side in analysis.sides)
    if old is None or new is None:
        return ""
    view, arrays = _shown_arrays(evalset)
    return label_gallery(analysis.report, view, lambda indices, label: new[indices, label],
                         lambda indices: LabelRows(evalset.y[indices], old[indices],
                                                   new[indices], {name: array[indices] for
                                                                  name, array in arrays.items()}))


def label_gallery(report: dict, view: SampleView,
                  new_probability: Callable[[np.ndarray, int], np.ndarray],
                  rows: Callable[[np.ndarray], LabelRows]) -> str:
    """The negative flips of the GALLERY_LABELS worst labels of a multi-label report, a
    gallery each of the LABEL_GALLERY_LIMIT on which the new version decides most
    confidently; `new_probability(indices, label)` reads the new version's probabilities of
    one label, `rows(indices)` what is drawn of the samples shown (nothing else is read)."""
    flipped = report["flipped_indices"]
    sections = []
    for entry in worst_labels_first(report)[:GALLERY_LABELS]:
        indices = np.asarray(flipped[entry["name"]], dtype=np.int64)
        if not indices.size:
            break
        j = entry["label"]
        confidence = np.abs(new_probability(indices, j) - 0.5)
        shown = indices[np.argsort(-confidence, kind="stable")][:LABEL_GALLERY_LIMIT]
        read = rows(shown)
        samples = [_label_flip(int(index), j, row, read) for row, index in enumerate(shown)]
        sections.append(f'<h3 data-label="{html.escape(entry["name"])}">Label '
                        f"{html.escape(entry['name'])}: {indices.size} negative flips</h3>"
                        + gallery_html(samples, view, PRESENCE))
    return ("<h2>Negative flips by label</h2><p class=\"sub\">Per label, samples on which the "
            "old version decided it right and the new one wrong (the most confident first; "
            "the worst labels first).</p>" + "".join(sections)) if sections else ""


def _label_flip(index: int, label: int, row: int, read: LabelRows) -> FlipSample:
    """Sample `index` (row `row` of `read`), a negative flip of `label`, as a gallery entry:
    its true value, both decisions and each version's probability of its decision."""
    truth = int(read.y[row, label])
    old, new = float(read.old[row, label]), float(read.new[row, label])
    return FlipSample(index, truth, truth, 1 - truth, old if truth else 1 - old,
                      1 - new if truth else new,
                      {name: np.asarray(array[row]) for name, array in read.arrays.items()})


def _shown_arrays(evalset: EvalSet) -> tuple[SampleView, dict[str, np.ndarray]]:
    """How the gallery shows the eval set's samples, and the arrays it reads for that."""
    arrays = evalset.shown_arrays()
    view = SampleView.of_arrays(arrays)
    return view, {name: arrays[name] for name in view.arrays}


def gallery_section(samples: Sequence[FlipSample], total: int, view: SampleView,
                    class_names: list[str] | None = None) -> str:
    """The flip gallery with a heading that says how many of the negative flips it shows."""
    shown = f"the {len(samples)} most confident of {total}" if len(samples) < total else "all"
    return (f"<h2>Negative flips ({total})</h2><p class=\"sub\">Samples the old model got "
            f"right and the new one gets wrong: {shown}, by the new model's confidence.</p>"
            + gallery_html(samples, view, class_names))


def flip_gallery(analysis: PairAnalysis, evalset: EvalSet, limit: int = GALLERY_LIMIT,
                 class_names: list[str] | None = None) -> str:
    """The gallery section of a comparison held in memory: its `limit` most confident
    negative flips."""
    view, arrays = _shown_arrays(evalset)
    samples, total = gallery_from_arrays(analysis.old_logits, analysis.new_logits,
                                         analysis.labels, arrays, limit)
    return gallery_section(samples, total, view, class_names)


BODY_START, BODY_END = "<!-- flipgate:report-body -->", "<!-- /flipgate:report-body -->"


def stored_body(page: str) -> str | None:
    """The report_body inside a page that render_html drew (None for a page without one)."""
    start, end = page.find(BODY_START), page.find(BODY_END)
    return page[start + len(BODY_START):end] if 0 <= start < end else None


def render_html(
    values: PlotValues | None,
    report: dict,
    *,
    old_name: str,
    new_name: str,
    title: str = "flipgate compare",
    class_names: list[str] | None = None,
    gallery: str = "",
) -> str:
    """One self-contained HTML page (inline CSS and SVG, no external references); `gallery`
    is an optional gallery_section appended to the report."""
    body = report_body(values, report, old_name=old_name, new_name=new_name,
                       class_names=class_names)
    return "\n".join([
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>\n<style>{REPORT_CSS}{GALLERY_CSS}</style>",
        "</head>\n<body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="sub">{html.escape(old_name)} (old) → {html.escape(new_name)} (new) on '
        f"{html.escape(str(report.get('n')))} samples</p>",
        f"{BODY_START}{body}{BODY_END}",
        gallery,
        "</body>\n</html>\n",
    ])
