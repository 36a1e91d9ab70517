"""The dashboard of a traffic set in a real headless Chromium (Debian's `chromium`, driven by
Playwright) on `flipgate serve` (embedded: SQLite, folder broker, its own worker), signed in
as the server admin: the line's matrix shows NFR as unknown (never a number on the scale)
while the API says null, the pair page draws the known negative flips of (8, 8) digits and
downloads the disagreements' CSV with a file name, the pending decision tables its numbers
and does not reload, the gate's report_url and a decision reached by its id open from
another project, and every page reads at 390 and 1440 px (with DASHBOARD_SCREENSHOT_DIR set,
the screenshots of docs/dashboard.md are written there).

The scenario is tests/ui/test_traffic_pages.py's, over HTTP with the server's worker."""

import io
import os
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from flipgate.processes import free_port
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for
from tests.traffic_digits import digits_files
from tests.ui.conftest import as_rate
from tests.ui.test_browser import chromium_browser, layout_faults, ready, sign_in

pytestmark = pytest.mark.slow

TOKEN = "traffic-browser-admin-token-0123456789"
LINE, TRAFFIC, OTHER_PROJECT = "digits", "traffic", "beta"
PAIR = {"params": {"evalset": TRAFFIC}}
KNOWN_NEGATIVE = 2  # the first 12 disagreements are labelled, more until 2 flips are known


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> tuple[str, dict]:
    """The server's address and what the API says (decision, report, matrix) once the
    scenario is in place (once for the module's tests, which only read)."""
    tmp_path = tmp_path_factory.mktemp("traffic-browser")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = flipgate_env(FLIPGATE_DATA_DIR=str(tmp_path / "data"), FLIPGATE_ADMIN_TOKEN=TOKEN,
                       FLIPGATE_PUBLIC_URL=base)  # the gate's links are absolute, as in CI
    with (flipgate_process(["serve", "--port", str(port)], env, tmp_path),
          httpx.Client(base_url=base, timeout=60,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        wait_for(lambda: ready(client), "/readyz")
        yield base, populate(client, tmp_path)


def populate(client: httpx.Client, folder: Path) -> dict:
    """A second project; line `digits` with external versions old (production) and new on
    the traffic set; the first disagreements labelled; a policy and the pending gate."""
    assert client.post("/projects", json={"name": OTHER_PROJECT}).status_code == 201
    digits = digits_files(folder)
    with np.load(digits.traffic) as data:
        np.savez(folder / "drawn.npz", x=data["x"].reshape(-1, 8, 8), ids=data["ids"])
    assert client.post("/evalsets", data={"name": TRAFFIC}, files={
        "data": ("drawn.npz", (folder / "drawn.npz").read_bytes())}).status_code == 201
    for version, logits in (("old", digits.old), ("new", digits.new)):
        assert client.post("/models", data={"name": LINE, "version": version,
                                            "num_classes": "10"}).status_code == 201
        assert client.post(f"/models/{LINE}/versions/{version}/predictions",
                           data={"evalset": TRAFFIC},
                           files={"logits": ("l.npy", logits.read_bytes())}).status_code == 201
    assert client.post("/gate", json={"model": LINE, "candidate": "old"}).is_success
    assert client.post(f"/models/{LINE}/aliases/production", json={"version": "old"}).is_success
    order = np.array([row["index"] for row in measured(client, "disagreements")])
    negative = (digits.old_pred[order] == digits.truth[order]) & \
        (digits.new_pred[order] != digits.truth[order])
    labelled = order[:max(12, int(np.flatnonzero(negative)[KNOWN_NEGATIVE - 1]) + 1)]
    buffer = folder / "labels.npz"
    np.savez(buffer, index=labelled, y=digits.truth[labelled])
    assert client.post(f"/evalsets/{TRAFFIC}/labels", files={
        "labels": ("labels.npz", buffer.read_bytes())}).status_code == 201
    report = wait_for(lambda: (body := measured(client))["label_revision"] == 1 and body,
                      "the report with the labels", 120)
    low, high = report["disagreements"]["nfr_interval"]
    assert client.put(f"/models/{LINE}/policy", json={
        "max_nfr": round((low + high) / 2, 6), "evalsets": [TRAFFIC]}).is_success
    decision = client.post("/gate", json={"model": LINE, "candidate": "new"}).json()
    assert decision["verdict"] == "pending" and decision["labels_needed"], decision
    matrix = f"/models/{LINE}/matrix"
    assert client.post(matrix, **PAIR).is_success
    wait_for(lambda: not client.get(matrix, **PAIR).json()["missing"], "the matrix", 120)
    return {"decision": decision, "report": report, "matrix": client.get(matrix, **PAIR).json()}


def measured(client: httpx.Client, what: str = "") -> dict | list:
    """The stored report of old → new on the traffic set (or its export), once measured."""
    path = f"/compare/{LINE}:old/{LINE}:new" + (f"/{what}" if what else "")
    client.post(f"/compare/{LINE}:old/{LINE}:new", **PAIR)
    answer = wait_for(lambda: (got := client.get(path, **PAIR)).status_code == 200 and got,
                      "the pair's report", 120)
    return answer.json()


@pytest.fixture
def page(server):
    """A Chromium page signed in as the server admin (remembered project: `default`)."""
    with chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900}, accept_downloads=True)
        sign_in(page, server[0], TOKEN)
        yield page


def test_the_matrix_shows_nfr_unknown_where_the_api_says_null(server, page):
    base, api = server
    low, high = api["report"]["disagreements"]["nfr_interval"]
    page.goto(f"{base}/ui/lines/{LINE}")  # NFR unknown, off the scale; churn the API's
    assert api["matrix"]["nfr"][0][1] is None
    cell = page.locator('svg.heatmap[data-metric="nfr"] a.cell[data-old="old"][data-new="new"]')
    assert cell.get_attribute("data-value") == "unknown"
    assert cell.locator("rect").get_attribute("fill") == "#c9ced6"
    assert f"95% interval {100 * low:.2f}% – {100 * high:.2f}%" in cell.locator(
        "title").text_content()
    churn = page.locator('svg.heatmap[data-metric="churn"] a.cell[data-old="old"][data-new="new"]')
    assert float(churn.get_attribute("data-value")) == api["matrix"]["churn"][0][1]


def test_the_traffic_pages_tell_the_labelling_story(server, page, tmp_path):
    base, api = server
    low, high = api["report"]["disagreements"]["nfr_interval"]
    page.goto(f"{base}/ui/lines/{LINE}/pairs/old/new?evalset={TRAFFIC}")
    known = api["report"]["disagreements"]["negative_flips_known"]
    assert page.locator("#flips h2").inner_text() == f"Known negative flips ({known})"
    widths = page.locator("ul.gallery li.flip img").evaluate_all(
        "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert widths == [8] * known and known >= KNOWN_NEGATIVE
    with page.expect_download() as download:
        page.locator('a[data-format="csv"]').click()
    saved = tmp_path / "export.csv"
    download.value.save_as(saved)
    assert download.value.suggested_filename == "digits-old-new-traffic-disagreements.csv"
    assert len(saved.read_text().splitlines()) == 1 + api["report"]["disagreements"]["count"]

    decision = api["decision"]["decision_id"]
    page.goto(f"{base}/ui/decisions/{decision}")
    assert page.locator('meta[http-equiv="refresh"]').count() == 0
    row = page.locator(f'#labelling tr[data-evalset="{TRAFFIC}"]')
    assert row.locator('[data-key="nfr_interval"]').inner_text() == (
        f"{100 * low:.2f}% – {100 * high:.2f}%")
    estimate = api["decision"]["metrics"][TRAFFIC]["nfr_estimate"]
    assert as_rate(row.locator('[data-key="nfr_estimate"]').inner_text()) == pytest.approx(
        estimate, abs=5e-5)
    limit = api["decision"]["policy"]["max_nfr"]
    assert as_rate(row.locator('[data-key="max_nfr"]').inner_text()) == pytest.approx(
        limit, abs=5e-5)
    unlabelled = api["report"]["disagreements"]["count"] - api["report"]["disagreements"][
        "labelled"]
    assert row.locator('[data-key="unlabelled"]').inner_text().startswith(f"{unlabelled} ")


def test_links_open_from_ci_and_across_projects(server, page):
    base, api = server
    decision = api["decision"]["decision_id"]
    page.goto(f"{base}/ui?project={OTHER_PROJECT}")  # remembered: the CI link opens anyway
    page.goto(api["decision"]["report_url"])
    assert page.locator("h1").inner_text().startswith(f"Decision #{decision}")
    page.goto(f"{base}/ui?project={OTHER_PROJECT}")
    page.goto(f"{base}/ui/decisions/{decision}")  # by its id alone: offered to switch
    page.locator('#error a[data-project="default"]').click()
    page.wait_for_url(re.compile(rf"/ui/decisions/{decision}\?project=default$"))
    assert page.locator("h1").inner_text().startswith(f"Decision #{decision}")


SHOTS = {"line": f"/ui/lines/{LINE}#matrix",
         "pair": f"/ui/lines/{LINE}/pairs/old/new?evalset={TRAFFIC}",
         "pending-decision": "/ui/decisions/{decision}", "audit": "/ui/audit", "home": "/ui",
         "jobs": "/ui/jobs"}


def test_the_pages_read_at_390_and_1440_px(server, page):
    base, api = server
    decision = api["decision"]["decision_id"]
    for path in (f"/ui/lines/{LINE}", f"/ui/lines/{LINE}/pairs/old/new?evalset={TRAFFIC}",
                 f"/ui/lines/{LINE}/pairs/new/old?evalset={TRAFFIC}", f"/ui/decisions/{decision}",
                 "/ui", "/ui/jobs", "/ui/audit"):
        assert layout_faults(page, base + path) == {}, path
    if folder := os.environ.get("DASHBOARD_SCREENSHOT_DIR"):
        for name, path in SHOTS.items():
            for width, height in ((390, 844), (1440, 900)):
                page.set_viewport_size({"width": width, "height": height})
                page.goto(base + path.format(decision=decision))
                small_png(page.screenshot(), Path(folder) / f"dashboard-traffic-{name}-{width}.png")


def small_png(shot: bytes, path: Path) -> None:
    """A screenshot as a PNG of 64 colours (a few tens of KiB; docs/dashboard.md shows them)."""
    from PIL import Image

    Image.open(io.BytesIO(shot)).convert("RGB").quantize(64).save(path, optimize=True)
