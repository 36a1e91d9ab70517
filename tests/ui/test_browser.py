"""The dashboard in a real headless Chromium (Debian's `chromium`, driven by Playwright) on
`flipgate serve` (embedded: SQLite, folder broker, its own worker), with three classifiers of
scikit-learn's 8x8 digits: sign in, read the line's heatmap and check it against
flipgate.metrics, count the pair's gallery images against its negative flips, and find the
blocked decision's reason.

Set DASHBOARD_SCREENSHOT_DIR to keep the pages' screenshots there (docs/dashboard.md shows
docs/dashboard-line.png, taken this way).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from flipgate.datasets import save_evalset
from flipgate.formats.evalsets import EvalSet
from flipgate.inference import OnnxClassifier
from flipgate.metrics import compare_logits
from flipgate.processes import free_port
from tests.conftest import linear_onnx
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for
from tests.ui.conftest import RATE, as_rate

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.slow

TOKEN = "browser-admin-token-0123456789"
MAX_NFR = 0.03
TRAINING_SAMPLES = {"1": 20, "2": 100, "3": 2}  # per class; version 3 is worse: blocked


def chromium() -> str:
    """Debian's chromium; missing fails the test in CI (scripts/dev.py installs it)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI must test the dashboard in a browser", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture
def digits(tmp_path) -> dict[str, Path]:
    """An eval set of 8x8 digit images and three logistic-regression classifiers as ONNX."""
    data = load_digits()
    x, y = (data.images / 16.0).astype(np.float32), data.target
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:1200], order[1200:]
    files = {"eval": save_evalset(EvalSet(x[test], y[test]), tmp_path / "eval.npz")}
    for version, per_class in TRAINING_SAMPLES.items():
        chosen = np.concatenate([train[y[train] == c][:per_class] for c in range(10)])
        model = LogisticRegression(max_iter=300).fit(x[chosen].reshape(len(chosen), -1),
                                                     y[chosen])
        files[version] = linear_onnx(tmp_path / f"v{version}.onnx", model.coef_.T,
                                     model.intercept_, ("N", 8, 8))
    return files


@pytest.fixture
def server(tmp_path, digits) -> tuple[str, str]:
    """The server's address and a read-only token, after gating 1 (approved, promoted),
    2 and 3 (blocked) under max_nfr and measuring every pair."""
    port, env = free_port(), flipgate_env(FLIPGATE_DATA_DIR=str(tmp_path / "data"),
                                          FLIPGATE_ADMIN_TOKEN=TOKEN)
    base = f"http://127.0.0.1:{port}"
    with (flipgate_process(["serve", "--port", str(port)], env, tmp_path),
          httpx.Client(base_url=base, timeout=60,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        wait_for(lambda: ready(client), "/readyz")
        populate(client, digits)
        yield base, read_token(env, tmp_path)


def ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def populate(client: httpx.Client, digits: dict[str, Path]) -> None:
    created = client.post("/evalsets", data={"name": "eval"},
                          files={"data": ("eval.npz", digits["eval"].read_bytes())})
    assert created.status_code == 201, created.text
    for version, per_class in TRAINING_SAMPLES.items():
        fields = {"name": "digits", "version": version,
                  "metadata": json.dumps({"model": "logistic regression",
                                          "training_samples": 10 * per_class})}
        fields |= {"parent": "digits:1"} if version != "1" else {}
        response = client.post("/models", data=fields,
                               files={"artifact": ("m.onnx", digits[version].read_bytes())})
        assert response.status_code == 201, response.text
    assert gate(client, "1")["verdict"] == "approve"
    assert client.post("/models/digits/aliases/production", json={"version": "1"}).is_success
    assert client.put("/models/digits/policy",
                      json={"max_nfr": MAX_NFR, "evalsets": ["eval"]}).is_success
    assert gate(client, "2")["verdict"] == "approve"
    assert gate(client, "3")["verdict"] == "block"
    matrix, params = "/models/digits/matrix", {"evalset": "eval"}
    assert client.post(matrix, params=params).is_success  # queues the pairs not yet counted
    wait_for(lambda: not client.get(matrix, params=params).json()["missing"],
             "the line's whole matrix", 180)


def gate(client: httpx.Client, candidate: str) -> dict:
    """The gate's final decision on `candidate`."""
    decision = client.post("/gate", json={"model": "digits", "candidate": candidate}).json()
    path = f"/gate/decisions/{decision['decision_id']}"
    return wait_for(lambda: (body := client.get(path).json())["verdict"] != "pending" and body,
                    f"decision on {candidate}", 180)


def read_token(env: dict[str, str], cwd: Path) -> str:
    """A token with the read scope only, minted with `flipgate token create`."""
    done = subprocess.run([sys.executable, "-m", "flipgate.cli", "token", "create", "--name",
                           "viewer", "--scopes", "read"], env=env, cwd=cwd, check=True,
                          capture_output=True, text=True)
    return done.stdout.splitlines()[0]


@contextmanager
def chromium_browser() -> Iterator[Any]:
    """Debian's chromium, headless, driven by Playwright; closed afterwards."""
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), headless=True,
                                         args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(server):
    with chromium_browser() as browser:
        yield browser.new_page(viewport={"width": 1280, "height": 900})


def expected_metrics(digits: dict[str, Path]) -> dict[tuple[str, str], dict]:
    """compare_logits of every ordered pair of versions on the eval set, as flipgate computes
    them from the ONNX models."""
    with np.load(digits["eval"]) as data:
        x, y = data["x"], data["y"]
    logits = {version: OnnxClassifier(digits[version]).predict(x) for version in TRAINING_SAMPLES}
    return {(old, new): compare_logits(logits[old], logits[new], y)
            for old in logits for new in logits if old != new}


def test_dashboard_in_a_browser(server, page, digits, tmp_path):
    base, token = server
    expected = expected_metrics(digits)
    sign_in(page, base, token)

    page.get_by_role("link", name="digits", exact=True).click()
    page.wait_for_url(re.compile(r"/ui/lines/digits"))
    for metric in ("nfr", "churn"):
        shown = heatmap_titles(page, metric)
        assert len(shown) == 6
        for (old, new), value in shown.items():
            assert value == pytest.approx(expected[old, new][metric], abs=5e-5), (metric, old, new)
    save_screenshot(page, tmp_path, "dashboard-line.png")

    shots = Path(os.environ.get("DASHBOARD_SCREENSHOT_DIR") or tmp_path)
    assert layout_faults(page, base + "/ui/lines/digits", shots) == {}
    page.locator('svg.heatmap[data-metric="nfr"] a[href*="/pairs/1/3"]').click()
    page.wait_for_url(re.compile(r"/pairs/1/3"))
    save_screenshot(page, tmp_path, "dashboard-pair.png")
    images = count_gallery_images(page)
    assert images == expected["1", "3"]["negative_flips"] > 48  # more than one page

    page.goto(base + "/ui/lines/digits")
    page.locator("#decision-log tr", has=page.locator(".verdict-block")).get_by_role(
        "link").first.click()
    page.wait_for_url(re.compile(r"/ui/decisions/\d+"))
    save_screenshot(page, tmp_path, "dashboard-decision.png")
    reason = page.locator("#reasons tr.blocking")
    assert reason.locator("code").inner_text() == "max_nfr"
    measured = as_rate(reason.locator("td.num").first.inner_text())
    assert measured == pytest.approx(expected["1", "3"]["nfr"], abs=5e-5) and measured > MAX_NFR
    decision = page.url.removeprefix(base)
    assert layout_faults(page, base + decision, shots) == {}
    for path in ("/ui", "/ui/lines/digits?versions=all",
                 "/ui/lines/digits/pairs/1/3?evalset=eval", "/ui/jobs", "/ui/no-such-page"):
        assert layout_faults(page, base + path) == {}, path


NEVER_BROKEN = "td.num, th.num, .badge, .tag, time, .version"  # each on one line
BROKEN_TEXT = """els => els.filter(el => {
  const range = document.createRange();
  range.selectNodeContents(el);
  return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1;
}).map(el => el.textContent.trim())"""
BROKEN_WORDS = """() => [...document.querySelectorAll('main *')].filter(el => {
  const text = el.textContent.trim();  // one word (a number, a name) drawn on two lines
  if (el.children.length || !text || /\\s/.test(text) || !el.getClientRects().length) return false;
  const range = document.createRange();
  range.selectNodeContents(el);
  return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1;
}).map(el => el.textContent.trim())"""
SMALL_TEXT = """() => [...document.querySelectorAll('body *')].filter(el => {
  const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
  if (!own || !el.getClientRects().length) return false;
  const matrix = el instanceof SVGElement && el.getScreenCTM();  // (turned text too)
  const scale = matrix ? Math.hypot(matrix.a, matrix.b) : 1;
  return parseFloat(getComputedStyle(el).fontSize) * scale < 9.95;
}).map(el => el.textContent.trim().slice(0, 20))"""
CLIPPED_PLOTS = """svgs => svgs.filter(svg => {  // wider than its box, which does not scroll
  const box = svg.closest('.scroll') || svg.parentElement;
  const scrolls = ['auto', 'scroll'].includes(getComputedStyle(box).overflowX);
  const right = Math.min(box.getBoundingClientRect().right, window.innerWidth);
  return svg.getBoundingClientRect().right > right + 1 && !scrolls;
}).map(svg => svg.getAttribute('class'))"""


COVERED_WORDS = """() => {
  const meets = (a, b) => a.left < b.right - 1 && b.left < a.right - 1
                          && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const found = [];
  for (const svg of document.querySelectorAll("svg.history, svg.repair-curve")) {
    const texts = [...svg.querySelectorAll("text")].filter(t => t.textContent.trim());
    const boxes = texts.map(t => t.getBoundingClientRect());
    const frame = svg.getBoundingClientRect();
    texts.forEach((t, i) => {
      if (boxes[i].left < frame.left - 1 || boxes[i].right > frame.right + 1)
        found.push([t.textContent, "cut off"]);
    });
    for (let i = 0; i < texts.length; i++)
      for (let j = i + 1; j < texts.length; j++)
        if (meets(boxes[i], boxes[j])) found.push([texts[i].textContent, texts[j].textContent]);
  }
  for (const legend of document.querySelectorAll("p.legend")) {
    const swatches = [...legend.querySelectorAll(".swatch")].map(s => s.getBoundingClientRect());
    const walker = document.createTreeWalker(legend, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const box of range.getClientRects())
        if (node.textContent.trim() && swatches.some(s => meets(s, box)))
          found.push([node.textContent.trim()]);
    }
  }
  return found;
}"""  # words drawn over each other or cut off in a plot, or under a legend's swatch


def layout_faults(page, url: str, shots: Path | None = None) -> dict[int, dict]:
    """At 390 and 1440 px, what breaks the page's layout, by window width (nothing: it
    holds): the page wider than the window (its scrollWidth), numbers, badges, version
    names or timestamps drawn on more than one line (their text), any one word (a number, a
    name) broken across lines, text drawn under 10 px (an SVG's scaled down with it),
    plots wider than their box where it does not scroll, and words drawn over other words
    or under a legend's swatch. With `shots`, a full-page
    screenshot of each width is written there."""
    faults = {}
    for width in (390, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(url)
        found = {"wider": page.evaluate("document.documentElement.scrollWidth"),
                 "broken": page.locator(NEVER_BROKEN).evaluate_all(BROKEN_TEXT),
                 "broken words": page.evaluate(BROKEN_WORDS),
                 "under 10 px": page.evaluate(SMALL_TEXT),
                 "clipped": page.locator("svg.history, svg.repair-curve").evaluate_all(
                     CLIPPED_PLOTS),
                 "covered words": page.evaluate(COVERED_WORDS)}
        if found["wider"] <= width:
            del found["wider"]
        if found := {key: value for key, value in found.items() if value}:
            faults[width] = found
        if shots:
            name = re.sub(r"\W+", "-", url.split("/ui", 1)[1]).strip("-") or "home"
            page.screenshot(path=shots / f"{name}-{width}.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    return faults


def sign_in(page, base: str, token: str) -> None:
    """Open the server, get sent to the sign-in page, sign in and land on the lines page."""
    page.goto(base + "/")
    page.wait_for_url(re.compile(r"/ui/signin"))
    page.fill("#token", token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/ui$"))
    cookie = next(c for c in page.context.cookies() if c["name"] == "flipgate_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
    assert page.evaluate("document.cookie") == ""  # not readable by scripts


def heatmap_titles(page, metric: str) -> dict[tuple[str, str], float]:
    """{(old, new): value} read from the hover titles of the heatmap's cells."""
    titles = page.locator(f'svg.heatmap[data-metric="{metric}"] a.cell title').all_text_contents()
    title_form = re.compile(rf"(\S+) → (\S+): \S+ {RATE}(?: \(above the limit\))?"
                            r"(?: \(a move of production\))?")
    parsed = [title_form.fullmatch(title) for title in titles]
    return {(m.group(1), m.group(2)): as_rate(m.group(3)) for m in parsed}


def count_gallery_images(page) -> int:
    """Decoded gallery images over every page of the gallery."""
    total = 0
    while True:
        images = page.locator("ul.gallery li.flip img")
        widths = images.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        assert widths and set(widths) == {8}, widths  # every PNG decodes to 8 x 8
        total += len(widths)
        following = page.locator('#flips .pager a[rel="next"]')
        if not following.count():
            return total
        following.click()
        page.wait_for_load_state()


def save_screenshot(page, tmp_path: Path, name: str) -> None:
    """The page as a PNG in tmp_path, and under $DASHBOARD_SCREENSHOT_DIR when set."""
    shot = page.screenshot(full_page=True)
    (tmp_path / name).write_bytes(shot)
    if folder := os.environ.get("DASHBOARD_SCREENSHOT_DIR"):
        (Path(folder) / name).write_bytes(shot)
