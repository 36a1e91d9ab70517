"""Single sign-on in a real headless Chromium (Debian's, driven by Playwright) on `flipgate
serve`, against the suite's OpenID provider on another site (localhost vs 127.0.0.1): the
provider's redirect back is a cross-site navigation, which must still carry the flow's
cookie (SameSite=Lax), and the session cookie (SameSite=Strict) set on its answer must sign
the person in on the next page. The person then mints a personal token, sees it listed and
revokes it (the tokens page at 390 and 1440 px, its screenshots with DASHBOARD_SCREENSHOT_DIR)."""

import os
import re
from pathlib import Path

import httpx
import pytest

from flipgate.processes import free_port
from service.config import Settings
from service.db import settings_session
from service.projects.service import create_project, get_project, grant
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for
from tests.ui.oidc_provider import CLIENT_ID, CLIENT_SECRET
from tests.ui.test_browser import layout_faults, page, ready  # noqa: F401 (the fixture)
from tests.ui.test_traffic_browser import small_png

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path, oidc_provider):
    """The server's address, signing in with the suite's provider; group `ml-team` may view
    project `default`, and nobody project `vision`."""
    port, data = free_port(), tmp_path / "data"
    env = flipgate_env(FLIPGATE_DATA_DIR=str(data), FLIPGATE_OIDC_ISSUER=oidc_provider.issuer,
                       FLIPGATE_OIDC_CLIENT_ID=CLIENT_ID,
                       FLIPGATE_OIDC_CLIENT_SECRET=CLIENT_SECRET)
    base = f"http://127.0.0.1:{port}"
    with flipgate_process(["serve", "--port", str(port)], env, tmp_path), \
            httpx.Client(base_url=base, timeout=60) as client:
        wait_for(lambda: ready(client), "/readyz")
        with settings_session(Settings(data_dir=data)) as session:
            create_project(session=session, name="vision")
            grant(session=session, project=get_project(session=session, name="default"),
                  kind="group", principal="ml-team", role="viewer")
        yield base




def test_single_sign_on_in_a_browser(server, page, oidc_provider):  # noqa: F811
    oidc_provider.set_user("alice", email="alice@example.com", name="Alice Liddell",
                           groups=["ml-team"])
    page.goto(server + "/ui/jobs")
    page.wait_for_url(re.compile(r"/ui/signin"))
    page.locator("#sso").click()
    page.wait_for_url(re.compile(re.escape(oidc_provider.issuer) + "/oauth2/authorize"))
    page.locator('input[name="sub"]').fill("alice")
    page.get_by_role("button", name="Authorize").click()
    page.wait_for_url(server + "/ui/jobs")
    assert "Alice Liddell" in page.locator(".who").inner_text()
    switcher = page.locator("select#project option")
    assert switcher.all_inner_texts() == ["default"]  # not vision: no grant there
    page.goto(server + "/ui?project=vision")
    assert "no project named 'vision'" in page.locator("#error").inner_text()
    cookies = {cookie["name"]: cookie for cookie in page.context.cookies()}
    assert cookies["flipgate_session"]["sameSite"] == "Strict"
    assert cookies["flipgate_session"]["httpOnly"]
    assert "flipgate_oidc" not in cookies  # the flow is finished
    page.goto(server + "/ui/tokens")  # the person's tokens: minted, listed, revoked here
    page.get_by_role("button", name="Mint a token").click()
    minted = page.locator("#minted-name").inner_text()
    row = page.locator(f'#tokens tr[data-token="{minted}"]')
    assert "ACTIVE" in row.inner_text() and "default" in row.inner_text()  # a badge: capitals
    assert layout_faults(page, server + "/ui/tokens") == {}
    if folder := os.environ.get("DASHBOARD_SCREENSHOT_DIR"):
        for width, height in ((390, 844), (1440, 900)):
            page.set_viewport_size({"width": width, "height": height})
            page.goto(server + "/ui/tokens")
            small_png(page.screenshot(), Path(folder) / f"dashboard-tokens-{width}.png")
    page.goto(server + "/ui/tokens")
    row.get_by_role("button", name=f"Revoke {minted}").click()
    assert page.locator("#revoked-name").inner_text() == minted
    assert "REVOKED" in page.locator(f'#tokens tr[data-token="{minted}"]').inner_text()
