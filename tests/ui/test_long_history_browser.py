"""The dashboard in headless Chromium on a line after a year of updates: 36 versions known by
their uploaded predictions on a small eval set (nothing is trained: predicted labels up to 32,
whose pair reports draw no plots, then logits), each gated with its CI
context under three policy versions, 19 promoted and 17 blocked, and an ensemble repair of a
blocked one that was itself blocked. One server (the app under uvicorn in a thread, on a
migrated SQLite store, its jobs run in this process), one seeded line and one signed-in
browser page serve the whole module.

Set DASHBOARD_SCREENSHOT_DIR to keep the line page's screenshot there
(docs/dashboard-line-36-after.png is taken this way)."""

import hashlib
import io
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from sqlalchemy import select

from flipgate.processes import free_port
from service.auth.service import create_token
from service.celery_app import create_celery_app
from service.config import Settings
from service.db import settings_session
from service.gate.models import Decision
from service.gate.statuses import callback_body
from service.jobs.models import Job, JobKind, JobState
from service.main import create_app
from service.migrate import upgrade
from service.registry.models import ModelVersion
from tests.service.conftest import in_default_project
from tests.test_cli_gate import checked, serve
from tests.ui.conftest import as_rate, ensemble_curve
from tests.ui.test_browser import chromium_browser, layout_faults, sign_in
from worker import runtime, tasks
from worker.runtime import WorkerContext

pytestmark = pytest.mark.slow

LINE, EVALSET, SAMPLES, CLASSES = "digits", "eval", 200, 3
VERSIONS = [str(number) for number in range(1, 37)]
BLOCKED = {str(number) for number in range(2, 36, 2)}  # 17: each breaks 12 right answers
POLICIES = {"2": {"max_nfr": 0.03}, "13": {"max_nfr": 0.03, "max_churn": 0.2},
            "25": {"max_nfr": 0.025}}  # set before gating that version: three versions
REPAIRED, REPAIR = "34", "34-ensemble"  # the repair breaks 8 right answers: still blocked
LOGITS_FROM = 33  # the last versions' pairs have full reports with plots and galleries
ADMIN_TOKEN = "long-history-admin-token-0123456789"


@dataclass
class Site:
    """The running server, a read-only token, and what the API answered while seeding."""

    url: str
    token: str
    admin: httpx.Client
    settings: Settings
    decisions: dict[str, dict]  # each version's final decision, as POST /gate answered
    repaired_decision: dict


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def as_logits(predicted: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Logits whose argmax is `predicted`."""
    noise = rng.normal(scale=0.1, size=(predicted.size, CLASSES))
    return (np.eye(CLASSES)[predicted] * 5 + noise).astype(np.float32)


def update(base: np.ndarray, labels: np.ndarray, breaks: int, fixes: int,
           rng: np.random.Generator) -> np.ndarray:
    """`base`'s predictions with `breaks` right answers made wrong and `fixes` wrong ones
    made right."""
    predicted = base.copy()
    right, wrong = np.flatnonzero(base == labels), np.flatnonzero(base != labels)
    broken = rng.choice(right, breaks, replace=False)
    predicted[broken] = (labels[broken] + 1) % CLASSES
    fixed = rng.choice(wrong, fixes, replace=False)
    predicted[fixed] = labels[fixed]
    return predicted


class Seeder:
    """Registers, uploads, gates and promotes versions through the live server's API; runs
    the jobs they queue with the worker's tasks in this process."""

    def __init__(self, admin: httpx.Client, settings: Settings, folder: Path) -> None:
        self.admin, self.settings = admin, settings
        self.context = WorkerContext.from_settings(settings, create_celery_app(settings))
        self.rng = np.random.default_rng(22)
        self.labels = np.arange(SAMPLES) % CLASSES
        path = folder / "eval.npz"
        np.savez(path, x=self.rng.normal(size=(SAMPLES, 4)).astype(np.float32), y=self.labels)
        checked(admin.post("/evalsets", data={"name": EVALSET},
                           files={"data": ("eval.npz", path.read_bytes())}))
        self.predicted: dict[str, np.ndarray] = {}
        self.logits: dict[str, np.ndarray] = {}
        self.production: str | None = None

    def run(self, task, job_id: int) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(runtime, "context", lambda: self.context)
            task(job_id)

    def register(self, version: str, predicted: np.ndarray) -> None:
        """An external version of the line with its predictions on the eval set: logits
        from LOGITS_FROM on, predicted labels before."""
        fields = {"name": LINE, "version": version, "num_classes": str(CLASSES)}
        checked(self.admin.post("/models", data=fields | (
            {"parent": f"{LINE}:{self.production}"} if self.production else {})))
        self.predicted[version] = predicted
        url = f"/models/{LINE}/versions/{version}/predictions"
        if int(version.split("-")[0]) < LOGITS_FROM:
            checked(self.admin.post(url, data={"evalset": EVALSET},
                                    files={"labels": ("labels.npy", npy(predicted))}))
            return
        self.logits[version] = as_logits(predicted, self.rng)
        checked(self.admin.put(url, params={"evalset": EVALSET}, content=npy(self.logits[version]),
                               headers={"Content-Type": "application/octet-stream"}))

    def gate(self, version: str) -> dict:
        """The final decision on `version` against production (its pair measured first),
        promoted when approved."""
        if self.production:
            queued = checked(self.admin.post(f"/compare/{LINE}:{self.production}/{LINE}:{version}",
                                             params={"evalset": EVALSET}))
            for job_id in queued.get("job_ids", []):
                self.run(tasks.metrics, job_id)
        number = int(version.split("-")[0])
        ci = {"provider": "github", "repo": "acme/digits", "ref": f"refs/pull/{100 + number}/merge",
              "sha": hashlib.sha1(version.encode()).hexdigest(),
              "run_url": f"https://github.com/acme/digits/actions/runs/{9000 + number}"}
        decision = checked(self.admin.post("/gate", json={"model": LINE, "candidate": version,
                                                          "ci": ci}))
        assert decision["verdict"] != "pending", decision
        if decision["verdict"] == "approve":
            checked(self.admin.post(f"/models/{LINE}/aliases/production",
                                    json={"version": version}))
            self.production = version
        return decision



def seed(seeder: Seeder) -> tuple[dict[str, dict], dict]:
    """The line's history (see the module's docstring); each version's decision and the
    repaired version's."""
    decisions, repaired = {}, {}
    for version in VERSIONS:
        if version in POLICIES:
            checked(seeder.admin.put(f"/models/{LINE}/policy",
                                     json={**POLICIES[version], "evalsets": [EVALSET]}))
        base = (seeder.predicted[seeder.production] if seeder.production
                else (seeder.labels + (seeder.rng.random(SAMPLES) < 0.4)) % CLASSES)
        breaks, fixes = (12, 0) if version in BLOCKED else (2, 4)
        seeder.register(version, update(base, seeder.labels, breaks, fixes, seeder.rng)
                        if seeder.production else base)
        decisions[version] = seeder.gate(version)
        assert decisions[version]["verdict"] == ("block" if version in BLOCKED else "approve")
        if version == REPAIRED:
            repaired = repair(seeder, decisions[version])
    queued = checked(seeder.admin.post(f"/models/{LINE}/matrix", params={"evalset": EVALSET}))
    seeder.run(tasks.matrix, queued["missing"][0]["job_id"])
    return decisions, repaired


def repair(seeder: Seeder, blocked: dict) -> dict:
    """The ensemble repair of a blocked decision as its job would leave it: a version made
    from the baseline with its weight, calibration set and curve recorded, gated again and
    blocked."""
    baseline = seeder.production
    seeder.register(REPAIR, update(seeder.predicted[baseline], seeder.labels, 8, 0, seeder.rng))
    decision = seeder.gate(REPAIR)
    assert decision["verdict"] == "block", decision
    weight, curve = ensemble_curve(seeder.logits[baseline], seeder.logits[REPAIRED],
                                   seeder.labels, 0.01)
    with settings_session(seeder.settings) as session:
        in_default_project(session)
        session.add(Job(kind=JobKind.TRAIN, state=JobState.SUCCEEDED, progress=1.0,
                        params={"method": "ensemble", "decision_id": blocked["decision_id"],
                                "version": REPAIR}))
        version = session.scalars(select(ModelVersion).where(ModelVersion.version == REPAIR)).one()
        version.produced_by = {"method": "ensemble", "repair_of": REPAIRED,
                               "decision_id": blocked["decision_id"], "weight": weight,
                               "calibration": "calibration", "curve": curve,
                               "limits": {"max_nfr": 0.01, "max_er_increase": 0.0}}
        session.get(Decision, decision["decision_id"]).repair_of_id = blocked["decision_id"]
    return decision


@contextmanager
def long_history_site(folder: Path) -> Iterator[Site]:
    """The live server, its line seeded as the module's docstring says (also
    benchmarks/dashboard_bench.py's)."""
    port = free_port()
    settings = Settings(data_dir=folder / "data", admin_token=ADMIN_TOKEN,
                        public_url=f"http://127.0.0.1:{port}")
    upgrade(settings)
    with settings_session(settings) as session:
        token = create_token(session=session, name="viewer", scopes=["read"])[1]
    with (serve(create_app(settings), port) as url,
          httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                       timeout=30) as admin):
        decisions, repaired = seed(Seeder(admin, settings, folder))
        yield Site(url, token, admin, settings, decisions, repaired)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    with long_history_site(tmp_path_factory.mktemp("long-history")) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with chromium_browser() as launched:
        yield launched


@pytest.fixture(scope="module")
def page(site, browser):
    """One signed-in page for the module."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    signed_in = context.new_page()
    sign_in(signed_in, site.url, site.token)
    yield signed_in
    context.close()


def last_final_decisions(site: Site) -> dict[str, dict]:
    """Each version's decision, the repaired version's included."""
    return {**site.decisions, REPAIR: site.repaired_decision}


def test_history_plots_the_apis_numbers_with_blocked_versions_and_production(site, page):
    page.goto(f"{site.url}/ui/lines/{LINE}")
    points = page.locator("svg.history circle.point").evaluate_all(
        "cs => cs.map(c => [c.dataset.series, c.dataset.version, +c.dataset.value,"
        " +c.getAttribute('cy'), c.classList.contains('blocked')])")
    decisions = last_final_decisions(site)
    expected = {(series, version): decision["metrics"][EVALSET][series]
                for version, decision in decisions.items() if decision["baseline"]
                for series in ("er_new", "nfr")}
    assert {(series, version): value for series, version, value, _, _ in points} == expected
    assert {version for _, version, _, _, blocked in points if blocked} == BLOCKED | {REPAIR}
    for series in ("er_new", "nfr"):  # a higher value is drawn higher (a smaller y)
        drawn = sorted((value, -y) for name, _, value, y, _ in points if name == series)
        assert [y for _, y in drawn] == sorted(y for _, y in drawn)
    bands = page.locator("svg.history rect.blocked").evaluate_all(
        "rs => rs.map(r => r.dataset.version)")
    assert set(bands) == BLOCKED | {REPAIR}
    assert page.locator("svg.history g.production").get_attribute("data-version") == "36"
    label = page.locator("svg.history g.production text").bounding_box()
    plot = page.locator("svg.history").bounding_box()  # the last version's label fits
    assert plot["x"] <= label["x"] and label["x"] + label["width"] <= plot["x"] + plot["width"]
    promotions = site.admin.get(f"/models/{LINE}/promotions").json()
    assert page.locator("#promotions tbody tr").count() == len(promotions) == 19
    save_screenshot(page, "dashboard-line-36-after.png")


def api_matrix(site: Site) -> dict[tuple[str, str], dict[str, float]]:
    """{(old, new): {nfr, churn}} of GET /models/{line}/matrix."""
    body = site.admin.get(f"/models/{LINE}/matrix", params={"evalset": EVALSET}).json()
    names = body["versions"]
    return {(old, new): {metric: body[metric][i][j] for metric in ("nfr", "churn")}
            for i, old in enumerate(names) for j, new in enumerate(names) if old != new}


def cells(page, metric: str) -> list[dict]:
    return page.locator(f'svg.heatmap[data-metric="{metric}"] a').evaluate_all(
        "as => as.map(a => ({href: a.getAttribute('href'), old: a.dataset.old,"
        " new: a.dataset.new, value: +a.dataset.value, classes: a.getAttribute('class'),"
        " fill: a.querySelector('rect').getAttribute('fill')}))")


def test_heatmap_cells_equal_the_api_and_link_to_the_pair_or_its_counts(site, page):
    expected = api_matrix(site)
    page.goto(f"{site.url}/ui/lines/{LINE}")
    window = cells(page, "nfr")
    assert len(window) == 12 * 11
    for metric in ("nfr", "churn"):  # the whole matrix shows one metric at a time
        page.goto(f"{site.url}/ui/lines/{LINE}?versions=all&metric={metric}")
        assert page.locator("svg.heatmap").count() == 1
        shown = cells(page, metric)
        assert {(cell["old"], cell["new"]): cell["value"] for cell in shown} == {
            pair: values[metric] for pair, values in expected.items()}
    page.locator("#matrix-metrics a", has_text="NFR").click()
    page.wait_for_url(re.compile(r"versions=all&metric=nfr"))
    whole = cells(page, "nfr")
    for cell in whole:
        assert cell["href"] == (f"/ui/lines/{LINE}/pairs/{cell['old']}/{cell['new']}"
                                f"?evalset={EVALSET}&project=default")
    limit = POLICIES["25"]["max_nfr"]
    passing = {cell["fill"] for cell in whole if 0 < cell["value"] <= limit}
    above = {cell["fill"] for cell in whole if cell["value"] > limit}
    assert passing and above and not passing & above  # a passing and a blocked cell differ
    assert all(" above" in cell["classes"] for cell in whole if cell["value"] > limit)
    promoted = [version for version in VERSIONS if version not in BLOCKED]
    moves = set(pairwise(promoted))
    assert {(cell["old"], cell["new"]) for cell in whole if "promoted" in cell["classes"]} == moves

    page.locator('svg.heatmap[data-metric="nfr"] a[href*="/pairs/35/36?"]').click()
    page.wait_for_url(re.compile(r"/pairs/35/36"))
    assert page.locator("#report h2", has_text="Headline").count() == 1  # its full report
    page.goto(f"{site.url}/ui/lines/{LINE}?versions=all")
    page.locator('svg.heatmap[data-metric="nfr"] a[href*="/pairs/36/5?"]').click()
    page.wait_for_url(re.compile(r"/pairs/36/5"))
    counted = as_rate(page.locator('#counts td[data-metric="nfr"]').inner_text())
    assert counted == pytest.approx(expected["36", "5"]["nfr"], abs=5e-5)


def test_the_blocked_repair_is_shown_blocked_with_its_numbers(site, page):
    blocked = site.decisions[REPAIRED]
    page.goto(f"{site.url}/ui/decisions/{blocked['decision_id']}")
    state = page.locator("#repair-state")
    assert state.text_content() == "ran, result blocked"
    assert "verdict-block" in state.get_attribute("class")
    assert page.locator("#repair .state-succeeded, #repair .verdict-approve").count() == 0
    nfr = page.locator('#before-after td[data-key="nfr"]').all_inner_texts()
    assert [as_rate(value) for value in nfr] == [
        pytest.approx(blocked["metrics"][EVALSET]["nfr"], abs=5e-5),
        pytest.approx(site.repaired_decision["metrics"][EVALSET]["nfr"], abs=5e-5)]
    assert page.locator("#calibration-set").inner_text() == "calibration"
    assert page.locator("svg.repair-curve circle.point").count() == 2 * 5


def test_the_ci_link_opens_the_decision_page_for_a_signed_in_user(site, page, browser):
    decision = site.decisions["35"]
    with settings_session(site.settings) as session:  # what a GitHub status's "Details" opens
        status = callback_body(session=session,
                               decision=session.get_one(Decision, decision["decision_id"]))
    report_url = status["target_url"]
    assert report_url == decision["report_url"] and report_url.startswith(site.url)
    page.goto(report_url)
    assert urlsplit(page.url).path == f"/ui/decisions/{decision['decision_id']}"
    assert page.locator("h1").inner_text().startswith(f"Decision #{decision['decision_id']}")
    ci = page.locator("#ci a").evaluate_all(
        "as => as.map(a => [a.innerText, a.getAttribute('href')])")
    sha = decision["ci"]["sha"]
    assert ci == [["PR #135", "https://github.com/acme/digits/pull/135"],
                  [sha[:7], f"https://github.com/acme/digits/commit/{sha}"],
                  ["run", "https://github.com/acme/digits/actions/runs/9035"]]
    stranger = browser.new_context().new_page()  # not signed in yet: signs in, then lands there
    try:
        stranger.goto(report_url)
        stranger.wait_for_url(re.compile(r"/ui/signin"))
        stranger.fill("#token", site.token)
        stranger.get_by_role("button", name="Sign in").click()
        stranger.wait_for_url(
            re.compile(rf"/ui/decisions/{decision['decision_id']}\?project=default$"))
    finally:
        stranger.context.close()


def pages(site: Site) -> list[str]:
    blocked = site.decisions[REPAIRED]["decision_id"]
    return ["/ui", f"/ui/lines/{LINE}", f"/ui/lines/{LINE}?versions=all",
            f"/ui/lines/{LINE}/pairs/35/36?evalset={EVALSET}",
            f"/ui/lines/{LINE}/pairs/36/5?evalset={EVALSET}", f"/ui/decisions/{blocked}",
            f"/ui/decisions/{site.repaired_decision['decision_id']}", "/ui/jobs",
            "/ui/no-such-page"]


def test_no_page_overflows_or_breaks_a_number_at_390_or_1440_px(site, page, tmp_path):
    shots = Path(os.environ.get("DASHBOARD_SCREENSHOT_DIR") or tmp_path)
    faults = {path: found for path in pages(site)
              if (found := layout_faults(page, site.url + path, shots))}
    assert faults == {}


def test_wide_tables_scroll_in_their_box_with_the_first_column_in_view(site, page):
    page.set_viewport_size({"width": 390, "height": 900})
    try:
        page.goto(f"{site.url}/ui/lines/{LINE}")
        table = page.locator("#history-table")
        scrolled = table.evaluate("""t => {  // the table's own box (or its wrapper) scrolls
            const box = [t, t.parentElement].find(b => b.scrollWidth > b.clientWidth);
            if (!box) return null;
            const first = t.querySelector('tbody td');
            const before = first.getBoundingClientRect().left;
            box.scrollLeft = 400;
            return [box.scrollLeft, first.getBoundingClientRect().left - before];
        }""")
        assert scrolled is not None and scrolled[0] > 0  # it scrolls, and the page does not
        assert scrolled[1] == pytest.approx(0, abs=1)  # the version column stays in view
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        page.set_viewport_size({"width": 1440, "height": 900})


def save_screenshot(page, name: str) -> None:
    """The page as a PNG under $DASHBOARD_SCREENSHOT_DIR, when set."""
    if folder := os.environ.get("DASHBOARD_SCREENSHOT_DIR"):
        (Path(folder) / name).write_bytes(page.screenshot(full_page=False))
