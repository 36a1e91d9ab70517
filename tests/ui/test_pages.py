"""The dashboard over HTTP on the real app and database: sign-in and its cookie, the
redirects without a session, a cookie that cannot write, offline pages and their contents.

The line of tests/ui/conftest.py is seeded once for this module (and database); each test
runs in a savepoint that its end rolls back."""

import re
import time
from datetime import UTC, datetime, timedelta
from http.cookies import SimpleCookie
from types import SimpleNamespace
from urllib.parse import quote, urlsplit

import numpy as np
import pytest
from sqlalchemy import delete, select, update

from flipgate.metrics import compare_logits
from flipgate.reporting.html import stored_body
from service.auth.models import ApiToken
from service.auth.service import revoke_token
from service.callbacks.models import Callback, CallbackState
from service.callbacks.scheduling import record_attempt
from service.compare.models import PairMetrics
from service.config import Settings
from service.gate.models import Decision
from service.jobs.models import Job, JobKind, JobState
from service.projects.service import create_project
from service.registry.models import ModelVersion
from service.ui import session as session_module
from service.ui.heatmap import ink, luminance
from service.ui.session import COOKIE
from tests.service.api.conftest import (
    ADMIN_TOKEN,
    bearer,
    error_code,
    measure,
    post_evalset,
    post_logits,
    run_task,
    shared_store,
)
from tests.service.conftest import write_npz
from tests.ui.conftest import (
    CLASSES,
    EVALSET,
    LINE,
    RATE,
    SAMPLES,
    as_rate,
    ensemble_curve,
    seed,
)

client, settings = shared_store(client=seed)  # every test here starts from the seeded store


@pytest.fixture
def seeded(client, module_store):
    return module_store.seeded


EXTERNAL = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*"""
                      r"""(?:https?:)?//|@import\s+["']?(?:https?:)?//""", re.IGNORECASE)
RESOURCE_ATTRIBUTES = re.compile(
    r"<(script|link|img|iframe|source|video|audio|object|embed)\b[^>]*>", re.IGNORECASE)


def pages(seeded) -> list[str]:
    return ["/ui", f"/ui/lines/{LINE}", f"/ui/lines/{LINE}?evalset={EVALSET}&page=1",
            f"/ui/lines/{LINE}/pairs/1/2?evalset={EVALSET}",
            f"/ui/lines/{LINE}/pairs/1/2?evalset={EVALSET}&page=2",
            f"/ui/decisions/{seeded.blocked_id}", "/ui/jobs"]


def test_every_page_answers_303_to_sign_in_without_a_session(seeded, browser_client):
    for page in [*pages(seeded), "/"]:
        response = browser_client.get(page, follow_redirects=False)
        assert response.status_code == 303, page
        target = response.headers["location"]
        assert target.startswith("/ui/signin" if page != "/" else "/ui"), target
    redirected = browser_client.get(f"/ui/lines/{LINE}?evalset={EVALSET}")
    assert redirected.url.path == "/ui/signin" and 'name="token"' in redirected.text
    assert 'value="/ui/lines/digits?evalset=eval"' in redirected.text  # back after sign-in


def test_sign_in_sets_a_signed_http_only_strict_expiring_cookie(browser_client, mint, settings):
    response = browser_client.post("/ui/signin", data={"token": mint("read"), "next": "/ui/jobs"},
                                   follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/ui/jobs"
    morsel = SimpleCookie(response.headers["set-cookie"])[COOKIE]
    assert morsel["httponly"] and morsel["samesite"] == "strict"
    assert int(morsel["max-age"]) == int(settings.session_hours * 3600)
    assert morsel["path"] == "/ui"
    assert browser_client.get("/ui/jobs").status_code == 200
    signed_out = browser_client.post("/ui/signout", follow_redirects=False)
    assert signed_out.status_code == 303
    assert browser_client.get("/ui/jobs", follow_redirects=False).status_code == 303


@pytest.mark.parametrize(("scopes", "status", "message"), [
    ((), 401, "unknown or revoked"), (("write",), 403, "lacks the &#39;read&#39; scope")])
def test_sign_in_refuses_unknown_tokens_and_tokens_without_read(browser_client, mint, scopes,
                                                                 status, message):
    token = mint(*scopes) if scopes else "fg_not-a-token"
    response = browser_client.post("/ui/signin", data={"token": token})
    assert response.status_code == status and message in response.text
    assert COOKIE not in response.cookies


def test_sign_out_ends_the_session_wherever_its_cookie_was_copied(browser_client, mint):
    browser_client.post("/ui/signin", data={"token": mint("read")})
    copied = browser_client.cookies[COOKIE]
    signed_out = browser_client.post("/ui/signout", follow_redirects=False)
    assert signed_out.headers["location"] == "/ui/signin?ended=signed_out"
    replace_cookie(browser_client, copied)  # still well signed and unexpired
    refused = browser_client.get("/ui/jobs", follow_redirects=False)
    assert refused.status_code == 303 and refused.headers["location"].endswith(
        "&ended=signed_out")
    assert "You signed out." in browser_client.get(refused.headers["location"]).text


def test_a_session_ends_when_its_token_expires(browser_client, mint, db, settings,
                                              monkeypatch):
    token = mint("read")
    with db() as session:
        session.execute(update(ApiToken).where(ApiToken.name == "read").values(
            expires_at=datetime.now(UTC) + timedelta(minutes=30)))
    browser_client.post("/ui/signin", data={"token": token})
    assert browser_client.get("/ui").status_code == 200
    after_token = time.time() + 31 * 60  # the session alone would last session_hours
    assert after_token < time.time() + settings.session_hours * 3600
    monkeypatch.setattr(session_module, "time", SimpleNamespace(time=lambda: after_token))
    ended = browser_client.get("/ui", follow_redirects=False)
    assert ended.headers["location"].endswith("&ended=expired")
    monkeypatch.undo()
    with db() as session:  # the token's own expiry, checked on every page
        session.execute(update(ApiToken).where(ApiToken.name == "read").values(
            expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    ended = browser_client.get("/ui", follow_redirects=False)
    assert ended.headers["location"].endswith("&ended=expired")
    assert "Your session expired." in browser_client.get(ended.headers["location"]).text


@pytest.mark.parametrize("header", ["origin", "referer"])
def test_cross_site_sign_ins_and_sign_outs_are_refused(browser_client, mint, header):
    evil = {header: "https://evil.example/page"}
    refused = browser_client.post("/ui/signin", data={"token": mint("read")}, headers=evil)
    assert refused.status_code == 403 and COOKIE not in refused.cookies
    own = {header: "http://testserver/ui/signin"}
    assert browser_client.post("/ui/signin", data={"token": mint("read", "gate")},
                               headers=own).status_code == 200
    assert browser_client.post("/ui/signout", headers=evil).status_code == 403
    assert browser_client.get("/ui/jobs").status_code == 200  # still signed in


def test_failed_sign_ins_are_throttled_per_client(browser_client, mint):
    for _ in range(5):
        assert browser_client.post("/ui/signin", data={"token": "fg_wrong"}).status_code == 401
    throttled = browser_client.post("/ui/signin", data={"token": mint("read")})
    assert throttled.status_code == 429 and COOKIE not in throttled.cookies
    assert 1 <= int(throttled.headers["retry-after"]) <= 60
    assert "Too many failed sign-ins" in throttled.text


def test_open_redirects_are_refused(browser_client, mint):
    response = browser_client.post("/ui/signin", data={"token": mint("read"),
                                                       "next": "https://evil.example/"},
                                   follow_redirects=False)
    assert response.headers["location"] == "/ui"


def replace_cookie(client, value: str) -> None:
    """The session cookie the client sends becomes `value` (the jar holds no other)."""
    client.cookies.clear()
    client.cookies.set(COOKIE, value, path="/ui")


def test_forged_and_expired_cookies_and_revoked_tokens_end_the_session(
        seeded, browser_client, mint, db, settings, monkeypatch):
    browser_client.post("/ui/signin", data={"token": mint("read")})
    cookie = browser_client.cookies[COOKIE]
    encoded, _, signature = cookie.partition(".")
    replace_cookie(browser_client, f"{encoded}.{signature[::-1]}")
    assert browser_client.get("/ui", follow_redirects=False).status_code == 303
    replace_cookie(browser_client, cookie)
    assert browser_client.get("/ui").status_code == 200
    later = time.time() + settings.session_hours * 3600 + 1
    monkeypatch.setattr(session_module, "time", SimpleNamespace(time=lambda: later))
    assert browser_client.get("/ui", follow_redirects=False).status_code == 303
    monkeypatch.undo()
    assert browser_client.get("/ui").status_code == 200
    with db() as session:
        revoke_token(session=session, name="read")
    assert browser_client.get("/ui", follow_redirects=False).status_code == 303


def test_a_session_cookie_never_authorizes_the_json_api(seeded, signed_in):
    signed_in.cookies.set(COOKIE, signed_in.cookies[COOKIE], path="/")  # even if sent to /
    writes = [("post", "/gate", {"json": {"model": LINE, "candidate": "3"}}),
              ("put", f"/models/{LINE}/policy", {"json": {"max_nfr": 1.0}}),
              ("post", f"/models/{LINE}/aliases/production", {"json": {"version": "2"}}),
              ("post", f"/gate/decisions/{seeded.blocked_id}/repair",
               {"json": {"method": "elodi"}})]
    for method, path, body in writes:
        response = getattr(signed_in, method)(path, **body)
        assert error_code(response, 401) in ("missing_token", "missing_credentials"), path
    assert error_code(signed_in.get(f"/models/{LINE}"), 401) == "missing_token"
    decisions = signed_in.get(f"/models/{LINE}/decisions", headers=bearer(ADMIN_TOKEN)).json()
    assert len(decisions) == 2  # the refused POST /gate decided nothing


def test_no_page_references_an_external_url(seeded, signed_in):
    documents = {page: signed_in.get(page).text for page in
                 [*pages(seeded), "/ui/signin", "/docs", "/redoc"]}
    documents["/ui/static/dashboard.css"] = signed_in.get("/ui/static/dashboard.css").text
    for page, text in documents.items():
        assert not EXTERNAL.search(text), (page, EXTERNAL.search(text))
        for tag in RESOURCE_ATTRIBUTES.finditer(text):
            assert "//" not in tag.group(0).replace("data:", ""), (page, tag.group(0))
    for asset in re.findall(r'(?:src|href)="(/[^"]+)"', documents["/docs"] + documents["/redoc"]):
        assert signed_in.get(asset).status_code == 200, asset


def test_line_page_lists_lineage_matrix_policy_and_decisions(seeded, signed_in):
    text = signed_in.get(f"/ui/lines/{LINE}").text
    expected = compare_logits(seeded.logits["1"], seeded.logits["2"], seeded.labels)
    cell = re.search(r'data-old="1" data-new="2" data-value="([^"]+)"', text)
    assert cell and float(cell.group(1)) == pytest.approx(expected["nfr"])
    assert expected["nfr"] > 0.05  # the policy's max_nfr: the cell is marked
    assert f"NFR {100 * expected['nfr']:.2f}% (above the limit)</title>" in text
    assert re.search(r'data-nfr="[^"]+" data-churn="' + re.escape(str(expected["churn"])), text)
    assert "<dt>NFR</dt>" in text and "(current)" in text
    assert f'href="/ui/decisions/{seeded.blocked_id}?project=default"' in text
    assert 'class="tag alias">production<' in text


def test_a_cell_without_a_full_report_links_to_its_counts_and_how_to_measure_it(
        seeded, signed_in, db):
    with db() as session:
        ids = dict(session.execute(select(ModelVersion.version, ModelVersion.id)).all())
        session.execute(delete(PairMetrics).where(PairMetrics.old_version_id == ids["1"],
                                                  PairMetrics.new_version_id == ids["3"]))
    text = signed_in.get(f"/ui/lines/{LINE}").text
    expected = compare_logits(seeded.logits["1"], seeded.logits["3"], seeded.labels)
    assert f"1 → 3: NFR {100 * expected['nfr']:.2f}%" in text
    link = f'href="/ui/lines/{LINE}/pairs/1/3?evalset={EVALSET}&amp;project=default"'
    assert link in text
    counted = signed_in.get(f"/ui/lines/{LINE}/pairs/1/3?evalset={EVALSET}")
    assert counted.status_code == 200 and "has not been measured" not in counted.text
    for metric in ("nfr", "pfr", "churn"):
        shown = re.search(rf'data-metric="{metric}">{RATE}<', counted.text)
        assert shown and as_rate(shown.group(1)) == pytest.approx(expected[metric], abs=5e-5)
    assert f"POST /compare/{LINE}:1/{LINE}:3?evalset={EVALSET}" in counted.text


def test_pair_page_tables_every_negative_flip_of_a_non_image_eval_set(seeded, signed_in):
    expected = compare_logits(seeded.logits["1"], seeded.logits["2"], seeded.labels)
    flips = expected["flipped_indices"]["negative"]
    text = signed_in.get(f"/ui/lines/{LINE}/pairs/1/2?evalset={EVALSET}").text
    rows = [int(index) for index in re.findall(r'class="flip-row" data-index="(\d+)"', text)]
    assert sorted(rows) == sorted(flips) and len(flips) == expected["negative_flips"] > 0
    confidence = {int(i): np.exp(z).max() / np.exp(z).sum() for i, z in
                  zip(range(len(seeded.labels)), seeded.logits["2"], strict=True)}
    assert [confidence[i] for i in rows] == sorted((confidence[i] for i in rows), reverse=True)
    assert "<h2>Headline</h2>" in text and "<svg" in text  # the report with its plots


def test_pair_page_shows_the_report_its_metrics_job_stored(seeded, signed_in):
    stored = signed_in.get(f"/compare/{LINE}:1/{LINE}:2", headers=bearer(ADMIN_TOKEN),
                           params={"evalset": EVALSET, "format": "html"}).text
    text = signed_in.get(f"/ui/lines/{LINE}/pairs/1/2?evalset={EVALSET}").text
    section = re.search(r'<section id="report" class="report">(.*?)</section>\n<section id="flips"',
                        text, re.DOTALL)
    assert section is not None and section.group(1) == stored_body(stored)
    assert f"{LINE}:1" in section.group(1)  # the names the job drew, not recomputed here


def test_decision_page_shows_reasons_metrics_and_pair_links(seeded, signed_in):
    text = signed_in.get(f"/ui/decisions/{seeded.blocked_id}").text
    assert 'class="badge verdict-block">block<' in text
    assert "<code>max_nfr</code>" in text and "blocks" in text
    assert f'href="/ui/lines/{LINE}/pairs/1/2?evalset={EVALSET}&amp;project=default"' in text
    missing = signed_in.get("/ui/decisions/999999")
    assert missing.status_code == 404 and "no decision 999999" in missing.text


def test_decision_page_tables_each_group_and_its_repairs_before_and_after(
        seeded, signed_in, client, tmp_path, db):
    groups = np.where(np.arange(SAMPLES) < SAMPLES // 2, "thin", "thick")  # as `half` below
    path = tmp_path / "grouped.npz"
    with np.load(write_npz(tmp_path, n=SAMPLES, num_classes=CLASSES)) as data:
        np.savez(path, x=data["x"], y=seeded.labels, groups=groups)
    client.headers.update(bearer(ADMIN_TOKEN))
    assert post_evalset(client, "grouped", path).status_code == 201
    for version in ("1", "2", "3"):
        assert post_logits(client, f"{LINE}:{version}", "grouped",
                           seeded.logits[version]).status_code == 201
    for version in ("2", "3"):
        measure(client, f"{LINE}:1", f"{LINE}:{version}", "grouped")
    half = SAMPLES // 2
    thin, thick = (compare_logits(seeded.logits["1"][part], seeded.logits["2"][part],
                                  seeded.labels[part])["nfr"]
                   for part in (slice(None, half), slice(half, None)))
    assert thin != thick  # a limit between them blocks one group only
    assert client.put(f"/models/{LINE}/policy", json={
        "max_group_nfr": (thin + thick) / 2, "evalsets": ["grouped"]}).is_success
    decision = client.post("/gate", json={"model": LINE, "candidate": "2"}).json()
    measured = {row["group"]: row for row in decision["metrics"]["grouped"]["groups"]}
    assert set(measured) == {"thin", "thick"}, decision
    text = signed_in.get(f"/ui/decisions/{decision['decision_id']}").text
    table = re.search(r'<table class="data" id="groups-grouped">(.*?)</table>', text, re.DOTALL)
    assert table, text
    for group, row in measured.items():
        shown = re.search(rf'<tr data-group="{group}"( class="blocking")?>(.*?)</tr>',
                          table.group(1), re.DOTALL)
        assert shown and bool(shown.group(1)) == (row["nfr"] == max(thin, thick))
        nfr = re.search(rf'data-key="nfr">{RATE}<', shown.group(2))
        assert as_rate(nfr.group(1)) == pytest.approx(row["nfr"], abs=5e-5)
        assert f'<td class="num">{row["n"]}</td>' in shown.group(2)
    after = client.post("/gate", json={"model": LINE, "candidate": "3"}).json()
    with db() as session:  # 3 stands for the repair of 2
        session.add(Job(kind=JobKind.TRAIN, state=JobState.SUCCEEDED, progress=1.0,
                        params={"method": "ensemble", "decision_id": decision["decision_id"]}))
        version = session.scalars(select(ModelVersion).where(ModelVersion.version == "3")).one()
        version.produced_by = {"method": "ensemble", "decision_id": decision["decision_id"]}
        session.get(Decision, after["decision_id"]).repair_of_id = decision["decision_id"]
    text = signed_in.get(f"/ui/decisions/{decision['decision_id']}").text
    table = re.search(r'<table class="data" id="before-after">(.*?)</table>', text, re.DOTALL)
    repaired = {row["group"]: row for row in after["metrics"]["grouped"]["groups"]}
    for group in measured:
        shown = re.findall(rf'<td class="num" data-group="{group}">{RATE}</td>', table.group(1))
        assert [as_rate(value) for value in shown] == [
            pytest.approx(measured[group]["nfr"], abs=5e-5),
            pytest.approx(repaired[group]["nfr"], abs=5e-5)]


def open_jobs_shown(text: str) -> int:
    return int(re.search(r"Queued and running \((\d+)\)", text).group(1))


def test_jobs_page_shows_progress_of_open_jobs_and_errors_of_failed_ones(db, signed_in):
    already_open = open_jobs_shown(signed_in.get("/ui/jobs").text)  # the seeded line's
    with db() as session:
        session.add_all([
            Job(kind=JobKind.INFERENCE, state=JobState.RUNNING, progress=0.375,
                params={"version_id": 1}, started_at=datetime.now(UTC)),
            Job(kind=JobKind.TRAIN, state=JobState.QUEUED, params={"method": "elodi"}),
            Job(kind=JobKind.METRICS, state=JobState.FAILED, params={},
                error="RuntimeError: logits have 9 classes", finished_at=datetime.now(UTC)),
            Job(kind=JobKind.METRICS, state=JobState.SUCCEEDED, params={"done": True})])
    text = signed_in.get("/ui/jobs").text
    open_section, failed_section = text.split('id="failed-jobs"')
    failed_section, finished_section = failed_section.split('id="finished-jobs"')
    assert 'value="0.375"' in open_section and "37.5%" in open_section
    assert "state-queued" in open_section and open_jobs_shown(text) == already_open + 2
    assert "RuntimeError: logits have 9 classes" in failed_section
    assert '"done"' not in open_section + failed_section  # succeeded: finished, not failed
    assert '{"done": true}' in finished_section


def test_finished_jobs_are_listed_with_their_outcome_a_page_at_a_time(db, signed_in):
    with db() as session:
        already = session.scalars(select(Job.id).where(Job.state.in_(
            [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]))).all()
        start = datetime.now(UTC)
        session.add_all([Job(kind=JobKind.METRICS, params={"n": n}, progress=1.0,
                             state=JobState.CANCELLED if n == 25 else JobState.SUCCEEDED,
                             finished_at=start + timedelta(seconds=n)) for n in range(26)])
    total = len(already) + 26
    first = signed_in.get("/ui/jobs").text.split('id="finished-jobs"')[1]
    assert f"Finished ({total})" in first and "Nothing queued" not in first
    rows = re.findall(r'<tr data-job="(\d+)">.*?state-(\w+)".*?</tr>', first, re.DOTALL)
    assert len(rows) == 25 and rows[0][1] == "cancelled"  # the last finished first
    assert {state for _job, state in rows[1:]} == {"succeeded"}
    assert f"page 1 of {-(-total // 25)}" in first and 'href="?page=2#finished-jobs"' in first
    second = signed_in.get("/ui/jobs?page=2").text.split('id="finished-jobs"')[1]
    older = re.findall(r'<tr data-job="(\d+)">', second)
    assert len(older) == total - 25 and not {job for job, _state in rows} & set(older)


def test_jobs_name_the_line_versions_and_decision_they_serve_with_links(seeded, db, signed_in):
    with db() as session:
        ids = dict(session.execute(select(ModelVersion.version, ModelVersion.id)).all())
        session.add_all([
            Job(kind=JobKind.INFERENCE, state=JobState.RUNNING, progress=0.5,
                params={"version_id": ids["2"], "evalset": EVALSET}),
            Job(kind=JobKind.METRICS, state=JobState.QUEUED,
                params={"old_version_id": ids["1"], "new_version_id": ids["3"],
                        "evalset": EVALSET}),
            Job(kind=JobKind.MATRIX, state=JobState.QUEUED,
                params={"line": LINE, "evalset": EVALSET}),
            Job(kind=JobKind.TRAIN, state=JobState.FAILED, error="no calibration",
                params={"method": "ensemble", "decision_id": seeded.blocked_id,
                        "version": "2-ensemble"}),
            Job(kind=JobKind.MLFLOW, state=JobState.QUEUED, params={"reconcile": True}),
            Job(kind=JobKind.MATRIX, state=JobState.RUNNING, progress=1.0, params={})])
    text = signed_in.get("/ui/jobs").text
    assert '<span class="progress-value">finishing</span>' in text and "100.0%" not in text
    served = [(href.replace("&amp;", "&"), name) for href, name in re.findall(
        r'<td class="serves"><a href="([^"]+)">([^<]+)</a>', text)]
    for link in [(f"/ui/lines/{LINE}?project=default", f"{LINE}:2 on {EVALSET}"),
                 (f"/ui/lines/{LINE}/pairs/1/3?evalset={EVALSET}&project=default",
                  f"{LINE}: 1 → 3 on {EVALSET}"),
                 (f"/ui/lines/{LINE}?evalset={EVALSET}&project=default#matrix",
                  f"{LINE}: matrix on {EVALSET}"),
                 (f"/ui/decisions/{seeded.blocked_id}?project=default",
                  f"ensemble repair of decision #{seeded.blocked_id} → 2-ensemble")]:
        assert link in served, (link, served)
    assert '<code class="params">{"reconcile": true}</code>' in text  # names nothing
    for href, _name in served:
        assert signed_in.get(href).status_code == 200, href


def test_api_docs_are_served_from_local_assets(client):
    swagger, redoc = client.get("/docs"), client.get("/redoc")
    assert swagger.status_code == redoc.status_code == 200
    assert "/ui/docs-assets/swagger-ui-bundle.js" in swagger.text
    assert "/ui/docs-assets/redoc.standalone.js" in redoc.text
    assert client.get("/ui/docs-assets/swagger-ui-bundle.js").status_code == 200


def test_decision_log_pages_twenty_at_a_time(seeded, signed_in, client):
    for _ in range(20):
        response = client.post("/gate", json={"model": LINE, "candidate": "2"},
                               headers=bearer(ADMIN_TOKEN))
        assert response.json()["verdict"] == "block"
    first = signed_in.get(f"/ui/lines/{LINE}").text
    second = signed_in.get(f"/ui/lines/{LINE}?page=2").text
    log_rows = re.compile(r'<td><a href="/ui/decisions/(\d+)\?project=default">')
    newest = [int(found) for found in log_rows.findall(first)]
    older = [int(found) for found in log_rows.findall(second)]
    assert len(newest) == 20 and len(older) == 2 and min(newest) > max(older)
    assert "page 1 of 2" in first and 'rel="next"' in first and 'rel="prev"' in second
    assert signed_in.get(f"/ui/lines/{LINE}?page=9").text.count("page 2 of 2") == 1


def test_line_history_plots_and_tables_the_gates_numbers(seeded, signed_in, client):
    decision = client.get(f"/gate/decisions/{seeded.blocked_id}",
                          headers=bearer(ADMIN_TOKEN)).json()
    text = signed_in.get(f"/ui/lines/{LINE}").text
    for series in ("er_new", "nfr"):
        point = re.search(rf'class="point blocked" data-series="{series}" data-version="2" '
                          r'data-value="([^"]+)" cx="[^"]+" cy="([^"]+)"', text)
        assert point and float(point.group(1)) == decision["metrics"][EVALSET][series]
    assert '<rect class="blocked" data-version="2"' in text
    assert '<rect class="blocked" data-version="1"' not in text
    assert '<g class="production" data-version="1">' in text
    assert "policy max NFR 5%" in text  # the limit's line, as the policy sets it
    row = re.search(r'<tr id="history-2" class="blocked">(.*?)</tr>', text, re.DOTALL)
    assert row and f"{100 * decision['metrics'][EVALSET]['nfr']:.2f}%" in row.group(1)
    assert decision["reasons"][0]["message"] in row.group(1)
    promotions = re.search(r'<table class="data" id="promotions">(.*?)</table>', text, re.DOTALL)
    assert promotions and promotions.group(1).count("<tr>") == 1 + 1  # header and one move


def test_matrix_opens_on_the_policys_eval_set_with_its_limit_in_the_legend(
        seeded, signed_in, upload_evalset, upload_logits, npz_file):
    path = npz_file(n=SAMPLES, num_classes=CLASSES)
    signed_in.headers.update(bearer(ADMIN_TOKEN))
    assert upload_evalset("aaa-calibration", path).status_code == 201  # sorts first
    for version in ("1", "2"):
        assert upload_logits(f"{LINE}:{version}", "aaa-calibration",
                             seeded.logits[version]).status_code == 201
    queued = signed_in.post(f"/models/{LINE}/matrix", params={"evalset": "aaa-calibration"})
    run_task(signed_in, queued.json()["missing"][0]["job_id"])
    signed_in.headers.pop("Authorization")
    assert "aaa-calibration" in signed_in.get(f"/ui/lines/{LINE}").text  # measured there
    text = signed_in.get(f"/ui/lines/{LINE}").text
    assert re.search(rf'class="active" aria-current="page">{EVALSET}<', text)
    assert "NFR limit 5%" in text and 'data-anchor="0.05"' in text


def test_matrix_outlines_moves_of_production_and_updates_to_the_next_version(
        seeded, signed_in, client):
    moved = client.post(f"/models/{LINE}/aliases/production", json={"version": "3", "force": True},
                        headers=bearer(ADMIN_TOKEN))
    assert moved.is_success, moved.text
    text = signed_in.get(f"/ui/lines/{LINE}").text
    nfr = text.split('data-metric="nfr"')[1].split("</svg>")[0]
    classes = dict(((old, new), kind) for kind, old, new in re.findall(
        r'class="cell(?: above)?([^"]*)" data-old="([^"]+)" data-new="([^"]+)"', nfr))
    assert classes == {("1", "2"): " next", ("2", "3"): " next", ("1", "3"): " promoted",
                       ("2", "1"): "", ("3", "1"): "", ("3", "2"): ""}
    assert "1 → 3: NFR" in nfr and "(a move of production)</title>" in nfr
    labels = re.findall(r'<text class="axis production"[^>]*>([^<]+)<', nfr)
    assert labels == ["3", "3"]  # its column and its row
    assert 'a move of production (now <strong class="production">3</strong>)' in text


@pytest.mark.parametrize("fill", ["#fff7ec", "#f4a03c", "#a50f15", "#f9cf95"])
def test_heatmap_text_contrast_is_aa(fill):
    def contrast(one: str, two: str) -> float:
        light, dark = sorted((luminance(one), luminance(two)), reverse=True)
        return (light + 0.05) / (dark + 0.05)
    assert contrast(fill, ink(fill)) >= 4.5


@pytest.mark.parametrize(("page", "status"), [
    ("/ui/decisions/not-a-number", 422), ("/ui/no-such-page", 404),
    (f"/ui/lines/{LINE}/pairs/1/2", 422), ("/ui/lines/no-such-line", 404),
    (f"/ui/lines/{LINE}?versions=all&metric=pfr", 422)])
def test_errors_under_ui_are_html_pages_with_the_way_back(seeded, signed_in, page, status):
    response = signed_in.get(page)
    assert response.status_code == status
    assert response.headers["content-type"].startswith("text/html")
    assert '<section class="card" id="error">' in response.text and 'href="/ui"' in response.text
    api = signed_in.get("/models/no-such-line", headers=bearer(ADMIN_TOKEN))
    assert error_code(api, 404) == "line_not_found"


def test_dashboard_pages_are_compressed_and_the_api_is_not(seeded, signed_in):
    page = signed_in.get(f"/ui/lines/{LINE}", headers={"Accept-Encoding": "gzip"})
    assert page.headers["content-encoding"] == "gzip" and "<svg" in page.text
    api = signed_in.get(f"/models/{LINE}", headers={**bearer(ADMIN_TOKEN),
                                                    "Accept-Encoding": "gzip"})
    assert api.is_success and "content-encoding" not in api.headers


def test_skip_link_and_sign_in_hint(browser_client):
    text = browser_client.get("/ui/signin").text
    assert '<a class="skip" href="#main">' in text and '<main id="main"' in text
    assert "flipgate token create --name NAME --scopes read" in text


def test_a_repair_whose_result_is_blocked_shows_blocked_with_before_and_after(
        seeded, signed_in, client, db):
    repaired = client.post("/gate", json={"model": LINE, "candidate": "3"},
                           headers=bearer(ADMIN_TOKEN)).json()
    assert repaired["verdict"] == "block", repaired
    weight, curve = ensemble_curve(seeded.logits["1"], seeded.logits["2"], seeded.labels,
                                   0.01)
    with db() as session:  # version 3 stands for the ensemble the repair job registered
        session.add(Job(kind=JobKind.TRAIN, state=JobState.SUCCEEDED, progress=1.0,
                        params={"method": "ensemble", "decision_id": seeded.blocked_id}))
        version = session.scalars(select(ModelVersion).where(ModelVersion.version == "3")).one()
        version.produced_by = {"method": "ensemble", "decision_id": seeded.blocked_id,
                               "weight": weight, "calibration": "calibration-set",
                               "limits": {"max_nfr": 0.01, "max_er_increase": 0.0},
                               "curve": curve}
        row = session.get(Decision, repaired["decision_id"])
        row.repair_of_id = seeded.blocked_id
    before = client.get(f"/gate/decisions/{seeded.blocked_id}",
                        headers=bearer(ADMIN_TOKEN)).json()["metrics"][EVALSET]
    text = signed_in.get(f"/ui/decisions/{seeded.blocked_id}").text
    repair = text.split('<section id="repair">')[1].split("</section>")[0]
    assert 'class="badge verdict-block" id="repair-state"' in repair
    assert "state-succeeded" not in repair and "verdict-approve" not in repair
    cells = re.findall(rf'<td class="num" data-key="nfr">{RATE}</td>', repair)
    after = repaired["metrics"][EVALSET]["nfr"]
    assert [as_rate(cell) for cell in cells] == [pytest.approx(before["nfr"], abs=5e-5),
                                               pytest.approx(after, abs=5e-5)]
    assert f'Chosen weight w = <strong data-share="{weight}">' in repair
    assert '<strong id="calibration-set">calibration-set</strong>' in repair
    assert "max_nfr 1.00%" in repair and 'class="limit-label"' in repair
    assert f'<g class="chosen" data-share="{weight!r}">' in repair
    for key in ("er", "nfr"):
        plotted = re.findall(rf'data-series="{key}" data-share="([^"]+)" data-value="([^"]+)"',
                             repair)
        assert [(float(share), float(value)) for share, value in plotted] == [
            (point["share"], point[key]) for point in curve]
    assert repair.count('<tr class="chosen">') == 1 and "<dt>curve</dt>" not in repair


def test_decision_page_shows_its_callbacks_delivery_state(seeded, signed_in, client, db):
    client.app.state.settings.callback_allowlist = ["127.0.0.1"]
    decision = client.post("/gate", json={"model": LINE, "candidate": "2",
                                          "callback_url": "http://127.0.0.1:9/status"},
                           headers=bearer(ADMIN_TOKEN)).json()
    assert decision["callback"]["state"] == "queued", decision

    def shown() -> str:
        text = signed_in.get(f"/ui/decisions/{decision['decision_id']}").text
        found = re.search(r'<p id="callback">(.*?)</p>', text, re.DOTALL)
        assert found, text
        return " ".join(found.group(1).split())

    assert 'data-state="queued"' in shown() and "0 attempts" in shown()
    settings = Settings(callback_attempts=2, callback_backoff_seconds=10)
    for status, error, expected in ((500, "HTTP 500", 'data-state="queued"'),
                                    (None, "timed out", 'data-state="failed"')):
        with db() as session:
            record_attempt(callback=session.scalars(select(Callback)).one(), status=status,
                           error=error, settings=settings)
        assert expected in shown() and error in shown()
    assert "2 attempts" in shown() and "gave up" in shown()
    with db() as session:
        callback = session.scalars(select(Callback)).one()
        callback.state, callback.attempts = CallbackState.QUEUED, 0
        record_attempt(callback=callback, status=201, error=None, settings=settings)
    assert 'data-state="delivered"' in shown() and "HTTP 201" in shown()
    assert "<code>http://127.0.0.1:9/status</code>" in shown()


def gate_version_4(seeded, signed_in, upload_model, upload_logits) -> dict:
    """Version 4 (version 3's logits) uploaded and gated as the admin, on the dashboard's
    client: the decision, pending while its jobs run."""
    signed_in.headers.update(bearer(ADMIN_TOKEN))
    assert upload_model(LINE, "4", seed=4).status_code == 201
    assert upload_logits(f"{LINE}:4", EVALSET, seeded.logits["3"]).status_code == 201
    pending = signed_in.post("/gate", json={"model": LINE, "candidate": "4"}).json()
    signed_in.headers.pop("Authorization")
    return pending


def test_a_pending_decision_lists_the_jobs_it_waits_for_and_reloads(
        seeded, signed_in, upload_model, upload_logits):
    pending = gate_version_4(seeded, signed_in, upload_model, upload_logits)
    assert pending["verdict"] == "pending" and pending["waiting_for"], pending
    text = signed_in.get(f"/ui/decisions/{pending['decision_id']}").text
    listed = re.search(r'<ul id="waiting-for">(.*?)</ul>', text, re.DOTALL)
    assert listed and [int(job) for job in re.findall(r"job #(\d+)", listed.group(1))] \
        == pending["waiting_for"]
    assert '<meta http-equiv="refresh" content="5">' in text
    final = signed_in.get(f"/ui/decisions/{seeded.blocked_id}").text
    assert 'http-equiv="refresh"' not in final


def test_the_decisions_report_url_opens_its_dashboard_page_after_sign_in(
        seeded, client, mint):
    decision = client.get(f"/gate/decisions/{seeded.blocked_id}").json()
    path = urlsplit(decision["report_url"]).path
    client.headers.pop("Authorization")
    to_signin = client.get(path, follow_redirects=False)
    assert to_signin.status_code == 303 and quote(path, safe="") in to_signin.headers["location"]
    landed = client.post("/ui/signin", data={"token": mint("read"), "next": path})
    assert landed.url.path == path and f"Decision #{seeded.blocked_id}" in landed.text


def test_no_page_shows_a_number_its_decision_does_not_know(seeded, signed_in, db):
    with db() as session:  # every number of the blocked decision's report is null
        decision = session.get(Decision, seeded.blocked_id)
        decision.metrics = {name: dict.fromkeys(numbers)
                            for name, numbers in decision.metrics.items()}
    for page in pages(seeded):
        assert signed_in.get(page).status_code == 200, page
    text = signed_in.get(f"/ui/decisions/{seeded.blocked_id}").text
    metrics = text.split('<section id="metrics">')[1].split("</section>")[0]
    cells = re.findall(r'<td class="num" data-key="([^"]+)">(.*?)</td>', metrics)
    assert len(cells) == 8 and {value for _key, value in cells} == {
        '<span class="unknown">unknown</span>'}, cells
    line = signed_in.get(f"/ui/lines/{LINE}").text
    row = re.search(r'<tr id="history-2" class="blocked">(.*?)</tr>', line, re.DOTALL).group(1)
    shown = dict(re.findall(r'<td class="num" data-key="([^"]+)">(.*?)</td>', row))
    assert shown == dict.fromkeys(("er_new", "nfr", "churn"),
                                  '<span class="unknown">unknown</span>')
    assert 'data-series="nfr" data-version="2"' not in line  # not plotted at 0


def test_links_carry_their_project_and_a_page_of_another_offers_to_switch(
        seeded, browser_client, client, db):
    report_url = client.get(f"/gate/decisions/{seeded.blocked_id}",
                            headers=bearer(ADMIN_TOKEN)).json()["report_url"]
    with db() as session:
        create_project(session=session, name="beta")
    browser_client.post("/ui/signin", data={"token": ADMIN_TOKEN})  # the server admin
    for page in (f"/ui/decisions/{seeded.blocked_id}", f"/ui/lines/{LINE}",
                 f"/ui/lines/{LINE}/pairs/1/2?evalset={EVALSET}"):
        assert browser_client.get("/ui", params={"project": "beta"}).status_code == 200
        elsewhere = browser_client.get(page)  # in beta, remembered
        assert elsewhere.status_code == 404, page
        switch = re.search(r'<a href="([^"]+)" data-project="default">', elsewhere.text)
        assert switch, elsewhere.text
        opened = browser_client.get(switch.group(1).replace("&amp;", "&"))
        assert opened.status_code == 200 and 'selected>default</option>' in opened.text, page
    assert browser_client.get("/ui", params={"project": "beta"}).status_code == 200
    link = urlsplit(report_url)
    assert link.query == "project=default"
    opened = browser_client.get(f"{link.path}?{link.query}")
    assert opened.status_code == 200 and f"Decision #{seeded.blocked_id}" in opened.text
    assert f'href="/ui/lines/{LINE}/pairs/1/2?evalset={EVALSET}&amp;project=default"' \
        in opened.text


def test_the_home_page_names_its_project_and_the_viewers_role(seeded, browser_client, mint):
    for token, role in ((mint("read"), "viewer"), (ADMIN_TOKEN, "admin"),
                        (mint("read", "gate"), "gatekeeper"),
                        (mint("read", "write", "gate"), "scopes gate, read, write")):
        browser_client.post("/ui/signin", data={"token": token})
        text = browser_client.get("/ui").text
        assert '<span id="home-project">default</span>' in text
        shown = re.search(r'<p class="muted" id="home-role">(.*?)</p>', text, re.DOTALL)
        assert shown and f"<strong>{role}</strong> in project default" in shown.group(1), role


def test_verdict_badges_link_to_their_decisions(seeded, signed_in):
    badge = r'<a class="badge-link" href="/ui/decisions/(\d+)\?project=default"><span ' \
            r'class="badge verdict-(\w+)">'
    home = re.findall(badge, signed_in.get("/ui").text)
    assert home == [(str(seeded.blocked_id), "block")]
    line = signed_in.get(f"/ui/lines/{LINE}").text
    log = line.split('id="decision-log"')[1].split("</table>")[0]
    history = line.split('id="history-table"')[1].split("</table>")[0]
    assert re.findall(badge, log) == [(str(seeded.blocked_id), "block"),
                                      (str(seeded.blocked_id - 1), "approve")]
    assert sorted(re.findall(badge, history)) == sorted(re.findall(badge, log))
    for decision_id, verdict in re.findall(badge, log):
        assert f'<span class="badge verdict-{verdict}">' in signed_in.get(
            f"/ui/decisions/{decision_id}").text


def test_a_version_waiting_for_its_decision_is_pending_not_ungated(
        seeded, signed_in, upload_model, upload_logits):
    pending = gate_version_4(seeded, signed_in, upload_model, upload_logits)
    assert pending["verdict"] == "pending", pending
    line = signed_in.get(f"/ui/lines/{LINE}").text
    row = re.search(r'<tr id="history-4" class="">(.*?)</tr>', line, re.DOTALL).group(1)
    assert "not gated" not in row
    assert (f'<a class="badge-link" href="/ui/decisions/{pending["decision_id"]}?project='
            'default"><span class="badge verdict-pending">pending</span></a>') in row
    assert "not gated" in re.search(r'<tr id="history-3" class="">(.*?)</tr>', line,
                                    re.DOTALL).group(1)


def test_a_repairs_decision_names_what_it_repairs_and_whether_it_went_to_production(
        seeded, signed_in, client, db):
    repaired = client.post("/gate", json={"model": LINE, "candidate": "3"},
                           headers=bearer(ADMIN_TOKEN)).json()
    with db() as session:  # version 3 stands for the version a repair job registered
        session.add(Job(kind=JobKind.TRAIN, state=JobState.SUCCEEDED, progress=1.0,
                        params={"method": "ensemble", "decision_id": seeded.blocked_id}))
        version = session.scalars(select(ModelVersion).where(ModelVersion.version == "3")).one()
        version.produced_by = {"method": "ensemble", "decision_id": seeded.blocked_id}
        session.get(Decision, repaired["decision_id"]).repair_of_id = seeded.blocked_id

    def shown(decision_id: int, where: str) -> str:
        text = signed_in.get(f"/ui/decisions/{decision_id}").text
        section = text.split('<section id="repair">')[1].split("</section>")[0]
        assert "No repair was asked for" not in section
        found = re.search(rf'<p id="{where}">(.*?)</p>', section, re.DOTALL)
        assert found, section
        return " ".join(found.group(1).split())

    repair = shown(repaired["decision_id"], "repair-of")
    assert (f'the repair of <a href="/ui/decisions/{seeded.blocked_id}?project=default">'
            f"decision #{seeded.blocked_id}</a>") in repair
    assert 'data-production="never"' in repair
    assert 'data-production="never"' in shown(seeded.blocked_id, "repaired")
    moved = client.post(f"/models/{LINE}/aliases/production", headers=bearer(ADMIN_TOKEN),
                        json={"version": "3", "force": True})
    assert moved.is_success, moved.text
    assert 'data-production="now"' in shown(repaired["decision_id"], "repair-of")
    assert 'data-production="now"' in shown(seeded.blocked_id, "repaired")
    assert client.post(f"/models/{LINE}/aliases/production", headers=bearer(ADMIN_TOKEN),
                       json={"version": "1", "force": True}).is_success
    assert 'data-production="was"' in shown(repaired["decision_id"], "repair-of")


RAW_FRACTION = re.compile(r'<td class="num"[^>]*>\s*0\.\d{3,}\s*</td>|<title>[^<]* 0\.\d{3,}[^<]*'
                          r"</title>|<text[^>]*>!?0\.\d{3,}</text>")  # a rate as a bare fraction


def test_numbers_are_written_one_way_percentages_as_the_pair_report_does(
        seeded, signed_in, client):
    decision = client.get(f"/gate/decisions/{seeded.blocked_id}",
                          headers=bearer(ADMIN_TOKEN)).json()
    text = signed_in.get(f"/ui/decisions/{seeded.blocked_id}").text
    metrics = text.split('<section id="metrics">')[1].split("</section>")[0]
    head = metrics.split("</thead>")[0]
    assert "er_old" not in head and "mcnemar_p" not in head and "Error before" in head
    cells = dict(re.findall(r'<td class="num" data-key="([^"]+)">(.*?)</td>', metrics))
    measured = decision["metrics"][EVALSET]
    for key in ("nfr", "pfr", "er_old", "er_new", "churn"):
        shown = re.fullmatch(rf'{RATE}(?: <span class="interval">\(95% CI {RATE} – {RATE}\)'
                             r"</span>)?", cells[key])
        assert shown and as_rate(shown.group(1)) == pytest.approx(measured[key], abs=5e-5), key
        interval = shown.group(2) and [as_rate(shown.group(2)), as_rate(shown.group(3))]
        assert interval == (pytest.approx(measured["nfr_interval"], abs=5e-5) if key == "nfr"
                            else None), key  # NFR with its 95% interval
    assert cells["negative_flips"] == str(measured["negative_flips"])
    reason = decision["reasons"][0]
    assert reason["code"] == "max_nfr"
    reasons = text.split('<section id="reasons">')[1].split("</section>")[0]
    for key in ("measured", "limit"):
        shown = re.search(rf'data-key="{key}">{RATE}<', reasons)
        assert shown and as_rate(shown.group(1)) == pytest.approx(reason[key], abs=5e-5)
    line = signed_in.get(f"/ui/lines/{LINE}").text
    assert "<dt>NFR</dt><dd>at most 5%</dd>" in line  # the policy card
    for page in pages(seeded):
        shown = signed_in.get(page).text
        assert not RAW_FRACTION.search(shown), (page, RAW_FRACTION.search(shown))


BARE_FRACTION = re.compile(r"(?<![\w.])0\.\d+(?![\d%])")  # 0.2027 where 20.27% belongs


def test_a_reason_and_the_policy_are_written_in_percentages_not_fractions_or_keys(
        seeded, signed_in, client):
    """The blocked decision's reason reads its NFR, interval and limit in percentages on the
    decision page and on the line page (history and decision log), while the API keeps its
    fields as fractions; the policy card and its earlier versions name each limit as the
    reasons do, its bound in percent, not by its API key."""
    decision = client.get(f"/gate/decisions/{seeded.blocked_id}",
                          headers=bearer(ADMIN_TOKEN)).json()
    [reason] = decision["reasons"]
    nfr = compare_logits(seeded.logits["1"], seeded.logits["2"], seeded.labels)["nfr"]
    assert (reason["measured"], reason["limit"]) == (pytest.approx(nfr), 0.05)  # fractions
    low, high = decision["metrics"][EVALSET]["nfr_interval"]
    sentence = (f"on {EVALSET}: NFR {100 * nfr:.2f}% (95% interval {100 * low:.2f}% – "
                f"{100 * high:.2f}%) is above the maximum 5%")
    assert reason["message"] == sentence and low < nfr < high
    page = signed_in.get(f"/ui/decisions/{seeded.blocked_id}").text
    reasons = page.split('<section id="reasons">')[1].split("</section>")[0]
    assert f'<td class="text">{sentence}</td>' in reasons
    assert not BARE_FRACTION.search(reasons), BARE_FRACTION.search(reasons)
    assert client.put(f"/models/{LINE}/policy", headers=bearer(ADMIN_TOKEN), json={
        "max_nfr": 0.0125, "max_churn": 0.2, "evalsets": [EVALSET]}).is_success
    line = signed_in.get(f"/ui/lines/{LINE}").text
    shown = re.findall(r'<td class="reasons">(.*?)</td>', line, re.DOTALL)
    assert sum(sentence in cell for cell in shown) == 2  # the history row and the log
    policy = line.split('<section id="policy">')[1].split("</section>")[0]
    assert "<dt>NFR</dt><dd>at most 1.25%</dd><dt>churn</dt><dd>at most 20%</dd>" in policy, policy
    earlier = policy.split("earlier version")[1]
    assert f"NFR at most 5%; eval sets {EVALSET}" in earlier
    for text in (*shown, policy):
        assert not BARE_FRACTION.search(text), BARE_FRACTION.search(text)
        assert not re.search(r"\b(max_nfr|max_churn|evalsets|er_old)\b", text), text
