"""The multi-label pages in headless Chromium (tests/ui/multilabel_line.py's line on the app
under uvicorn in a thread, on a migrated SQLite store, its jobs run in this process): the
line, the pair page with its per-sample headline, per-label table and gallery by label, and
the blocked decision read at 390 and 1440 px (tests/ui/test_browser.py's layout checks).

Set DASHBOARD_SCREENSHOT_DIR to keep the pair page's screenshots there
(docs/dashboard-multilabel-pair-390.png and -1440.png are taken this way)."""

import os
from pathlib import Path

import httpx
import pytest

from flipgate.processes import free_port
from service.auth.service import create_token
from service.celery_app import create_celery_app
from service.config import Settings
from service.db import settings_session
from service.main import create_app
from service.migrate import upgrade
from tests.test_cli_gate import serve
from tests.ui.multilabel_line import EVALSET, LINE, seed_multilabel
from tests.ui.test_browser import chromium_browser, layout_faults, sign_in
from tests.ui.test_traffic_browser import small_png
from worker import runtime, tasks
from worker.runtime import WorkerContext

pytestmark = pytest.mark.slow

ADMIN_TOKEN = "multilabel-browser-admin-token-0123456789"
TASKS = {"inference": tasks.inference, "metrics": tasks.metrics, "matrix": tasks.matrix}


def test_the_multilabel_pages_read_at_390_and_1440_px(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN)
    upgrade(settings)
    with settings_session(settings) as session:
        token = create_token(session=session, name="viewer", scopes=["read"])[1]
    context = WorkerContext.from_settings(settings, create_celery_app(settings))

    def run_job(job_id: int) -> None:
        kind = admin.get(f"/jobs/{job_id}").json()["kind"]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(runtime, "context", lambda: context)
            TASKS[kind](job_id)

    with (serve(create_app(settings), free_port()) as url,
          httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                       timeout=30) as admin, chromium_browser() as browser):
        line = seed_multilabel(admin, tmp_path, run_job)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        sign_in(page, url, token)
        pair = f"/ui/lines/{LINE}/pairs/1/2?evalset={EVALSET}"
        for path in ("/ui", f"/ui/lines/{LINE}", pair,
                     f"/ui/decisions/{line.blocked['decision_id']}"):
            assert layout_faults(page, url + path) == {}, path
        page.goto(url + pair)
        widths = page.locator("#flips ul.gallery li.flip img").evaluate_all(
            "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        assert widths and set(widths) == {24}  # every composite decodes to 24 × 8
        if folder := os.environ.get("DASHBOARD_SCREENSHOT_DIR"):
            for width in (390, 1440):
                page.set_viewport_size({"width": width, "height": 900})
                page.goto(url + pair)
                shot = Path(folder) / f"dashboard-multilabel-pair-{width}.png"
                small_png(page.screenshot(), shot)
