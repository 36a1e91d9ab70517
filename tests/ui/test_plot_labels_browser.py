"""The repair curve's words in Chromium: its legend, the chosen share's label and the limit's
never drawn over one another nor cut off by the plot's edge, wherever the share falls
(the SVG rendered by service/ui/curve.py, with the dashboard's style sheet, no server)."""

from pathlib import Path

import pytest

from service.ui.curve import repair_curve_svg
from tests.ui.test_browser import COVERED_WORDS, chromium_browser

pytestmark = pytest.mark.slow

STYLE = Path(__file__).parents[2] / "service" / "ui" / "static" / "dashboard.css"
SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)


def curve() -> list[dict]:
    """A calibration curve whose NFR falls and error rate rises with the baseline's share."""
    return [{"share": share, "er": 0.2 + 0.05 * share, "nfr": 0.06 * (1 - share),
             "churn": 0.1 * (1 - share), "er_increase": 0.05 * share} for share in SHARES]


@pytest.mark.parametrize("width", [390, 1440])
def test_the_repair_curves_words_never_cover_each_other(width):
    with chromium_browser() as browser:
        page = browser.new_page(viewport={"width": width, "height": 900})
        for share in SHARES:
            svg = repair_curve_svg(curve(), share, {"max_nfr": 0.01})
            page.set_content(f"<style>{STYLE.read_text()}</style><main><div class=scroll>"
                             f"<figure class=repair-plot>{svg}</figure></div></main>")
            assert page.evaluate(COVERED_WORDS) == [], share
