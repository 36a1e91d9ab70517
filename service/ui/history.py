"""A line's history as an SVG plot: error rate (left axis) and NFR (right axis, its own scale:
an NFR of 0.0156 under a limit of 0.01 is not flattened by error rates ten times larger) of
every version against its baseline, the policy's NFR limit as a dashed line on NFR's axis,
blocked versions on a red band and the production version marked. Each point carries its
value (data-value) and a <title>."""

from html import escape
from math import ceil, log10

from service.ui.numbers import limit as limit_text
from service.ui.numbers import percent, percent_tick
from service.ui.queries import HistoryRow

WIDTH, HEIGHT = 960, 260
LEFT, RIGHT, TOP, BOTTOM = 52, 56, 26, 40
MAX_X_LABELS = 16
SERIES = (("er_new", "error rate", "#0b5cad"), ("nfr", "NFR", "#bc4c00"))  # left, right axis


def history_svg(rows: list[HistoryRow], limits: dict[str, float]) -> str:
    """The plot of `rows` (one per version, in order); `limits`: the policy's fixed limits."""
    step = (WIDTH - LEFT - RIGHT) / max(len(rows), 1)
    xs = [LEFT + step * (index + 0.5) for index in range(len(rows))]
    scales = {key: _scale(rows, key, limits.get(key)) for key, _, _ in SERIES}
    parts = [f'<svg class="history" role="img" aria-label="error rate and NFR per version" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="xMinYMin meet">']
    parts += [_band(row, x, step) for row, x in zip(rows, xs, strict=True) if row.blocked]
    for (key, _, _), side in zip(SERIES, ("left", "right"), strict=True):
        parts += _axis(scales[key], side)
    if "nfr" in limits:
        parts.append(_limit_line(limits["nfr"], scales["nfr"]))
    for key, label, colour in SERIES:
        parts.append(_series(rows, xs, key, label, colour, scales[key]))
    parts += _x_labels(rows, xs)
    parts.append(_legend())
    parts.append("</svg>")
    return "".join(parts)


def nice(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten at or above `value` (> 0)."""
    if value <= 0:
        return 0.1
    power = 10.0 ** ceil(log10(value) - 1)
    return next(power * m for m in (1, 2, 2.5, 5, 10) if power * m >= value * (1 - 1e-9))


class Scale:
    """A vertical axis from 0 to `top`: a value's y in the plot."""

    def __init__(self, top: float) -> None:
        self.top = top

    def __call__(self, value: float) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - value / self.top)


def _scale(rows: list[HistoryRow], key: str, limit: float | None) -> Scale:
    """The axis of `key`: up to its largest value, and a quarter above its limit."""
    values = [value for row in rows if (value := row.metric(key)) is not None]
    return Scale(nice(max([*values, *([1.25 * limit] if limit else [])], default=0.0)))


def _axis(y: Scale, side: str) -> list[str]:
    """Five ticks with their values (in their series' colour, dashboard.css), on the left or
    the right (the left one draws the grid lines)."""
    x, anchor = (LEFT - 6, "end") if side == "left" else (WIDTH - RIGHT + 6, "start")
    parts = []
    for tick in range(5):
        value = y.top * tick / 4
        if side == "left":
            parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" '
                         f'y1="{y(value):.1f}" y2="{y(value):.1f}"/>')
        parts.append(f'<text class="axis" data-side="{side}" x="{x}" y="{y(value) + 4:.1f}" '
                     f'text-anchor="{anchor}">{percent_tick(value)}</text>')
    return parts


def _band(row: HistoryRow, x: float, step: float) -> str:
    """The red band behind a blocked version."""
    return (f'<rect class="blocked" data-version="{escape(row.version)}" x="{x - step / 2:.1f}" '
            f'y="{TOP}" width="{step:.1f}" height="{HEIGHT - TOP - BOTTOM}">'
            f'<title>{escape(row.version)}: blocked</title></rect>')


def _limit_line(limit: float, y: Scale) -> str:
    return (f'<line class="limit" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(limit):.1f}" '
            f'y2="{y(limit):.1f}"/><text class="limit-label" x="{WIDTH - RIGHT}" '
            f'y="{y(limit) - 4:.1f}" text-anchor="end">policy max NFR '
            f'{limit_text("max_nfr", limit)}</text>')


def _series(rows: list[HistoryRow], xs: list[float], key: str, label: str, colour: str,
            y: Scale) -> str:
    """One metric's line through the versions that have it, and its points."""
    points = [(row, x, value) for row, x in zip(rows, xs, strict=True)
              if (value := row.metric(key)) is not None]
    path = " ".join(f"{x:.1f},{y(value):.1f}" for _, x, value in points)
    dots = "".join(
        f'<circle class="point{" blocked" if row.blocked else ""}" data-series="{key}" '
        f'data-version="{escape(row.version)}" data-value="{value!r}" cx="{x:.1f}" '
        f'cy="{y(value):.1f}" r="3.5" fill="{"#fff" if row.blocked else colour}" '
        f'stroke="{colour}"><title>{escape(row.version)}: {label} {percent(value)}'
        f'{" (blocked)" if row.blocked else ""}</title></circle>' for row, x, value in points)
    return (f'<g class="series" data-series="{key}"><polyline points="{path}" fill="none" '
            f'stroke="{colour}" stroke-width="1.5"/>{dots}</g>')


def _x_labels(rows: list[HistoryRow], xs: list[float]) -> list[str]:
    """Every k-th version's name under the axis (k keeps at most MAX_X_LABELS), and the
    production version's marker."""
    every = ceil(len(rows) / MAX_X_LABELS) if rows else 1
    parts = []
    for index, (row, x) in enumerate(zip(rows, xs, strict=True)):
        if index % every == 0 or index == len(rows) - 1:
            parts.append(f'<text class="axis" x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" '
                         f'text-anchor="middle">{escape(_short(row.version))}</text>')
        if row.production:
            parts.append(f'<g class="production" data-version="{escape(row.version)}">'
                         f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP - 4}" '
                         f'y2="{HEIGHT - BOTTOM}"/><text x="{x:.1f}" y="{TOP - 8}" '
                         f'text-anchor="{_anchor(x)}">production</text></g>')
    return parts


def _anchor(x: float) -> str:
    """Where a label at `x` over the plot hangs from, so that it stays inside the plot."""
    return "end" if x > WIDTH - RIGHT - 40 else "start" if x < LEFT + 40 else "middle"


def _legend() -> str:
    items = "".join(f'<tspan fill="{colour}">● {label} ({side} axis)</tspan>  '
                    for (_, label, colour), side in zip(SERIES, ("left", "right"), strict=True))
    return (f'<text class="legend" x="{LEFT}" y="{HEIGHT - 6}">{items}<tspan class="muted">'
            "○ blocked (red band)  — dashed: the policy's limit</tspan></text>")


def _short(name: str, width: int = 10) -> str:
    """`name`, cut to `width` characters with an ellipsis."""
    return name if len(name) <= width else name[:width - 1] + "…"
