"""The dashboard on a traffic set (an eval set without labels) whose disagreements are partly
labelled, over HTTP on the real app and database: what the pages show is what the API
knows (churn exact; NFR unknown, or its interval from the labels; never 0), the known
negative flips drawn as the gallery draws them, the disagreements' exports linked, and the
pending decision's numbers in its table.

The line `digits` has two external versions whose logits are uploaded on `traffic`: 8x8
digits as an (N, 8, 8) float input with ids and no `images`; `old` is in production, a
policy limits NFR on `traffic` and the gate on `new` waits for labels, of which the first
disagreements of the export (at least 12, and two known negative flips) have arrived."""

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.service.api.conftest import (
    ADMIN_TOKEN,
    bearer,
    import_labels,
    measure,
    npz_bytes,
    post_logits,
    run_task,
    shared_store,
)
from tests.traffic_digits import digits_files
from tests.ui.conftest import RATE, as_rate

LINE, TRAFFIC, OLD, NEW = "digits", "traffic", "digits:old", "digits:new"
KNOWN_NEGATIVE = 2  # the first 12 disagreements are labelled, more until 2 flips are known


@dataclass(frozen=True)
class Traffic:
    """The seeded decision and what the API says of the pair."""

    decision: dict
    report: dict
    matrix: dict


def seed_traffic(client, folder: Path) -> Traffic:
    """The line, the traffic set, a pending decision and the first labels (see the module)."""
    digits = digits_files(folder)
    with np.load(digits.traffic) as data:
        np.savez(folder / "drawn.npz", x=data["x"].reshape(-1, 8, 8), ids=data["ids"])
    assert client.post("/evalsets", data={"name": TRAFFIC}, files={
        "data": ("drawn.npz", (folder / "drawn.npz").read_bytes())}).status_code == 201
    for ref, logits in ((OLD, digits.old), (NEW, digits.new)):
        assert client.post("/models", data={"name": LINE, "version": ref.split(":")[1],
                                            "num_classes": "10"}).status_code == 201
        assert post_logits(client, ref, TRAFFIC, np.load(logits)).status_code == 201
    assert client.post("/gate", json={"model": LINE, "candidate": "old"}).is_success
    assert client.post(f"/models/{LINE}/aliases/production", json={"version": "old"}).is_success
    measure(client, OLD, NEW, TRAFFIC)
    order = np.array([row["index"] for row in client.get(
        f"/compare/{OLD}/{NEW}/disagreements", params={"evalset": TRAFFIC}).json()])
    negative = (digits.old_pred[order] == digits.truth[order]) & \
        (digits.new_pred[order] != digits.truth[order])
    labelled = order[:max(12, int(np.flatnonzero(negative)[KNOWN_NEGATIVE - 1]) + 1)]
    assert import_labels(client, TRAFFIC, npz_bytes(
        index=labelled, y=digits.truth[labelled])).status_code == 201
    report = client.get(f"/compare/{OLD}/{NEW}", params={"evalset": TRAFFIC}).json()
    low, high = report["disagreements"]["nfr_interval"]
    assert client.put(f"/models/{LINE}/policy", json={
        "max_nfr": round((low + high) / 2, 6), "evalsets": [TRAFFIC]}).is_success
    decision = client.post("/gate", json={"model": LINE, "candidate": "new"}).json()
    assert decision["verdict"] == "pending" and decision["labels_needed"], decision
    queued = client.post(f"/models/{LINE}/matrix", params={"evalset": TRAFFIC})
    run_task(client, queued.json()["missing"][0]["job_id"])
    matrix = client.get(f"/models/{LINE}/matrix", params={"evalset": TRAFFIC}).json()
    return Traffic(decision, report, matrix)


client, settings = shared_store(client=seed_traffic)


@pytest.fixture
def traffic(client, module_store) -> Traffic:
    return module_store.seeded


def test_the_matrix_shows_churn_and_never_an_unknown_nfr_as_a_number(traffic, signed_in):
    assert traffic.matrix["nfr"][0][1] is None and traffic.matrix["churn"][0][1] > 0
    text = signed_in.get(f"/ui/lines/{LINE}").text
    nfr = text.split('data-metric="nfr"')[1].split("</svg>")[0]
    cells = dict(((old, new), value) for old, new, value in re.findall(
        r'data-old="([^"]+)" data-new="([^"]+)" data-value="([^"]+)"', nfr))
    assert cells == {("old", "new"): "unknown", ("new", "old"): "unknown"}
    low, high = traffic.report["disagreements"]["nfr_interval"]
    assert f"old → new: NFR unknown (95% interval {100 * low:.2f}% – {100 * high:.2f}%" in nfr
    assert "new → old: NFR unknown (a traffic set: churn only" in nfr
    churn = text.split('data-metric="churn"')[1].split("</svg>")[0]
    shown = re.search(r'data-old="old" data-new="new" data-value="([^"]+)"', churn)
    assert float(shown.group(1)) == traffic.matrix["churn"][0][1]
    table = re.search(r'<table class="data matrix-table" id="matrix-table">(.*?)</table>', text,
                      re.DOTALL).group(1)
    churn = traffic.matrix["churn"][0][1]
    assert f"{100 * low:.2f}% – {100 * high:.2f}%</span> / {100 * churn:.2f}%" in table
    assert "0.00% /" not in table and 'data-nfr="0.0"' not in table


def test_a_pair_counted_on_traffic_shows_nfr_unknown(traffic, signed_in):
    text = signed_in.get(f"/ui/lines/{LINE}/pairs/new/old", params={"evalset": TRAFFIC}).text
    assert 'data-metric="nfr"><span class="unknown">unknown</span>' in text
    assert 'data-metric="pfr"><span class="unknown">unknown</span>' in text
    churn = re.search(rf'data-metric="churn">{RATE}<', text)
    assert as_rate(churn.group(1)) == pytest.approx(traffic.matrix["churn"][1][0], abs=5e-5)


def test_the_traffic_pair_page_draws_the_known_negative_flips_and_links_the_exports(
        traffic, signed_in):
    known = traffic.report["disagreements"]["negative_flips_known"]
    assert KNOWN_NEGATIVE <= known <= 48  # one page
    text = signed_in.get(f"/ui/lines/{LINE}/pairs/old/new", params={"evalset": TRAFFIC}).text
    assert f"<h2>Known negative flips ({known})</h2>" in text
    assert len(re.findall(r'<li class="flip"', text)) == known
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', text)) == known
    assert "not images" not in text and "GET /compare/{old}" not in text
    links = dict(re.findall(r'<a href="([^"]+)" data-format="([^"]+)" download>', text))
    assert sorted(links.values()) == ["csv", "json", "label-studio"]
    for href, export_format in links.items():
        href = href.replace("&amp;", "&")
        assert f"evalset={TRAFFIC}" in href and "project=default" in href, href
        exported = signed_in.get(href)
        assert exported.status_code == 200, exported.text
        disposition = exported.headers["content-disposition"]
        assert disposition.startswith("attachment; filename*=UTF-8''digits-old-new-traffic")
        assert disposition.endswith(".csv" if export_format == "csv" else ".json")
    csv = signed_in.get(next(h for h, f in links.items() if f == "csv").replace("&amp;", "&"))
    assert len(csv.text.splitlines()) == 1 + traffic.report["disagreements"]["count"]


def test_the_pending_decision_tables_its_numbers_and_does_not_reload(traffic, signed_in):
    decision = signed_in.get(f"/gate/decisions/{traffic.decision['decision_id']}",
                             headers=bearer(ADMIN_TOKEN)).json()
    assert decision["verdict"] == "pending" and decision["waiting_for"] == []
    text = signed_in.get(f"/ui/decisions/{decision['decision_id']}").text
    assert 'http-equiv="refresh"' not in text
    row = re.search(rf'<tr data-evalset="{TRAFFIC}">(.*?)</tr>', text, re.DOTALL).group(1)
    numbers = decision["metrics"][TRAFFIC]

    def cell(key: str) -> str:
        return re.sub(r"<[^>]+>", "", re.search(rf'data-key="{key}">(.*?)</td>', row,
                                                re.DOTALL).group(1)).strip()

    low, high = numbers["nfr_interval"]
    assert as_rate(cell("nfr_estimate")) == pytest.approx(numbers["nfr_estimate"], abs=5e-5)
    assert cell("nfr_interval") == f"{100 * low:.2f}% – {100 * high:.2f}%"
    assert as_rate(cell("max_nfr")) == pytest.approx(decision["policy"]["max_nfr"], abs=5e-5)
    assert cell("unlabelled").startswith(f"{numbers['unlabelled']} ")
    to_decide = next(r["labels_to_decide"] for r in decision["reasons"] if r.get("pending"))
    assert f"about {to_decide} would decide" in cell("unlabelled")
    metrics = re.search(r'<section id="metrics">(.*?)</section>', text, re.DOTALL).group(1)
    assert 'data-key="nfr"><span class="interval"' in metrics and ">0.00%" not in metrics
