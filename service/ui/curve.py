"""The curve an interpolation or ensemble repair chose its share on, as an SVG plot: the
calibration set's error rate and NFR (against the baseline) at each share of the baseline,
the NFR limit dashed and the chosen share marked. Each point carries its values (data-*)."""

from typing import Any

from service.ui.history import nice
from service.ui.numbers import limit as limit_text
from service.ui.numbers import percent, percent_tick

WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 40, 40
LEGEND_Y = 14  # the legend's row, above the chosen share's label (TOP - 8): never over it
SERIES = (("er", "error rate", "#0b5cad"), ("nfr", "NFR", "#bc4c00"))


def repair_curve_svg(curve: list[dict[str, Any]], share: float,
                     limits: dict[str, Any] | None) -> str:
    """The plot of `curve` (points {share, er, nfr, ...} in order of share) with `share`, the
    chosen one, marked and `limits`' max_nfr drawn."""
    max_nfr = (limits or {}).get("max_nfr")
    top = nice(max([*(point[key] for point in curve for key, _, _ in SERIES),
                    *([1.25 * max_nfr] if max_nfr is not None else [])], default=0.0))

    def x(value: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * value

    def y(value: float) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - value / top)

    parts = [f'<svg class="repair-curve" role="img" aria-label="error rate and NFR on the '
             f'calibration set per share of the baseline" viewBox="0 0 {WIDTH} {HEIGHT}">']
    for tick in range(5):
        value = top * tick / 4
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" '
                     f'y2="{y(value):.1f}"/><text class="axis" x="{LEFT - 6}" '
                     f'y="{y(value) + 4:.1f}" text-anchor="end">{percent_tick(value)}</text>')
    for tick in range(0, 11, 2):
        parts.append(f'<text class="axis" x="{x(tick / 10):.1f}" y="{HEIGHT - BOTTOM + 16}" '
                     f'text-anchor="middle">{tick / 10:g}</text>')
    if max_nfr is not None:
        parts.append(f'<line class="limit" x1="{LEFT}" x2="{WIDTH - RIGHT}" '
                     f'y1="{y(max_nfr):.1f}" y2="{y(max_nfr):.1f}"/><text class="limit-label" '
                     f'x="{WIDTH - RIGHT}" y="{y(max_nfr) - 4:.1f}" text-anchor="end">'
                     f"max NFR {limit_text('max_nfr', max_nfr)}</text>")
    parts.append(f'<g class="chosen" data-share="{share!r}"><line x1="{x(share):.1f}" '
                 f'x2="{x(share):.1f}" y1="{TOP - 4}" y2="{HEIGHT - BOTTOM}"/>'
                 f'<text x="{x(share):.1f}" y="{TOP - 8}" text-anchor="{_anchor(share)}">'
                 f"chosen {share:.3g}</text></g>")
    parts += [_series(curve, key, label, colour, x, y) for key, label, colour in SERIES]
    parts.append(f'<text class="legend" x="{LEFT + 4}" y="{LEGEND_Y}">' + "".join(
        f'<tspan fill="{colour}">● {label}  </tspan>' for _, label, colour in SERIES) + "</text>")
    parts.append(f'<text class="axis" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" '
                 "text-anchor=\"middle\">the baseline's share (0: the candidate alone, "
                 "1: the baseline alone)</text></svg>")
    return "".join(parts)


def _anchor(share: float) -> str:
    """Where the chosen share's label hangs from, so that it stays inside the plot."""
    return "start" if share < 0.1 else "end" if share > 0.9 else "middle"


def _series(curve: list[dict[str, Any]], key: str, label: str, colour: str, x, y) -> str:
    """One metric's line over the shares, and its points."""
    path = " ".join(f"{x(point['share']):.1f},{y(point[key]):.1f}" for point in curve)
    dots = "".join(
        f'<circle class="point" data-series="{key}" data-share="{point["share"]!r}" '
        f'data-value="{point[key]!r}" cx="{x(point["share"]):.1f}" cy="{y(point[key]):.1f}" '
        f'r="3" fill="{colour}"><title>share {point["share"]:.3g}: {label} '
        f"{percent(point[key])}</title></circle>" for point in curve)
    return (f'<g class="series" data-series="{key}"><polyline points="{path}" fill="none" '
            f'stroke="{colour}" stroke-width="1.5"/>{dots}</g>')
