"""Human-readable reports of one old/new comparison: rich terminal output and an HTML page.

`render_html` is imported lazily: its page's tables, gallery and SVG charts
(flipgate.reporting.charts) are modules that a terminal-only caller does not need.
"""

from typing import TYPE_CHECKING, Any

from flipgate.reporting.terminal import render_report, verdict_hints

if TYPE_CHECKING:
    from flipgate.reporting.html import render_html

__all__ = ["render_html", "render_report", "verdict_hints"]


def __getattr__(name: str) -> Any:
    if name == "render_html":
        from flipgate.reporting.html import render_html

        return render_html
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
