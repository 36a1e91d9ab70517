"""One self-contained HTML page for an old/new comparison: numbers, tables and inline SVG plots.

The page loads nothing: CSS is inline, plots are matplotlib SVG (text drawn as paths) pasted
into the document, so it opens offline and can be attached to a CI run as one file.
"""

import html
import io
import re
from collections.abc import Sequence
from functools import partial

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from flipgate.formats import EvalSet
from flipgate.metrics.report import PairAnalysis, PlotValues
from flipgate.reporting.gallery import (
    GALLERY_CSS,
    FlipSample,
    SampleView,
    gallery_from_arrays,
    gallery_html,
)
from flipgate.reporting.terminal import (
    CLASS_HEADER,
    GROUP_HEADER,
    class_label,
    class_row,
    group_row,
    headline_rows,
    verdict_hints,
    worst_class,
)

REGRESS, PROGRESS, COMMON, KEPT = "#d62728", "#2ca02c", "#8c8c8c", "#1f77b4"
MAX_PLOT_CLASSES = 30
GALLERY_LIMIT = 200  # negative flips drawn in a report file
_SVG_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
_RC = {"svg.fonttype": "path", "svg.hashsalt": "flipgate", "font.size": 9}

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


def _plain(text: str) -> str:
    """Text for a matplotlib label: '$' would otherwise start mathtext."""
    return text.replace("$", r"\$")


def _svg(fig: Figure, prefix: str) -> str:
    """The figure as an inline <svg> element with ids prefixed; closes the figure."""
    buffer = io.StringIO()
    try:
        fig.savefig(buffer, format="svg", metadata=_SVG_METADATA)
    finally:
        plt.close(fig)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and the DOCTYPE (a DTD URL)
    svg = re.sub(r'\bid="', f'id="{prefix}-', svg)
    svg = re.sub(r'(href=")#', rf"\1#{prefix}-", svg)
    return svg.replace("url(#", f"url(#{prefix}-")


def _note(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="#666")


def _empty(ax: Axes, message: str) -> None:
    _note(ax, message)
    ax.set_xticks([])
    ax.set_yticks([])


def _densities(
    ax: Axes, series: Sequence[tuple[str, np.ndarray, str]], edges: np.ndarray | None = None
) -> None:
    """Normalized histograms of several (label, values, color) series on one axis."""
    present = [(label, values, color) for label, values, color in series if values.size]
    if not present:
        _empty(ax, "no samples")
        return
    if edges is None:
        pooled = np.concatenate([values for _, values, _ in present])
        edges = np.histogram_bin_edges(pooled, bins=int(np.clip(np.sqrt(pooled.size), 5, 30)))
    for label, values, color in present:
        ax.hist(values, bins=edges, density=True, histtype="stepfilled", alpha=0.35,
                color=color, edgecolor=color, linewidth=1.5, label=f"{label} (n={values.size})")
    ax.set_ylabel("density")
    ax.legend(frameon=False)


def _overlap_plot(values: PlotValues, old_name: str, new_name: str) -> Figure:
    """(a) Old and new errors as offset bars: progress | common | regress."""
    counts = values.counts
    progress, common, regress = counts.positive_flips, counts.both_wrong, counts.negative_flips
    fig, ax = plt.subplots(figsize=(6.4, 2.4), layout="constrained")
    rows = [(_plain(f"{old_name} wrong"), [(0, progress, PROGRESS), (progress, common, COMMON)]),
            (_plain(f"{new_name} wrong"), [(progress, common, COMMON),
                                          (progress + common, regress, REGRESS)])]
    for y, (_, segments) in enumerate(rows):
        for left, width, color in segments:
            ax.barh(y, width, left=left, color=color, height=0.6)
            if width:
                ax.text(left + width / 2, y, str(width), ha="center", va="center", color="white",
                        fontweight="bold")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max(progress + common + regress, 1))
    if not progress + common + regress:
        _note(ax, "no errors under either model")
    ax.set_xlabel("samples")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (PROGRESS, COMMON, REGRESS)]
    ax.legend(handles, [f"progress {progress}", f"common {common}", f"regress {regress}"],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3, frameon=False)
    return fig


def _plot_classes(report: dict) -> list[dict]:
    entries = report.get("per_class") or []
    if len(entries) <= MAX_PLOT_CLASSES:
        return entries
    busiest = sorted(entries, key=lambda e: -(e["negative_flips"] + e["positive_flips"]))
    return sorted(busiest[:MAX_PLOT_CLASSES], key=lambda e: e["class"])


def _class_flips_plot(report: dict, class_names: list[str] | None) -> Figure:
    """(b) Negative and positive flips per true class as grouped bars."""
    entries = _plot_classes(report)
    fig, ax = plt.subplots(figsize=(6.4, 3.2), layout="constrained")
    x = np.arange(len(entries))
    ax.bar(x - 0.2, [e["negative_flips"] for e in entries], 0.4, color=REGRESS,
           label="negative flips")
    ax.bar(x + 0.2, [e["positive_flips"] for e in entries], 0.4, color=PROGRESS,
           label="positive flips")
    labels = [_plain(class_label(e["class"], class_names)) for e in entries]
    crowded = len(entries) > 8
    ax.set_xticks(x, labels, rotation=45 if crowded else 0, ha="right" if crowded else "center")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("samples")
    ax.legend(frameon=False)
    return fig


def _displacement_plot(values: PlotValues) -> Figure:
    """(c) ‖z_new − z_old‖ of negative flips vs. samples whose prediction is kept."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2), layout="constrained")
    _densities(ax, [("kept", values.displacement[values.kept], KEPT),
                    ("negative flips", values.displacement[values.flipped["negative"]],
                     REGRESS)])
    ax.set_xlabel("logit displacement ‖z_new − z_old‖₂")
    return fig


def _confidence_plot(values: PlotValues, old_name: str, new_name: str) -> Figure:
    """(d) Confidence gap p_top1 − p_top2 of negative flips vs. all samples, per model."""
    negative = values.flipped["negative"]
    edges = np.linspace(0.0, 1.0, 21)
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.2), sharex=True, layout="constrained")
    for ax, name, role, gap in ((axes[0], old_name, "old", values.old_gap),
                                (axes[1], new_name, "new", values.new_gap)):
        _densities(ax, [("all samples", gap, KEPT), ("negative flips", gap[negative], REGRESS)],
                   edges)
        ax.set_title(_plain(f"under {name} ({role})"))
        ax.set_xlabel("confidence gap p_top1 − p_top2")
    return fig


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


def _group_section(report: dict) -> str:
    """The per-group table, when the eval set names a group per sample (else nothing)."""
    entries = report.get("per_group") or []
    if not entries:
        return ""
    rows = [group_row(entry) for entry in entries]
    return f'<h2>Per group</h2><div class="classes">{_table(GROUP_HEADER, rows)}</div>'


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _plots_section(values: PlotValues, report: dict, old_name: str, new_name: str,
                   class_names: list[str] | None) -> str:
    many = len(report.get("per_class") or []) > MAX_PLOT_CLASSES
    plots = [
        (partial(_overlap_plot, values, old_name, new_name),
         "Error overlap: progress (old wrong, new right), common (both wrong), "
         "regress (old right, new wrong)."),
        (partial(_class_flips_plot, report, class_names),
         "Negative and positive flips per true class"
         + (f" ({MAX_PLOT_CLASSES} classes with the most flips)." if many else ".")),
        (partial(_displacement_plot, values),
         "Logit displacement of negatively flipped samples vs. samples whose prediction is "
         "kept (normalized densities)."),
        (partial(_confidence_plot, values, old_name, new_name),
         "Confidence gap of the negatively flipped samples vs. all samples, under each model."),
    ]
    with plt.rc_context(_RC):
        items = [_figure(_svg(build(), f"plot{i}"), caption)
                 for i, (build, caption) in enumerate(plots)]
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
    without `values` (labels only) a note says why there are no plots."""
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
    arrays = {**evalset.arrays(), **{name: array for name, array in
                                     (("text", evalset.text), ("images", evalset.images))
                                     if array is not None}}
    view = SampleView.of_arrays(arrays)
    samples, total = gallery_from_arrays(analysis.old_logits, analysis.new_logits,
                                         analysis.labels, {name: arrays[name] for name in
                                                           view.arrays}, limit)
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
