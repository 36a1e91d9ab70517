"""Traffic sets through the server: digits without `y` registered as a traffic set, two
external versions' logged logits uploaded on it, the traffic report and the disagreements'
export (in the order `flipgate compare` computes), labels imported append-only as
revisions, and the reports measured again with each (NFR exact once the disagreements are
labelled)."""

import json

import numpy as np
import pytest
from sqlalchemy import select

from flipgate.gate_client import (
    LABELS_NEEDED_EXIT,
    Credentials,
    GateClient,
    decide,
    describe,
    exit_code,
)
from flipgate.metrics import count_flips
from flipgate.metrics.traffic import UNLABELLED, traffic_report
from service.datasets.models import DatasetLabels
from service.housekeeping import referenced_artifacts
from service.registry.service import create_line
from tests.service.api.conftest import (
    ADMIN_TOKEN,
    error_code,
    import_labels,
    measure,
    npy_bytes,
    npz_bytes,
    post_logits,
    run_task,
)
from tests.service.conftest import write_npz
from tests.traffic_digits import NAMES, annotated, digits_files

OLD, NEW, TRAFFIC = "digits:old", "digits:new", "traffic"


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return digits_files(tmp_path_factory.mktemp("traffic-api"))


@pytest.fixture
def traffic_line(client, db, digits):
    """Line `digits` with external versions old and new, their logits on the traffic set."""
    with db() as session:
        create_line(session=session, name="digits", num_classes=10, class_names=NAMES.tolist())
    response = client.post("/evalsets", data={"name": TRAFFIC},
                           files={"data": ("traffic.npz", digits.traffic.read_bytes())})
    assert response.status_code == 201, response.text
    for ref, logits in ((OLD, digits.old), (NEW, digits.new)):
        assert client.post("/models", data={"name": "digits", "version": ref.split(":")[1]}
                           ).status_code == 201
        assert post_logits(client, ref, TRAFFIC, np.load(logits)).status_code == 201
    return digits






def test_a_traffic_set_is_listed_unlabeled(client, traffic_line):
    listed = {entry["name"]: entry for entry in client.get("/evalsets").json()}
    assert listed[TRAFFIC]["labeled"] is False and listed[TRAFFIC]["num_classes"] == 10


def test_traffic_report_and_export_as_the_cli_computes_them(client, traffic_line, run_cli,
                                                            tmp_path):
    digits = traffic_line
    report = measure(client, OLD, NEW, TRAFFIC)
    changed = digits.old_pred != digits.new_pred
    assert report["traffic"] and report["churn"] == changed.mean()
    assert report["nfr"] is None and report["label_revision"] == 0
    assert report["nfr_bounds"] == [0.0, report["churn"]]
    page = client.get(f"/compare/{OLD}/{NEW}", params={"evalset": TRAFFIC, "format": "html"})
    assert "the samples have no labels" in page.text and "Changed predictions" in page.text
    exported = client.get(f"/compare/{OLD}/{NEW}/disagreements",
                          params={"evalset": TRAFFIC, "format": "json"})
    assert exported.status_code == 200, exported.text
    local = tmp_path / "local.json"
    assert run_cli("compare", digits.old, digits.new, "--evalset", digits.traffic,
                   "--disagreements", local, "--json").code == 0
    served = [row["index"] for row in exported.json()]
    assert served == [row["index"] for row in json.loads(local.read_text())]
    assert sorted(served) == np.flatnonzero(changed).tolist()
    csv_rows = client.get(f"/compare/{OLD}/{NEW}/disagreements",
                          params={"evalset": TRAFFIC, "format": "csv"}).text.splitlines()
    assert len(csv_rows) == 1 + len(served)
    matrix = client.post("/models/digits/matrix", params={"evalset": TRAFFIC})
    for job_id in [p["job_id"] for p in matrix.json()["missing"]][:1]:
        run_task(client, job_id)
    cells = client.get("/models/digits/matrix", params={"evalset": TRAFFIC}).json()
    assert cells["churn"][0][1] == changed.mean() and cells["nfr"][0][1] is None


def test_labels_arrive_in_revisions_and_make_nfr_exact(client, traffic_line, db):
    digits = traffic_line
    measure(client, OLD, NEW, TRAFFIC)
    order = [row["index"] for row in client.get(
        f"/compare/{OLD}/{NEW}/disagreements", params={"evalset": TRAFFIC}).json()]
    half, rest = order[: len(order) // 2], order[len(order) // 2:]
    ids = np.array([f"req-{i}" for i in half])
    first = import_labels(client, TRAFFIC, npz_bytes(ids=ids, y=NAMES[digits.truth[half]]))
    assert first.status_code == 201 and first.json()["revision"] == 1
    partial = client.get(f"/compare/{OLD}/{NEW}", params={"evalset": TRAFFIC}).json()
    full = count_flips(digits.old_pred, digits.new_pred, digits.truth).rates()
    low, high = partial["disagreements"]["nfr_interval"]
    assert partial["label_revision"] == 1 and low <= full["nfr"] <= high
    again = import_labels(client, TRAFFIC, npz_bytes(index=np.array(half), y=digits.truth[half]))
    assert again.status_code == 200 and again.json() == {
        "revision": 1, "added": 0, "labelled": len(half), "job_ids": []}
    wrong = (digits.truth[half[:1]] + 1) % 10
    refused = import_labels(client, TRAFFIC, npz_bytes(index=np.array(half[:1]), y=wrong))
    assert error_code(refused, 409) == "label_conflict"
    assert f"req-{half[0]}" in refused.json()["error"]["message"]
    second = import_labels(client, TRAFFIC, npz_bytes(index=np.array(rest), y=digits.truth[rest]))
    assert second.json()["revision"] == 2
    exact = client.get(f"/compare/{OLD}/{NEW}", params={"evalset": TRAFFIC}).json()
    assert exact["label_revision"] == 2 and exact["disagreements"]["complete"]
    assert (exact["nfr"], exact["pfr"]) == (full["nfr"], full["pfr"])
    with db() as session:  # what `flipgate store gc` keeps
        kept = referenced_artifacts(session=session)
        revisions = session.scalars(select(DatasetLabels.sha256)).all()
    assert {exact["export_sha256"], *revisions} <= kept and len(revisions) == 2


def test_a_label_studio_export_imports_as_labels(client, traffic_line):
    digits = traffic_line
    measure(client, OLD, NEW, TRAFFIC)
    tasks = client.get(f"/compare/{OLD}/{NEW}/disagreements",
                       params={"evalset": TRAFFIC, "format": "label-studio"}).json()
    assert [p["model_version"] for p in tasks[0]["predictions"]] == [OLD, NEW]
    export = [{"id": number, "data": task["data"], "annotations": [{"result": [
        {**task["predictions"][0]["result"][0],
         "value": {"choices": [str(NAMES[digits.truth[task["data"]["index"]]])]}}],
        "was_cancelled": False}]} for number, task in enumerate(tasks[:5], start=1)]
    answer = import_labels(client, TRAFFIC, json.dumps(export).encode(), "export.json")
    assert answer.status_code == 201 and answer.json()["added"] == 5
    report = client.get(f"/compare/{OLD}/{NEW}", params={"evalset": TRAFFIC}).json()
    assert report["disagreements"]["labelled_prefix"] == 5


def test_labels_go_to_traffic_sets_only(client, traffic_line):
    assert client.post("/evalsets", data={"name": "labeled"}, files={
        "data": ("l.npz", traffic_line.labeled.read_bytes())}).status_code == 201
    refused = client.post("/evalsets/labeled/labels", files={
        "labels": ("l.npz", npz_bytes(index=np.array([0]), y=np.array([1])))})
    assert error_code(refused, 422) == "not_a_traffic_set"


def test_a_gate_on_traffic_waits_for_labels_then_settles(client, traffic_line, mint):
    """max_nfr inside the interval that half of the export gives: pending (labels_needed, 202)
    with no labels and with half of them; final, as numpy's NFR says, once all arrive."""
    digits = traffic_line
    promote_old(client)
    measure(client, OLD, NEW, TRAFFIC)
    order = np.array([row["index"] for row in client.get(
        f"/compare/{OLD}/{NEW}/disagreements", params={"evalset": TRAFFIC}).json()])
    half, rest = order[: order.size // 2], order[order.size // 2:]
    low, high = half_interval(digits, order, half)
    limit = round((low + high) / 2, 6)
    assert client.put("/models/digits/policy", json={
        "max_nfr": limit, "max_churn": 0.5, "max_class_nfr": 0.1,
        "evalsets": [TRAFFIC]}).is_success
    client.app.state.settings.callback_allowlist = ["127.0.0.1"]
    asked = client.post("/gate", json={"model": "digits", "candidate": "new",
                                       "callback_url": "http://127.0.0.1:9/status"})
    assert asked.status_code == 202 and asked.json()["labels_needed"] == order.size
    decision = asked.json()["decision_id"]
    reasons = {reason["code"]: reason for reason in asked.json()["reasons"]}
    assert reasons["labels_needed"]["export_url"].endswith("format=label-studio")
    assert "max_class_nfr" in reasons["not_applicable_on_traffic"]["message"]
    import_labels(client, TRAFFIC, npz_bytes(index=half, y=digits.truth[half]))
    waiting = client.get(f"/gate/decisions/{decision}").json()
    assert waiting["verdict"] == "pending" and waiting["labels_needed"] == rest.size
    assert waiting["callback"] is None  # no status is sent before the verdict is final
    page = dashboard_page(client, mint, f"/ui/decisions/{decision}")
    for other in ("/ui/lines/digits", f"/ui/lines/digits/pairs/old/new?evalset={TRAFFIC}"):
        assert client.get(other).status_code == 200, other
    assert f'<td class="num" data-key="labelled">{half.size}</td>' in page
    link = (f"/ui/lines/digits/pairs/old/new/disagreements?evalset={TRAFFIC}"
            "&format=label-studio&project=default")
    assert f'href="{link.replace("&", "&amp;")}"' in page and "waits for labels" in page
    assert [task["data"]["index"] for task in client.get(link).json()] == order.tolist()
    import_labels(client, TRAFFIC, npz_bytes(index=rest, y=digits.truth[rest]))
    final = client.get(f"/gate/decisions/{decision}").json()
    true_nfr = count_flips(digits.old_pred, digits.new_pred, digits.truth).rates()["nfr"]
    assert final["verdict"] == ("block" if true_nfr > limit else "approve")
    assert final["decided_at"] is not None and final["labels_needed"] is None
    assert final["callback"]["state"] == "queued"


def test_labels_measure_again_and_settle_as_the_jobs_of_the_labels_request(client,
                                                                          traffic_line):
    """The metrics job the labels queued writes the traffic report measured again and the
    decision it settles to the audit trail, as the job, under the labels request's id."""
    digits = traffic_line
    promote_old(client)
    churn = measure(client, OLD, NEW, TRAFFIC)["churn"]
    assert client.put("/models/digits/policy", json={
        "max_nfr": round(churn / 2, 6), "evalsets": [TRAFFIC]}).is_success
    asked = client.post("/gate", json={"model": "digits", "candidate": "new"})
    assert asked.status_code == 202 and asked.json()["labels_needed"]
    decision = asked.json()["decision_id"]
    every = np.arange(digits.truth.size)
    posted = client.post(f"/evalsets/{TRAFFIC}/labels", headers={"X-Request-ID": "labels-1"},
                         files={"labels": ("l.npz", npz_bytes(index=every,
                                                              y=digits.truth[every]))})
    (job_id,) = posted.json()["job_ids"]
    run_task(client, job_id)
    verdict = client.get(f"/gate/decisions/{decision}").json()["verdict"]
    assert verdict != "pending"
    found = [event for event in client.get("/audit-events").json()["events"]
             if event["auth"] == "job"]
    assert [(event["actor"], event["action"], event["resource"], event["request_id"],
             event["details"]) for event in found] == [
        (f"job {job_id}", "settle_decision", f"/gate/decisions/{decision}", "labels-1",
         {"job_id": job_id, "kind": "metrics", "decision_id": decision, "verdict": verdict}),
        (f"job {job_id}", "measure_with_labels", f"/compare/{OLD}/{NEW}?evalset={TRAFFIC}",
         "labels-1", {"job_id": job_id, "kind": "metrics", "label_revision": 1,
                      "previous_revision": 0})]


def dashboard_page(client, mint, path: str) -> str:
    """A dashboard page as a signed-in person (a read-only token's session) sees it."""
    assert client.post("/ui/signin", data={"token": mint("read")},
                       follow_redirects=False).status_code == 303
    return client.get(path).text


def promote_old(client) -> None:
    """Make `old` production (the gate approves a line's first version)."""
    assert client.post("/gate", json={"model": "digits", "candidate": "old"}).json()[
        "verdict"] == "approve"
    assert client.post("/models/digits/aliases/production", json={"version": "old"}).is_success


def half_interval(digits, order, half) -> tuple[float, float]:
    """NFR's interval from the labels of `half` (a prefix of the export order)."""
    labels = np.full(digits.truth.size, UNLABELLED)
    labels[half] = digits.truth[half]
    report = traffic_report(digits.old_pred, digits.new_pred, num_classes=10, order=order,
                            labels=labels)
    return tuple(report["disagreements"]["nfr_interval"])


def test_flipgate_gate_stops_at_once_when_labels_are_needed(client, traffic_line):
    promote_old(client)
    measure(client, OLD, NEW, TRAFFIC)
    assert client.put("/models/digits/policy", json={"max_nfr": 0.01,
                                                     "evalsets": [TRAFFIC]}).is_success
    gate = GateClient(client, Credentials(token=ADMIN_TOKEN))
    decision = decide(gate, {"model": "digits", "candidate": "new"}, "delivery-1",
                      timeout=3, poll=0.05)
    assert exit_code(decision) == LABELS_NEEDED_EXIT
    printed = "\n".join(describe(decision))
    assert f"label {decision['labels_needed']} disagreements of {TRAFFIC}" in printed
    assert "/disagreements?evalset=traffic&format=label-studio" in printed


def test_computed_versions_are_scored_on_a_traffic_set(client, upload_model, tmp_path,
                                                       run_cli, onnx_file):
    """ONNX versions' inference jobs run on a traffic set; the report is the CLI's."""
    with np.load(write_npz(tmp_path, n=40)) as labeled:
        np.savez(tmp_path / "t.npz", x=labeled["x"])
    assert client.post("/evalsets", data={"name": "t"}, files={
        "data": ("t.npz", (tmp_path / "t.npz").read_bytes())}).status_code == 201
    for version, seed in (("1", 1), ("2", 2)):
        assert upload_model("lin", version, seed=seed).status_code == 201
    served = measure(client, "lin:1", "lin:2", "t")
    local = run_cli("compare", onnx_file(3, 1), onnx_file(3, 2), "--evalset", tmp_path / "t.npz",
                    "--json", "--device", "cpu")
    expected = json.loads(local.out)
    assert served["traffic"] and served["changed"] == expected["changed"] > 0
    assert served["changes"] == expected["changes"]


def test_labels_only_versions_are_compared_on_a_traffic_set(client, traffic_line):
    """Versions known by their logged labels alone: churn and the export, no scores."""
    digits = traffic_line
    for version, predicted in (("a", digits.old_pred), ("b", digits.new_pred)):
        assert client.post("/models", data={"name": "digits", "version": version}).is_success
        assert client.post(f"/models/digits/versions/{version}/predictions",
                           data={"evalset": TRAFFIC}, files={"labels": (
                               "labels.npy", npy_bytes(NAMES[predicted]))}).status_code == 201
    report = measure(client, "digits:a", "digits:b", TRAFFIC)
    assert report["labels_only"] and report["schurn"] is None
    assert report["churn"] == np.mean(digits.old_pred != digits.new_pred)
    rows = client.get("/compare/digits:a/digits:b/disagreements",
                      params={"evalset": TRAFFIC}).json()
    assert rows[0]["old_confidence"] is None and rows[0]["old"] in NAMES



def test_a_set_without_classes_takes_the_names_its_export_shows(client, traffic_line, tmp_path):
    """The export names classes as the line does; its labels map back by those names."""
    digits = traffic_line
    with np.load(digits.traffic) as arrays:
        np.savez(tmp_path / "plain.npz", x=arrays["x"])
    assert client.post("/evalsets", data={"name": "plain"}, files={
        "data": ("plain.npz", (tmp_path / "plain.npz").read_bytes())}).status_code == 201
    for ref, logits in ((OLD, digits.old), (NEW, digits.new)):
        assert post_logits(client, ref, "plain", np.load(logits)).status_code == 201
    measure(client, OLD, NEW, "plain")
    tasks = client.get(f"/compare/{OLD}/{NEW}/disagreements",
                       params={"evalset": "plain", "format": "label-studio"}).json()[:3]
    export = [{"data": task["data"], "annotations": [{"result": [
        {**task["predictions"][1]["result"][0]}], "was_cancelled": False}]} for task in tasks]
    answer = client.post("/evalsets/plain/labels",
                         files={"labels": ("export.json", json.dumps(export).encode())})
    assert answer.status_code == 201, answer.text
    assert answer.json()["added"] == 3


def test_the_export_of_a_line_without_class_names_imports_back_as_it_is(client, traffic_line,
                                                                       run_cli, tmp_path):
    """A line without class names: its export's choices are the column numbers "0"…"9", and
    the export imports back as it is, unannotated (nothing new) and annotated by Label
    Studio, on the server as `flipgate compare --labels` reads it."""
    digits = traffic_line
    with np.load(digits.traffic) as arrays:
        np.savez(tmp_path / "bare.npz", x=arrays["x"], images=arrays["images"])
    assert client.post("/evalsets", data={"name": "bare"}, files={
        "data": ("bare.npz", (tmp_path / "bare.npz").read_bytes())}).status_code == 201
    for version, logits in (("old", digits.old), ("new", digits.new)):
        assert client.post("/models", data={"name": "bare", "version": version,
                                            "num_classes": "10"}).status_code == 201
        assert post_logits(client, f"bare:{version}", "bare", np.load(logits)).status_code == 201
    measure(client, "bare:old", "bare:new", "bare")
    exported = client.get("/compare/bare:old/bare:new/disagreements",
                          params={"evalset": "bare", "format": "label-studio"}).content
    tasks = json.loads(exported)
    assert {p["result"][0]["value"]["choices"][0] for task in tasks
            for p in task["predictions"]} <= {str(column) for column in range(10)}

    def post(content: bytes):
        return client.post("/evalsets/bare/labels", files={"labels": ("export.json", content)})

    as_exported = post(exported)
    assert as_exported.status_code == 200, as_exported.text
    assert as_exported.json()["added"] == 0
    export = [annotated(task, number, str(digits.truth[task["data"]["index"]]))
              for number, task in enumerate(tasks[:4], start=1)]
    (tmp_path / "export.json").write_text(json.dumps(export))
    imported = post(json.dumps(export).encode())
    assert imported.status_code == 201, imported.text
    assert imported.json()["added"] == 4
    read = run_cli("compare", digits.old, digits.new, "--evalset", tmp_path / "bare.npz",
                   "--labels", tmp_path / "export.json", "--json")
    assert read.code == 0, read.err
    assert json.loads(read.out)["disagreements"]["labelled_prefix"] == 4


def test_two_limits_waiting_on_one_set_count_its_unlabelled_disagreements_once(client,
                                                                               traffic_line):
    """max_nfr straddled by the interval and max_er_increase not known yet: two pending
    reasons on one traffic set, whose disagreements are to be labelled once."""
    promote_old(client)
    measure(client, OLD, NEW, TRAFFIC)
    order = np.array([row["index"] for row in client.get(
        f"/compare/{OLD}/{NEW}/disagreements", params={"evalset": TRAFFIC}).json()])
    low, high = half_interval(traffic_line, order, order[: order.size // 2])
    assert client.put("/models/digits/policy", json={
        "max_nfr": round((low + high) / 2, 6), "max_er_increase": 0.5,
        "evalsets": [TRAFFIC]}).is_success
    asked = client.post("/gate", json={"model": "digits", "candidate": "new"}).json()
    assert [reason["code"] for reason in asked["reasons"]].count("labels_needed") == 2
    assert asked["labels_needed"] == order.size
    printed = "\n".join(describe(asked))
    assert printed.count(f"disagreements of {TRAFFIC}") == 1, printed
