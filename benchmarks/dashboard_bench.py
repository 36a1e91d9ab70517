"""Load times of the dashboard's pages on a line after a year of updates, against the 300 ms
budget (issue 22).

    python benchmarks/dashboard_bench.py [--loads 5]

Builds the 36-version line of tests/ui/test_long_history_browser.py (a live server on a
migrated SQLite store, nothing trained), signs in with headless Chromium (Debian's
`chromium`) and loads each page --loads times at 1440 px. Printed per page: the best and
median time from navigation start to the load event, the bytes transferred (gzip), and the
best time / budget.
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import sync_playwright

from tests.ui.test_browser import chromium, sign_in
from tests.ui.test_long_history_browser import long_history_site, pages

BUDGET_MS = 300


def load_time(page, url: str) -> tuple[float, int]:
    """Milliseconds from navigation start to the load event, and the bytes transferred."""
    page.goto(url)
    entry = page.evaluate("(() => { const n = performance.getEntriesByType('navigation')[0];"
                          " return [n.loadEventEnd - n.startTime, n.transferSize]; })()")
    return entry[0], entry[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=5, help="loads of each page")
    args = parser.parse_args()
    with (tempfile.TemporaryDirectory() as folder, long_history_site(Path(folder)) as site,
          sync_playwright() as driver):
        browser = driver.chromium.launch(executable_path=chromium(), headless=True,
                                         args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
        sign_in(page, site.url, site.token)
        print(f"{'page':<46} {'best':>7} {'median':>7} {'gzip':>7} {'/budget':>8}")
        for path in pages(site)[:-1]:
            runs = [load_time(page, site.url + path) for _ in range(args.loads)]
            times = [ms for ms, _ in runs]
            print(f"{path:<46} {min(times):5.0f}ms {statistics.median(times):5.0f}ms "
                  f"{runs[-1][1] / 1024:5.0f}KiB {min(times) / BUDGET_MS:7.2f}x")
        browser.close()


if __name__ == "__main__":
    main()
