"""Traffic sets of multi-label lines on the server (docs/traffic.md, "Multi-label lines"):
digit composites without their label sets registered with `multilabel`, two external
versions' probabilities uploaded on it; churn per label and per sample against numpy on
those probabilities, the export of every sample where a label differs, Label Studio's
annotated multiple-choice export imported as the same label matrix, NFR_sample exact from
it, and the gate pending on NFR_sample until the labels decide."""

import json

import numpy as np
import pytest
from sqlalchemy import select

from flipgate.datasets import DIGIT_NAMES
from flipgate.metrics.multilabel_traffic import multilabel_traffic_report
from flipgate.reporting.rows import fmt_ci, fmt_pct
from service.datasets.labels import read_revision_labels
from service.datasets.models import DatasetLabels
from tests.multilabel_reference import (
    assert_group_churn_matches,
    assert_groups_match,
    group_churn_reference,
    group_reference,
)
from tests.multilabel_traffic_data import LabelTraffic, annotated_sets, label_traffic_files
from tests.service.api.conftest import (
    error_code,
    import_labels,
    measure,
    npy_bytes,
    npz_bytes,
    put_raw,
    run_task,
)
from tests.service.api.test_multilabel_api import own_probabilities

LINE, TRAFFIC = "tags", "traffic"
OLD, NEW = f"{LINE}:1", f"{LINE}:2"


@pytest.fixture(scope="module")
def traffic(tmp_path_factory) -> LabelTraffic:
    return label_traffic_files(tmp_path_factory.mktemp("multilabel-traffic-api"))


@pytest.fixture
def label_line(client, traffic) -> LabelTraffic:
    """The traffic set registered as multi-label traffic, and line `tags` with external
    versions 1 and 2 whose probabilities on it are uploaded."""
    registered = client.post("/evalsets", data={"name": TRAFFIC, "multilabel": "true"},
                             files={"data": ("traffic.npz", traffic.traffic.read_bytes())})
    assert registered.status_code == 201, registered.text
    assert (registered.json()["multilabel"], registered.json()["labeled"]) == (True, False)
    for version, path in (("1", traffic.old), ("2", traffic.new)):
        assert client.post("/models", data={"name": LINE, "version": version,
                                            "multilabel": "true", "num_classes": "10"}
                           ).status_code == 201
        uploaded = client.post(f"/models/{LINE}/versions/{version}/predictions",
                               data={"evalset": TRAFFIC, "scores": "probabilities"},
                               files={"logits": ("p.npy", npy_bytes(np.load(path)))})
        assert uploaded.status_code == 201, uploaded.text
    return traffic




def export(client, export_format: str = "json") -> list[dict]:
    return client.get(f"/compare/{OLD}/{NEW}/disagreements",
                      params={"evalset": TRAFFIC, "format": export_format}).json()


def per_sample_flips(traffic: LabelTraffic) -> tuple[float, float]:
    """NFR_sample and PFR_sample, plainly: the shares of samples with a label turned wrong,
    turned right."""
    (old, new), truth = traffic.decisions, traffic.truth
    right_old, right_new = old == truth, new == truth
    return (float((right_old & ~right_new).any(axis=1).mean()),
            float((~right_old & right_new).any(axis=1).mean()))


def test_churn_per_label_and_the_export_are_numpys(client, label_line, run_cli, tmp_path):
    traffic = label_line
    old, new = traffic.decisions
    report = measure(client, OLD, NEW, TRAFFIC)
    assert report["traffic"] and report["multilabel"] and report["nfr"] is None
    assert [row["changed"] for row in report["per_label"]] == (old != new).sum(0).tolist()
    assert [row["churn"] for row in report["per_label"]] == pytest.approx((old != new).mean(0))
    assert report["churn"] == traffic.changed.size / old.shape[0]
    assert report["old"]["thresholds"] == [0.5] * 10
    rows = export(client)
    assert sorted(row["index"] for row in rows) == traffic.changed.tolist()
    assert all(row["changed_labels"] == traffic.names(old[row["index"]] != new[row["index"]])
               for row in rows)
    assert run_cli("compare", traffic.old, traffic.new, "--evalset", traffic.traffic,
                   "--multilabel", "--scores", "probabilities", "--disagreements",
                   tmp_path / "cli.json").code == 0
    assert json.loads((tmp_path / "cli.json").read_text()) == rows  # the same order and rows
    queued = client.post(f"/models/{LINE}/matrix", params={"evalset": TRAFFIC}).json()
    for job_id in {pair["job_id"] for pair in queued["missing"]}:
        run_task(client, job_id)
    matrix = client.get(f"/models/{LINE}/matrix", params={"evalset": TRAFFIC}).json()
    assert matrix["churn"][0][1] == report["churn"] and matrix["nfr"][0][1] is None


def test_onnx_versions_are_scored_on_multilabel_traffic(client, label_line):
    """skl2onnx exports of the same two models, registered as a line of their own: their
    inference jobs score the traffic set, and churn per label is numpy's on the
    probabilities ONNX Runtime gives."""
    traffic = label_line
    for version in ("old", "new"):
        registered = client.post("/models", data={"name": "ovr", "version": version,
                                                  "multilabel": "true"}, files={
            "artifact": ("m.onnx", traffic.old.with_name(f"{version}.onnx").read_bytes())})
        assert registered.status_code == 201, registered.text
    old, new = (own_probabilities(traffic.old.with_name(f"{version}.onnx"),
                                  np.load(traffic.traffic)["x"]) > 0.5
                for version in ("old", "new"))
    report = measure(client, "ovr:old", "ovr:new", TRAFFIC)
    assert report["traffic"] and [row["changed"] for row in report["per_label"]] == (
        old != new).sum(0).tolist()
    assert report["changed"] == int((old != new).any(axis=1).sum()) > 0


def test_a_label_studio_export_imports_as_the_same_label_matrix(client, label_line, db):
    traffic = label_line
    measure(client, OLD, NEW, TRAFFIC)
    tasks = export(client, "label-studio")
    assert [p["model_version"] for p in tasks[0]["predictions"]] == [OLD, NEW]
    annotated = json.dumps(annotated_sets(tasks, traffic.truth)).encode()
    answer = import_labels(client, TRAFFIC, annotated, "export.json")
    assert answer.status_code == 201 and answer.json()["added"] == len(tasks)
    with db() as session:
        revision = session.scalars(select(DatasetLabels)).one()
        stored = read_revision_labels(store=client.app.state.store, labels=revision,
                                      n=traffic.truth.shape[0], num_labels=10)
    known = stored[:, 0] != -1
    assert np.flatnonzero(known).tolist() == traffic.changed.tolist()
    assert np.array_equal(stored[known], traffic.truth[known])
    exact = client.get(f"/compare/{OLD}/{NEW}", params={"evalset": TRAFFIC}).json()
    assert exact["label_revision"] == 1 and exact["disagreements"]["complete"]
    assert (exact["nfr"], exact["pfr"]) == pytest.approx(per_sample_flips(traffic))


def test_a_gate_on_multilabel_traffic_waits_for_labels_then_settles(client, label_line):
    """max_nfr (NFR_sample) inside the interval half of the export gives: pending with no
    labels and with half of them; final, as numpy's NFR_sample says, once all arrive."""
    traffic = label_line
    assert client.post("/gate", json={"model": LINE, "candidate": "1"}).json()[
        "verdict"] == "approve"
    assert client.post(f"/models/{LINE}/aliases/production", json={"version": "1"}).is_success
    measure(client, OLD, NEW, TRAFFIC)
    order = np.array([row["index"] for row in export(client)])
    half, rest = order[: order.size // 2], order[order.size // 2:]
    labels = np.full(traffic.truth.shape, -1)
    labels[half] = traffic.truth[half]
    low, high = multilabel_traffic_report(
        traffic.old_probabilities, traffic.new_probabilities, order=order,
        labels=labels)["disagreements"]["nfr_interval"]
    limit = round((low + high) / 2, 6)
    assert client.put(f"/models/{LINE}/policy", json={
        "max_nfr": limit, "max_label_nfr": 0.1, "evalsets": [TRAFFIC]}).is_success
    asked = client.post("/gate", json={"model": LINE, "candidate": "2"})
    assert asked.status_code == 202 and asked.json()["labels_needed"] == order.size
    reasons = {reason["code"]: reason for reason in asked.json()["reasons"]}
    assert "max_label_nfr" in reasons["not_applicable_on_traffic"]["message"]
    decision = asked.json()["decision_id"]
    import_labels(client, TRAFFIC, npz_bytes(index=half, y=traffic.truth[half]), "half.npz")
    waiting = client.get(f"/gate/decisions/{decision}").json()
    assert waiting["verdict"] == "pending" and waiting["labels_needed"] == rest.size
    import_labels(client, TRAFFIC, npz_bytes(index=rest, y=traffic.truth[rest]), "rest.npz")
    final = client.get(f"/gate/decisions/{decision}").json()
    nfr_sample = per_sample_flips(traffic)[0]
    assert final["verdict"] == ("block" if nfr_sample > limit else "approve")




def test_churn_per_group_is_numpys_in_the_report_and_on_the_pair_page(client, label_line,
                                                                      mint):
    """Per camera of the set's groups: churn per sample and pooled and the labels that
    changed most, numpy's on the uploaded probabilities, in the report and the dashboard's
    pair page; once every sample is labelled, the multi-label per-group table too."""
    traffic = label_line
    expected = group_churn_reference(*traffic.decisions, traffic.groups, DIGIT_NAMES)
    report = measure(client, OLD, NEW, TRAFFIC)
    assert_group_churn_matches(report, expected)
    assert "per_group" not in report  # labels of every sample needed
    assert client.post("/ui/signin", data={"token": mint("read")},
                       follow_redirects=False).status_code == 303
    page = client.get(f"/ui/lines/{LINE}/pairs/1/2", params={"evalset": TRAFFIC})
    assert page.status_code == 200
    for row in expected:
        changed = ", ".join(f"{label['name']} ({label['changed']})"
                            for label in row["most_changed_labels"])
        assert (f"<tr><td>{row['group']}</td><td>{row['n']}</td><td>{row['changed']}</td>"
                f"<td>{fmt_pct(row['churn'])}</td><td>{fmt_ci(row['churn_ci'])}</td>"
                f"<td>{fmt_pct(row['pooled_churn'])}</td><td>{changed}</td></tr>") in page.text
    everything = np.arange(traffic.truth.shape[0])
    import_labels(client, TRAFFIC, npz_bytes(index=everything, y=traffic.truth), "all.npz")
    labelled = client.get(f"/compare/{OLD}/{NEW}", params={"evalset": TRAFFIC}).json()
    assert_group_churn_matches(labelled, expected)
    assert_groups_match(labelled, group_reference(traffic.truth, *traffic.decisions,
                                                  traffic.groups))


def test_what_does_not_fit_the_line_is_refused(client, label_line, upload_model):
    traffic = label_line
    measure(client, OLD, NEW, TRAFFIC)
    tasks = annotated_sets(export(client, "label-studio")[:2], traffic.truth)
    tasks[1]["annotations"][0]["result"] = [{"from_name": "label", "to_name": "sample",
                                             "type": "choices",
                                             "value": {"choices": ["3", "eleven"]}}]
    refused = import_labels(client, TRAFFIC, json.dumps(tasks).encode())
    assert error_code(refused, 422) == "unknown_class_name"
    assert "'eleven'" in refused.json()["error"]["message"]
    nine = npz_bytes(index=traffic.changed[:1], y=np.ones((1, 9), int))
    assert error_code(import_labels(client, TRAFFIC, nine), 422) == "label_count_mismatch"
    first = import_labels(client, TRAFFIC, json.dumps(tasks[:1]).encode())
    assert first.status_code == 201 and first.json()["revision"] == 1  # nothing stored before
    for version in ("1", "2"):
        assert upload_model("single", version, num_classes=10).status_code == 201
    assert error_code(client.post("/compare/single:1/single:2", params={
        "evalset": TRAFFIC}), 422) == "evalset_kind_mismatch"
    with np.load(traffic.traffic) as arrays:
        unnamed = npz_bytes(x=arrays["x"])  # no classes: its labels' count comes from a line
    raw = put_raw(client, "/evalsets/raw", unnamed, {"multilabel": "true"})
    assert raw.status_code == 201 and raw.json()["multilabel"] and not raw.json()["labeled"]
    assert raw.json()["num_classes"] is None
    early = client.post("/evalsets/raw/labels", files={"labels": ("l.npz", npz_bytes(
        index=np.array([0]), y=np.ones((1, 10), int)))})
    assert error_code(early, 422) == "labels_need_line"
    assert error_code(client.post("/evalsets", data={"name": "flat", "multilabel": "true"},
                                  files={"data": ("f.npz", npz_bytes(
                                      x=np.zeros((4, 3), np.float32), y=np.arange(4) % 2))}),
                      422) == "evalset_kind_mismatch"
