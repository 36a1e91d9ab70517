"""A line's pairwise matrix as an SVG heatmap: old versions on rows, new on columns, each
cell's value in its <title> (shown on hover) and printed inside it."""

from html import escape

from service.ui.queries import Matrix

CELL, LABEL_WIDTH, HEADER_HEIGHT = 64, 84, 40
EMPTY, DIAGONAL = "#f6f8fa", "#eaecef"


def heatmap_svg(matrix: Matrix, metric: str, label: str) -> str:
    """The heatmap of `metric` ("nfr" or "churn"); colour is the value against the largest."""
    names = matrix.versions
    values = [matrix.value(old, new, metric) for old in names for new in names if old != new]
    top = max((value for value in values if value is not None), default=0.0) or 1.0
    size = len(names) * CELL
    parts = [f'<svg class="heatmap" data-metric="{metric}" role="img" '
             f'aria-label="{escape(label)} matrix" '
             f'width="{LABEL_WIDTH + size}" height="{HEADER_HEIGHT + size}" '
             f'viewBox="0 0 {LABEL_WIDTH + size} {HEADER_HEIGHT + size}">',
             f'<text class="axis" x="{LABEL_WIDTH - 8}" y="14" text-anchor="end">old ↓ new →'
             "</text>"]
    for j, name in enumerate(names):
        parts.append(f'<text class="axis" x="{LABEL_WIDTH + j * CELL + CELL / 2}" '
                     f'y="{HEADER_HEIGHT - 10}" text-anchor="middle">{escape(name)}</text>')
    for i, old in enumerate(names):
        y = HEADER_HEIGHT + i * CELL
        parts.append(f'<text class="axis" x="{LABEL_WIDTH - 8}" y="{y + CELL / 2 + 4}" '
                     f'text-anchor="end">{escape(old)}</text>')
        parts += [_cell(matrix, metric, label, old, new, LABEL_WIDTH + j * CELL, y, top)
                  for j, new in enumerate(names)]
    parts.append("</svg>")
    return "".join(parts)


def _cell(matrix: Matrix, metric: str, label: str, old: str, new: str, x: float, y: float,
          top: float) -> str:
    """One cell: a coloured rect with its title, and the value as text."""
    if old == new:
        return _rect(x, y, DIAGONAL, "")
    value = matrix.value(old, new, metric)
    if value is None:
        return _rect(x, y, EMPTY, f"<title>{escape(old)} → {escape(new)}: not measured</title>")
    title = f"<title>{escape(old)} → {escape(new)}: {label} {value:.4f}</title>"
    share = value / top
    ink = "#fff" if share > 0.55 else "#24292e"
    return (f'<g class="cell" data-old="{escape(old)}" data-new="{escape(new)}" '
            f'data-value="{value!r}">{_rect(x, y, _shade(share), title)}'
            f'<text x="{x + CELL / 2}" y="{y + CELL / 2 + 4}" text-anchor="middle" '
            f'fill="{ink}">{value:.3f}</text></g>')


def _rect(x: float, y: float, fill: str, title: str) -> str:
    return (f'<rect x="{x + 1}" y="{y + 1}" width="{CELL - 2}" height="{CELL - 2}" rx="3" '
            f'fill="{fill}">{title}</rect>')


def _shade(share: float) -> str:
    """White (0) to deep red (the largest value of the matrix)."""
    low, high = (255, 245, 240), (165, 15, 21)
    rgb = (round(a + (b - a) * min(max(share, 0.0), 1.0)) for a, b in zip(low, high, strict=True))
    return "#{:02x}{:02x}{:02x}".format(*rgb)
