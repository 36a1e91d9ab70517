"""A line's pairwise matrix as an SVG heatmap: old versions on rows, new on columns, each
cell a link to its pair, its value in its <title> (shown on hover) and printed inside it.

The colour scale is fixed: white at 0 to amber at the policy's limit (without a limit, the
matrix's largest value); a cell above the limit is red and marked "!". Updates to the next
version (the diagonal above the main one) have a dark outline, the moves of the production
alias a thick green one, and the production version's labels are green."""

from collections.abc import Callable
from html import escape

from service.ui.numbers import percent, percent_interval
from service.ui.queries import Matrix

CELL, LABEL_WIDTH, HEADER_HEIGHT = 52, 84, 40
EMPTY, DIAGONAL, ABOVE = "#f6f8fa", "#eaecef", "#a50f15"
UNKNOWN = "#c9ced6"  # a value the set cannot know yet: off the scale, never "within the limit"
LOW, HIGH = (255, 247, 236), (244, 160, 60)
LABEL_CHARS = 9
BLACK = "#000000"  # cell text; white where it contrasts more (class "light")


def heatmap_svg(matrix: Matrix, metric: str, label: str, limit: float | None,
                pair_url: Callable[[str, str], str]) -> str:
    """The heatmap of `metric` ("nfr" or "churn") scaled to `limit`; `pair_url(old, new)`
    is the address of a cell's pair."""
    names = matrix.versions
    values = [matrix.value(old, new, metric) for old in names for new in names if old != new]
    anchor = limit or max((value for value in values if value is not None), default=0.0) or 1.0
    size = len(names) * CELL
    parts = [f'<svg class="heatmap" data-metric="{metric}" data-anchor="{anchor!r}" role="img" '
             f'aria-label="{escape(label)} matrix" '
             f'width="{LABEL_WIDTH + size}" height="{HEADER_HEIGHT + size}" '
             f'viewBox="0 0 {LABEL_WIDTH + size} {HEADER_HEIGHT + size}">',
             f'<text class="axis" x="{LABEL_WIDTH - 8}" y="14" text-anchor="end">old ↓ new →'
             "</text>"]
    for j, name in enumerate(names):
        parts.append(f'<text class="{_axis(matrix, name)}" '
                     f'x="{LABEL_WIDTH + j * CELL + CELL / 2}" y="{HEADER_HEIGHT - 10}" '
                     f'text-anchor="middle">{_label(name)}</text>')
    for i, old in enumerate(names):
        y = HEADER_HEIGHT + i * CELL
        parts.append(f'<text class="{_axis(matrix, old)}" x="{LABEL_WIDTH - 8}" '
                     f'y="{y + CELL / 2 + 4}" text-anchor="end">{_label(old)}</text>')
        parts += [_cell(matrix, metric, label, (old, new), LABEL_WIDTH + j * CELL, y, anchor,
                        _emphasis(matrix, (old, new), j == i + 1), pair_url)
                  for j, new in enumerate(names)]
    parts.append("</svg>")
    return "".join(parts)


def _axis(matrix: Matrix, name: str) -> str:
    """The classes of a version's label: the production version's stands out."""
    return "axis production" if name == matrix.production else "axis"


def _emphasis(matrix: Matrix, pair: tuple[str, str], next_version: bool) -> str:
    """" promoted" for a move of the production alias, " next" for an update to the next
    version, else nothing."""
    if pair in matrix.promoted:
        return " promoted"
    return " next" if next_version else ""


def _label(name: str) -> str:
    """A version's name cut to fit a cell, the whole name in its <title>."""
    if len(name) <= LABEL_CHARS:
        return escape(name)
    return f"{escape(name[:LABEL_CHARS - 1])}…<title>{escape(name)}</title>"


def _cell(matrix: Matrix, metric: str, label: str, pair: tuple[str, str], x: float, y: float,
          anchor: float, emphasis: str, pair_url: Callable[[str, str], str]) -> str:
    """One cell: a link (with the cell's title) around a coloured rect and the value as
    text."""
    old, new = pair
    if old == new:
        return _rect(x, y, DIAGONAL, "")
    if pair not in matrix.cells:
        return _rect(x, y, EMPTY, f"<title>{escape(old)} → {escape(new)}: not measured</title>")
    value = matrix.value(old, new, metric)
    if value is None:
        return _unknown_cell(matrix, label, pair, x, y, emphasis, pair_url)
    above = value > anchor
    fill = ABOVE if above else _shade(value / anchor)
    title = (f"<title>{escape(old)} → {escape(new)}: {label} {percent(value)}"
             f"{' (above the limit)' if above else ''}"
             f"{' (a move of production)' if emphasis == ' promoted' else ''}</title>")
    classes = "cell" + (" above" if above else "") + emphasis
    href = escape(pair_url(old, new))
    return (f'<a href="{href}" class="{classes}" data-old="{escape(old)}" '
            f'data-new="{escape(new)}" data-value="{value!r}">{title}{_rect(x, y, fill, "")}'
            f'<text x="{x + CELL / 2}" y="{y + CELL / 2 + 4}"'
            f'{"" if ink(fill) == BLACK else " class=light"}>'
            f'{"!" if above else ""}{percent(value, 1)}</text></a>')


def _unknown_cell(matrix: Matrix, label: str, pair: tuple[str, str], x: float, y: float,
                  emphasis: str, pair_url: Callable[[str, str], str]) -> str:
    """A cell whose value the eval set cannot know yet (NFR on a traffic set): neither
    coloured on the scale nor given a number; "?" and, where labels bound it, its interval
    in the title."""
    old, new = pair
    interval = matrix.intervals.get(pair)
    known = (f"95% interval {percent_interval(interval)} from the labels so far"
             if interval else "a traffic set: churn only; NFR is known from labels")
    title = f"<title>{escape(old)} → {escape(new)}: {label} unknown ({known})</title>"
    return (f'<a href="{escape(pair_url(old, new))}" class="cell unknown{emphasis}" '
            f'data-old="{escape(old)}" data-new="{escape(new)}" data-value="unknown">{title}'
            f'{_rect(x, y, UNKNOWN, "")}<text x="{x + CELL / 2}" y="{y + CELL / 2 + 4}">?'
            "</text></a>")


def _rect(x: float, y: float, fill: str, title: str) -> str:
    inside = f">{title}</rect>" if title else "/>"
    return (f'<rect x="{x + 1}" y="{y + 1}" width="{CELL - 2}" height="{CELL - 2}" rx="3" '
            f'fill="{fill}"{inside}')


def _shade(share: float) -> str:
    """LOW (0) to HIGH (the limit)."""
    rgb = (round(a + (b - a) * min(max(share, 0.0), 1.0)) for a, b in zip(LOW, HIGH, strict=True))
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def luminance(colour: str) -> float:
    """WCAG 2 relative luminance of "#rrggbb"."""
    channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def ink(fill: str) -> str:
    """Black or white, whichever contrasts more with `fill` (always at least 4.5:1)."""
    light = luminance(fill) + 0.05
    return BLACK if light / 0.05 > 1.05 / light else "#ffffff"
