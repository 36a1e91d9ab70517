"""Small SVG charts drawn as strings: stacked horizontal bars, grouped vertical bars and
step-filled density histograms, with "nice" axis ticks, legends and notes.

Every chart is one <svg> with a fixed viewBox (the page scales it to its width), no ids and
no external references. Text is <text> in the page's own font (escaped), sized by an estimate
of its width; a label too long for its place is cut with an ellipsis and given whole in a
<title>. Drawn values are checkable: each bar is a `<rect class="bar KIND" data-value="N">`,
each density a `<path class="density KIND">` with its bin edges and heights (data-edges,
data-heights), each tick label a `<text class="tick x|y" data-value="V">`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from math import ceil, floor, log10

import numpy as np

WIDTH = 640
FONT_SIZE = 12
CHAR_WIDTH = 0.6 * FONT_SIZE  # a character of the page's sans-serif font, a little generous
LINE = 16  # a line of text
X_TICKS = 18  # from an x axis down to its tick labels' baseline
PAD = 8
INK, MUTED, GRID = "#222", "#555", "#e3e3e3"
SWATCH = 11
DENSITY_OPACITY = 0.35


@dataclass(frozen=True)
class Box:
    """A rectangle of the viewBox: where a panel draws its data."""

    left: float
    top: float
    right: float
    bottom: float

    @property
    def width(self) -> float:
        return self.right - self.left


@dataclass(frozen=True)
class Axis:
    """Ticks of a value axis, 1, 2 or 5 times a power of ten apart, covering its data."""

    ticks: list[float]
    step: float

    @classmethod
    def covering(cls, low: float, high: float, *, integer: bool = False) -> "Axis":
        """Ticks from at or below `low` to at or above `high`: of 4 to 8 intervals, those
        that reach least beyond the data (then nearest 5 intervals); whole numbers only where
        `integer` (counts)."""
        return min((cls._with_intervals(low, high, target, integer) for target in range(4, 9)),
                   key=lambda axis: (axis.high - axis.low, abs(len(axis.ticks) - 6)))

    @classmethod
    def _with_intervals(cls, low: float, high: float, target: int, integer: bool) -> "Axis":
        """The axis of the nice step at or above (high - low) / target."""
        raw = (high - low or abs(high) or 1.0) / target
        power = 10.0 ** floor(log10(raw))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
        if integer:
            step = float(max(round(step), 1))
        first = floor(low / step + 1e-9)
        last = max(ceil(high / step - 1e-9), first + 1)
        return cls([_significant(k * step) for k in range(first, last + 1)], step)

    @property
    def low(self) -> float:
        return self.ticks[0]

    @property
    def high(self) -> float:
        return self.ticks[-1]

    def label(self, value: float) -> str:
        """The tick's number with as many digits as the step needs: fixed-point, or in
        exponent form for steps below 1e-6 and ticks from 1e7 up."""
        step_digit = floor(log10(self.step) + 1e-9)
        largest = max(abs(tick) for tick in self.ticks)
        if step_digit >= -6 and largest < 1e7:
            return f"{value:.{max(0, -step_digit)}f}"
        return f"{value:.{max(1, floor(log10(largest)) - step_digit + 1)}g}"

    def widest_label(self) -> float:
        return max(text_width(self.label(tick)) for tick in self.ticks)

    def scale(self, start: float, end: float):
        """A function from this axis's values to viewBox coordinates `start`..`end`."""
        low, span = self.low, self.high - self.low
        return lambda value: start + (value - low) / span * (end - start)


def _significant(value: float) -> float:
    """`value` to 12 significant digits: a tick without the float error of k * step, at any
    scale (rounding to 12 decimals made every tick of a step below 1e-12 zero)."""
    return float(f"{value:.12g}")


@dataclass(frozen=True)
class Swatch:
    """A legend entry, and the kind (CSS class) and colour of what it stands for."""

    label: str
    kind: str
    colour: str
    opacity: float = 1.0


@dataclass(frozen=True)
class Segment:
    """A bar of a stacked row, from `start` for `value`."""

    start: float
    value: int
    kind: str
    colour: str


@dataclass(frozen=True)
class BarRow:
    label: str
    segments: Sequence[Segment]


@dataclass(frozen=True)
class Series:
    """Values of the bar groups (one each), drawn side by side with the other series'."""

    label: str
    kind: str
    colour: str
    values: Sequence[int]


@dataclass(frozen=True)
class Sample:
    """Values whose normalized histogram a density panel draws."""

    label: str
    kind: str
    colour: str
    values: np.ndarray


@dataclass(frozen=True)
class DensityPanel:
    title: str
    samples: Sequence[Sample]


def text_width(content: str, size: float = FONT_SIZE) -> float:
    return len(content) * CHAR_WIDTH * size / FONT_SIZE


def text(x: float, y: float, content: str, css: str, anchor: str = "start",
         extra: str = "", fit: float | None = None) -> str:
    """A <text> at (x, y); cut in the middle to `fit` wide (the whole text in its <title>)
    if given: both ends of a file's path tell more than either."""
    shown = content
    if fit is not None and text_width(content) > fit:
        keep = max(int(fit / CHAR_WIDTH) - 1, 2)
        shown = content[:(keep + 1) // 2] + "…" + content[len(content) - keep // 2:]
    title = f"<title>{escape(content)}</title>" if shown != content else ""
    return (f'<text class="{css}" x="{x:.2f}" y="{y:.2f}" text-anchor="{anchor}"{extra}>'
            f"{title}{escape(shown)}</text>")


def svg(css: str, label: str, height: float, parts: Sequence[str]) -> str:
    """The chart's <svg>: WIDTH × `height`, text in the page's font at FONT_SIZE."""
    return (f'<svg class="chart {css}" role="img" aria-label="{escape(label)}" '
            f'viewBox="0 0 {WIDTH} {height}" font-size="{FONT_SIZE}" fill="{INK}">'
            + "".join(parts) + "</svg>")


def legend(swatches: Sequence[Swatch], left: float, top: float, width: float,
           centred: bool = False) -> tuple[str, float]:
    """The swatches in rows that fit `width` from (left, top); the SVG and its height."""
    rows: list[list[Swatch]] = [[]]
    used = 0.0
    for swatch in swatches:
        wide = _entry_width(swatch)
        if rows[-1] and used + wide > width:
            rows.append([])
            used = 0.0
        rows[-1].append(swatch)
        used += wide
    parts = ['<g class="legend">']
    for index, row in enumerate(rows):
        row_width = sum(_entry_width(swatch) for swatch in row) - PAD * 2
        x = left + (width - row_width) / 2 if centred else left
        y = top + index * LINE
        for swatch in row:
            parts.append(f'<rect class="swatch {swatch.kind}" x="{x:.2f}" y="{y + 2:.2f}" '
                         f'width="{SWATCH}" height="{SWATCH}" fill="{swatch.colour}" '
                         f'fill-opacity="{swatch.opacity}" stroke="{swatch.colour}"/>')
            parts.append(text(x + SWATCH + 4, y + 12, swatch.label, "legend-label"))
            x += _entry_width(swatch)
    parts.append("</g>")
    return "".join(parts), len(rows) * LINE


def _entry_width(swatch: Swatch) -> float:
    return SWATCH + 4 + text_width(swatch.label) + PAD * 2


def line(css: str, x1: float, x2: float, y1: float, y2: float, colour: str) -> str:
    return (f'<line class="{css}" x1="{x1:.2f}" x2="{x2:.2f}" y1="{y1:.2f}" y2="{y2:.2f}" '
            f'stroke="{colour}"/>')


def note(box: Box, message: str) -> str:
    return text((box.left + box.right) / 2, (box.top + box.bottom) / 2, message, "note",
                "middle", f' fill="{MUTED}"')


def x_axis(box: Box, axis: Axis | None, label: str) -> str:
    """The baseline, the ticks with their labels under it (none without `axis`), and the
    axis's label."""
    parts = [line("axis-line", box.left, box.right, box.bottom, box.bottom, INK)]
    if axis:
        x = axis.scale(box.left, box.right)
        for tick in axis.ticks:
            parts.append(line("tick-mark", x(tick), x(tick), box.bottom, box.bottom + 4, INK))
            parts.append(text(x(tick), box.bottom + X_TICKS, axis.label(tick), "tick x", "middle",
                              f' data-value="{tick!r}" fill="{MUTED}"'))
    parts.append(text((box.left + box.right) / 2, box.bottom + X_TICKS + LINE, label, "axis-label",
                      "middle"))
    return "".join(parts)


def y_axis(box: Box, axis: Axis | None, label: str) -> str:
    """Grid lines at the ticks with their labels left of the box, the left edge, and the
    axis's label turned up along it."""
    parts = [line("axis-line", box.left, box.left, box.top, box.bottom, INK)]
    widest = 0.0
    if axis:
        y = axis.scale(box.bottom, box.top)
        widest = axis.widest_label()
        for tick in axis.ticks:
            parts.append(line("grid", box.left, box.right, y(tick), y(tick), GRID))
            parts.append(text(box.left - 6, y(tick) + 4, axis.label(tick), "tick y", "end",
                              f' data-value="{tick!r}" fill="{MUTED}"'))
    x, y_mid = box.left - 6 - widest - 8, (box.top + box.bottom) / 2
    parts.append(text(x, y_mid, label, "axis-label", "middle",
                      f' transform="rotate(-90 {x:.2f} {y_mid:.2f})"'))
    return "".join(parts)


def y_axis_room(axis: Axis | None) -> float:
    """How far left of its box a y_axis draws."""
    return 6 + (axis.widest_label() if axis else 0.0) + 8 + 4


def stacked_bars(css: str, label: str, rows: Sequence[BarRow], swatches: Sequence[Swatch],
                 x_label: str, empty: str, height: float = 200) -> str:
    """Rows of bars on one count axis, each row's label above it and each bar's value inside
    it where it fits; `empty` is noted when every bar is 0."""
    total = max((s.start + s.value for row in rows for s in row.segments), default=0)
    axis = Axis.covering(0, max(total, 1), integer=True)
    legend_svg, legend_height = legend(swatches, PAD, PAD, WIDTH - 2 * PAD, centred=True)
    right = WIDTH - PAD - text_width(axis.label(axis.high)) / 2
    box = Box(PAD + 4, PAD + legend_height + 4, right, height - PAD - X_TICKS - LINE)
    x = axis.scale(box.left, box.right)
    pitch = (box.bottom - box.top) / len(rows)
    parts = [legend_svg]
    for tick in axis.ticks:
        parts.append(line("grid", x(tick), x(tick), box.top, box.bottom, GRID))
    for index, row in enumerate(rows):
        top = box.top + index * pitch
        parts.append(text(box.left, top + 13, row.label, "row-label", fit=box.width))
        bar_top, bar_height = top + 18, pitch - 24
        parts += [_hbar(row.label, segment, x, bar_top, bar_height) for segment in row.segments]
    parts.append(x_axis(box, axis, x_label))
    if not total:
        parts.append(note(box, empty))
    return svg(css, label, height, parts)


def _hbar(row: str, segment: Segment, x, top: float, height: float) -> str:
    left, width = x(segment.start), x(segment.start + segment.value) - x(segment.start)
    value = str(segment.value)
    inside = (text(left + width / 2, top + height / 2 + 4, value, "value", "middle",
                   ' fill="#fff" font-weight="bold"')
              if text_width(value) + 6 <= width else "")
    return (f'<rect class="bar {segment.kind}" data-value="{segment.value}" x="{left:.2f}" '
            f'y="{top:.2f}" width="{width:.2f}" height="{height:.2f}" fill="{segment.colour}">'
            f"<title>{escape(row)}: {segment.kind} {value}</title></rect>{inside}")


def grouped_bars(css: str, label: str, groups: Sequence[str], series: Sequence[Series],
                 y_label: str, height: float = 320, crowded: int = 8) -> str:
    """One group of bars per name in `groups` (a bar per series) on a count axis; the names
    are turned 45° when there are more than `crowded`."""
    axis = Axis.covering(0, max([1, *(v for s in series for v in s.values)]), integer=True)
    swatches = [Swatch(s.label, s.kind, s.colour) for s in series]
    legend_svg, legend_height = legend(swatches, PAD, PAD, WIDTH - 2 * PAD)
    turned = len(groups) > crowded
    names = _GroupLabels.of(groups, turned)
    left = PAD + y_axis_room(axis)
    slot = (WIDTH - PAD - left) / max(len(groups), 1)
    if turned:  # the first name hangs left of its group
        left = max(left, PAD + names.reach - slot / 2)
        slot = (WIDTH - PAD - left) / len(groups)
    box = Box(left, PAD + legend_height + 8, WIDTH - PAD, height - PAD - names.depth)
    y = axis.scale(box.bottom, box.top)
    parts = [legend_svg, y_axis(box, axis, y_label)]
    bar = slot * 0.8 / len(series)
    for index, group in enumerate(groups):
        centre = box.left + (index + 0.5) * slot
        bars = "".join(_vbar(group, s, s.values[index], centre + (k - len(series) / 2) * bar,
                             bar, y, box.bottom) for k, s in enumerate(series))
        parts.append(f'<g class="group" data-group="{escape(group)}">{bars}'
                     f"{names.draw(group, centre, box.bottom, slot)}</g>")
    parts.append(line("axis-line", box.left, box.right, box.bottom, box.bottom, INK))
    return svg(css, label, height, parts)


def _vbar(group: str, series: Series, value: int, left: float, width: float, y,
          bottom: float) -> str:
    return (f'<rect class="bar {series.kind}" data-value="{value}" x="{left:.2f}" '
            f'y="{y(value):.2f}" width="{width:.2f}" height="{bottom - y(value):.2f}" '
            f'fill="{series.colour}"><title>{escape(group)}: {escape(series.label)} {value}'
            "</title></rect>")


@dataclass(frozen=True)
class _GroupLabels:
    """Names under bar groups, level or turned 45°: how deep and (turned) how far left of
    their anchor they reach."""

    turned: bool
    chars: int  # the longest name shown, in characters

    TURNED_SIZE = 11
    MAX_TURNED_CHARS = 16

    @classmethod
    def of(cls, groups: Sequence[str], turned: bool) -> "_GroupLabels":
        longest = max((len(group) for group in groups), default=0)
        return cls(turned, min(longest, cls.MAX_TURNED_CHARS))

    @property
    def reach(self) -> float:
        """Across or down: the name's length and its height, turned 45°."""
        if not self.turned:
            return 0.0
        return (text_width("x" * self.chars, self.TURNED_SIZE) + self.TURNED_SIZE) * 0.71

    @property
    def depth(self) -> float:
        return 12 + self.reach + 6 if self.turned else 18

    def draw(self, name: str, x: float, bottom: float, slot: float) -> str:
        if not self.turned:
            return text(x, bottom + 15, name, "tick x", "middle", f' fill="{MUTED}"',
                        fit=slot - 4)
        y = bottom + 12
        return text(x, y, name, "tick x", "end",
                    f' font-size="{self.TURNED_SIZE}" fill="{MUTED}" '
                    f'transform="rotate(-45 {x:.2f} {y:.2f})"',
                    fit=text_width("x" * self.MAX_TURNED_CHARS))


def density_panels(css: str, label: str, panels: Sequence[DensityPanel], x_label: str,
                   edges: np.ndarray | None = None, height: float = 320) -> str:
    """Side by side, each panel's samples as normalized step-filled histograms on bin edges
    shared by its samples (`edges`, or about √n bins over the pooled values), with a legend
    of their counts; "no samples" where a panel has none."""
    width = (WIDTH - PAD) / len(panels)
    parts = [_density_panel(panel, index * width + PAD, width - PAD, height, x_label, edges)
             for index, panel in enumerate(panels)]
    return svg(css, label, height, parts)


def _density_panel(panel: DensityPanel, left: float, width: float, height: float,
                   x_label: str, edges: np.ndarray | None) -> str:
    present = [sample for sample in panel.samples if sample.values.size]
    parts = ['<g class="panel">']
    top = PAD
    if panel.title:
        parts.append(text(left + width / 2, top + 12, panel.title, "panel-title", "middle",
                          ' font-size="13"', fit=width))
        top += LINE + 4
    edges = _edges(present) if edges is None and present else edges
    heights = [np.histogram(s.values, bins=edges, density=True)[0] for s in present]
    x_ticks = Axis.covering(float(edges[0]), float(edges[-1])) if present else None
    y_ticks = Axis.covering(0.0, max(float(h.max()) for h in heights)) if present else None
    swatches = [Swatch(f"{s.label} (n={s.values.size})", s.kind, s.colour, DENSITY_OPACITY)
                for s in present]
    plot_left = left + y_axis_room(y_ticks) + 4
    legend_svg, legend_height = legend(swatches, plot_left, top, left + width - plot_left)
    plot_right = left + width - (text_width(x_ticks.label(x_ticks.high)) / 2 if x_ticks else 0)
    box = Box(plot_left, top + legend_height + 8, plot_right, height - PAD - X_TICKS - LINE)
    parts += [legend_svg, y_axis(box, y_ticks, "density")]
    if present:
        x, y = x_ticks.scale(box.left, box.right), y_ticks.scale(box.bottom, box.top)
        parts += [_step_density(sample, edges, h, x, y)
                  for sample, h in zip(present, heights, strict=True)]
    else:
        parts.append(note(box, "no samples"))
    parts += [x_axis(box, x_ticks, x_label), "</g>"]
    return "".join(parts)


def _edges(samples: Sequence[Sample]) -> np.ndarray:
    pooled = np.concatenate([sample.values for sample in samples])
    return np.histogram_bin_edges(pooled, bins=int(np.clip(np.sqrt(pooled.size), 5, 30)))


def _step_density(sample: Sample, edges: np.ndarray, heights: np.ndarray, x, y) -> str:
    """The histogram's outline from the baseline over every bin and back, filled."""
    points = [(x(edges[0]), y(0.0))]
    for low, high, value in zip(edges[:-1], edges[1:], heights, strict=True):
        points += [(x(low), y(value)), (x(high), y(value))]
    points.append((x(edges[-1]), y(0.0)))
    path = "M" + " L".join(f"{px:.2f},{py:.2f}" for px, py in points) + " Z"
    return (f'<path class="density {sample.kind}" data-n="{sample.values.size}" '
            f'data-edges="{_numbers(edges)}" data-heights="{_numbers(heights)}" d="{path}" '
            f'fill="{sample.colour}" fill-opacity="{DENSITY_OPACITY}" stroke="{sample.colour}" '
            f'stroke-width="1.5"><title>{escape(sample.label)} (n={sample.values.size})'
            "</title></path>")


def _numbers(values: np.ndarray) -> str:
    return " ".join(repr(float(value)) for value in values)
