"""The policy limits of issue 15 over HTTP, against hand-counted flips: slices, costs and the
cost-ratio significance test, NFR_mc, history-aware gating, unstable samples and the dry-run.

The line `digits` has versions with uploaded logits on `ev` (100 samples, 3 classes, label
i % 3; groups "a" for samples 0..49, "b" for 50..89, "c" for 90..99):
- version 0 is wrong on 20..29,
- version 1 is wrong on 0..9 (predicting label + 1),
- version 2 is wrong on 5..19: 10..19 predicting label + 1, 5..9 predicting label + 2.
So 1 → 2 has 10 negative flips (10..19), 5 positive flips (0..4), and 5 samples both models
get wrong with a changed prediction (5..9): NFR 0.10, NFR_mc (10 + 5) / 100 = 0.15. Every
flip lies in group "a" (n 50): its NFR is 10 / 50 = 0.2 and its ER rises from 0.2 to 0.3.
"""

import json
from math import comb

import numpy as np
import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from service.gate import history
from service.predictions.service import read_predicted_classes
from tests.reasons import rate_figures
from tests.service.api.conftest import (
    error_code,
    measure,
    post_evalset,
    post_logits,
    post_model,
    run_task,
    shared_store,
)
from tests.service.conftest import write_onnx

N, CLASSES = 100, 3
LABELS = np.arange(N) % CLASSES
GROUPS = np.array(["a"] * 50 + ["b"] * 40 + ["c"] * 10)
WRONG = {"0": {1: range(20, 30)}, "1": {1: range(0, 10)},
         "2": {1: range(10, 20), 2: range(5, 10)}}


def one_hot_logits(wrong: dict[int, range]) -> np.ndarray:
    """Logits that predict the label, except label + shift on the samples of each range."""
    predictions = LABELS.copy()
    for shift, samples in wrong.items():
        predictions[list(samples)] = (LABELS[list(samples)] + shift) % CLASSES
    return np.eye(CLASSES)[predictions] * 3.0


def seed_line(client, folder) -> None:
    """Versions 0, 1 and 2 of `digits` with logits on `ev`; production went 0 → 1."""
    path = folder / "ev.npz"
    x = np.random.default_rng(0).normal(size=(N, 4)).astype(np.float32)
    np.savez(path, x=x, y=LABELS, groups=GROUPS)
    assert post_evalset(client, "ev", path).status_code == 201
    model = write_onnx(folder).read_bytes()
    for version, wrong in WRONG.items():
        post_model(client, "digits", version, model, metadata=json.dumps({"arch": "mlp"}))
        assert post_logits(client, f"digits:{version}", "ev",
                           one_hot_logits(wrong)).status_code == 201
    for version in ("0", "1"):
        moved = client.post("/models/digits/aliases/production",
                            json={"version": version, "force": True})
        assert moved.is_success, moved.text


client, settings = shared_store(line=seed_line)  # every test here uses `line`


@pytest.fixture
def line(client):
    """The client, on the store that seed_line seeded."""
    return client


def gate_2(client, **policy) -> dict:
    """Set `policy` on `ev`, store 1 → 2's metrics and gate version 2 against production."""
    assert client.put("/models/digits/policy", json={**policy, "evalsets": ["ev"]}).is_success
    assert measure(client, "digits:1", "digits:2", "ev")["n"] == N
    response = client.post("/gate", json={"model": "digits", "candidate": "2"})
    assert response.status_code == 200, response.text
    return response.json()


def codes(decision: dict) -> list[tuple]:
    return [(reason["code"], reason.get("group"), reason["measured"], reason["blocking"])
            for reason in decision["reasons"]]


def test_a_group_that_regresses_blocks_and_is_named(line):
    decision = gate_2(line, max_group_nfr=0.15, max_group_er_increase=0.05)
    assert decision["verdict"] == "block"
    assert codes(decision) == [("max_group_nfr", "a", pytest.approx(0.2), True),
                               ("max_group_er_increase", "a", pytest.approx(0.1), True)]
    message = decision["reasons"][0]["message"]
    assert message.startswith("on ev, group 'a' (n = 50): NFR ")
    assert rate_figures(message) == (pytest.approx(0.2, abs=5e-5), None,
                                     pytest.approx(0.15, abs=1e-12))
    groups = {row["group"]: row for row in decision["metrics"]["ev"]["groups"]}
    assert groups["a"]["negative_flips"] == 10 and groups["a"]["positive_flips"] == 5
    assert groups["b"]["nfr"] == 0 and groups["c"]["n"] == 10
    assert decision["metrics"]["ev"]["nfr"] == pytest.approx(0.1)  # overall within 0.15


def test_groups_below_the_minimum_size_are_reported_not_gated(line):
    decision = gate_2(line, max_group_nfr=0.15, min_group_size=51)
    assert decision["verdict"] == "approve" and decision["reasons"] == []
    assert [(row["group"], row["gated"]) for row in decision["metrics"]["ev"]["groups"]] == [
        ("a", False), ("b", False), ("c", False)]


def test_the_expected_cost_weighs_negative_flips(line):
    decision = gate_2(line, negative_flip_cost=10, positive_flip_gain=1, max_expected_cost=0.9)
    assert decision["verdict"] == "block"
    assert codes(decision) == [("max_expected_cost", None, pytest.approx(0.95), True)]
    numbers = decision["metrics"]["ev"]
    assert numbers["expected_cost"] == pytest.approx((10 * 10 - 1 * 5) / N)
    low, high = numbers["expected_cost_ci"]
    assert low < 0.95 < high
    cheap = line.put("/models/digits/policy", json={
        "negative_flip_cost": 1, "positive_flip_gain": 3, "max_expected_cost": 0,
        "evalsets": ["ev"]})
    assert cheap.is_success
    decision = line.post("/gate", json={"model": "digits", "candidate": "2"}).json()
    assert decision["verdict"] == "approve"
    assert decision["metrics"]["ev"]["expected_cost"] == pytest.approx((10 - 15) / N)


def test_the_cost_ratio_significance_test_blocks_what_mcnemar_lets_pass(line):
    assert gate_2(line, significance=0.05)["verdict"] == "approve"  # p = 4944/32768
    assert line.put("/models/digits/policy", json={
        "significance": 0.05, "significance_test": "cost", "negative_flip_cost": 10,
        "evalsets": ["ev"]}).is_success
    decision = line.post("/gate", json={"model": "digits", "candidate": "2"}).json()
    # H0: a discordant sample is a negative flip with probability 1 / (10 + 1).
    p_value = sum(comb(15, k) * (1 / 11) ** k * (10 / 11) ** (15 - k) for k in range(10, 16))
    assert decision["verdict"] == "block"
    assert codes(decision) == [("significance", None, pytest.approx(p_value), True)]
    assert "raises the expected cost" in decision["reasons"][0]["message"]


def test_nfr_mc_counts_errors_that_changed(line):
    decision = gate_2(line, max_nfr_mc=0.12)
    assert codes(decision) == [("max_nfr_mc", None, pytest.approx(0.15), True)]
    report = measure(line, "digits:1", "digits:2", "ev")
    assert report["both_wrong"] == 5 and report["both_wrong_changed"] == 5
    assert report["nfr_mc"] == pytest.approx(
        (report["negative_flips"] + report["both_wrong_changed"]) / N)
    assert line.put("/models/digits/policy", json={"max_nfr_mc": 0.15}).is_success
    again = line.post("/gate", json={"model": "digits", "candidate": "2"}).json()
    assert again["verdict"] == "approve"


def test_history_limit_counts_what_any_recent_production_version_got_right(line):
    # Versions 0 and 1 are wrong on disjoint samples: together they got all 100 right, and
    # version 2 breaks 15 of them (5..19); against version 1 alone, 10 (10..19).
    decision = gate_2(line, max_nfr_vs_history={"versions": 2, "max": 0.12})
    assert decision["verdict"] == "block"
    assert codes(decision) == [("max_nfr_vs_history", None, pytest.approx(0.15), True)]
    assert decision["reasons"][0]["versions"] == ["1", "0"]
    assert "production versions 1, 0" in decision["reasons"][0]["message"]
    assert decision["metrics"]["ev"]["history_broken"] == 15
    assert line.put("/models/digits/policy", json={
        "max_nfr_vs_history": {"versions": 1, "max": 0.12}, "evalsets": ["ev"]}).is_success
    decision = line.post("/gate", json={"model": "digits", "candidate": "2"}).json()
    assert decision["verdict"] == "approve"
    assert decision["metrics"]["ev"]["history_nfr"] == pytest.approx(0.1)


def test_a_history_limit_reads_its_arrays_before_the_gate_transaction_begins(line, monkeypatch):
    """POST /gate reads the history's predicted classes while no session of the app is in a
    transaction (its own begins after them, with SQLite's write lock), and decides the same."""
    assert line.put("/models/digits/policy", json={
        "max_nfr_vs_history": {"versions": 2, "max": 0.12}, "evalsets": ["ev"]}).is_success
    assert measure(line, "digits:1", "digits:2", "ev")["n"] == N
    in_transaction, open_while_reading = set(), []

    def begun(session, _transaction, _connection):
        in_transaction.add(session)

    def ended(session, transaction):
        if transaction.parent is None:
            in_transaction.discard(session)

    def read(**arguments):
        open_while_reading.append(len(in_transaction))
        return read_predicted_classes(**arguments)

    monkeypatch.setattr(history, "read_predicted_classes", read)
    event.listen(Session, "after_begin", begun)
    event.listen(Session, "after_transaction_end", ended)
    try:
        decision = line.post("/gate", json={"model": "digits", "candidate": "2"}).json()
    finally:
        event.remove(Session, "after_begin", begun)
        event.remove(Session, "after_transaction_end", ended)
    assert codes(decision) == [("max_nfr_vs_history", None, pytest.approx(0.15), True)]
    assert open_while_reading == [0, 0, 0]  # versions 1 and 0, and the candidate


def test_a_pending_decision_settles_with_the_history_limit(line):
    # The worker settles with its context's settings: here, the test server's.
    assert line.put("/models/digits/policy", json={
        "max_nfr_vs_history": {"versions": 2, "max": 0.12}, "evalsets": ["ev"]}).is_success
    pending = line.post("/gate", json={"model": "digits", "candidate": "2"})
    assert pending.status_code == 202 and pending.json()["verdict"] == "pending"
    for job_id in pending.json()["waiting_for"]:
        run_task(line, job_id)
    decision = line.get(f"/gate/decisions/{pending.json()['decision_id']}").json()
    assert codes(decision) == [("max_nfr_vs_history", None, pytest.approx(0.15), True)]


def test_unstable_samples_follow_the_production_history(line):
    assert line.post("/models/digits/aliases/production",
                     json={"version": "2", "force": True}).is_success
    answer = line.get("/models/digits/unstable-samples", params={"evalset": "ev", "limit": 7})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["versions"] == ["0", "1", "2"]
    # 0..4: right, wrong, right (2 changes); 5..29 changed once; the rest never.
    assert [(row["index"], row["changes"]) for row in body["samples"]] == [
        (0, 2), (1, 2), (2, 2), (3, 2), (4, 2), (5, 1), (6, 1)]
    assert body["samples"][0]["correct"] == [True, False, True]
    everything = line.get("/models/digits/unstable-samples", params={"evalset": "ev"}).json()
    assert len(everything["samples"]) == 30
    missing = line.get("/models/digits/unstable-samples", params={"evalset": "nope"})
    assert error_code(missing, 404) == "dataset_not_found"


def test_a_dry_run_lists_the_verdicts_a_draft_would_change_and_stores_nothing(line):
    approved = gate_2(line, max_nfr=0.2)
    assert approved["verdict"] == "approve"
    before = line.get("/models/digits/decisions").json()
    draft = line.post("/models/digits/policy/dry-run", json={"max_nfr": 0.05})
    assert draft.status_code == 200, draft.text
    body = draft.json()
    assert body["replayed"] == 1
    assert [(change["decision_id"], change["old_verdict"], change["new_verdict"],
             change["candidate"], change["baseline"]) for change in body["changed"]] == [
        (approved["decision_id"], "approve", "block", "2", "1")]
    assert [reason["measured"] for reason in body["changed"][0]["reasons"]] == [
        pytest.approx(0.1)]
    lenient = line.post("/models/digits/policy/dry-run", json={"max_nfr": 0.1}).json()
    assert lenient["changed"] == []
    assert line.get("/models/digits/decisions").json() == before
    assert line.get("/models/digits/policy").json()["version"] == 1


@pytest.mark.parametrize("bad", [
    {"max_group_nfr": 2}, {"min_group_size": 0}, {"min_group_size": 1.5},
    {"negative_flip_cost": 0}, {"positive_flip_gain": -1}, {"max_expected_cost": "0.1"},
    {"significance_test": "bayes"}, {"max_nfr_mc": True},
    {"max_nfr_vs_history": {"versions": 0, "max": 0.1}},
    {"max_nfr_vs_history": {"versions": 2, "max": 0.1, "extra": 1}},
    {"max_nfr_vs_history": {"versions": 2}},
])
def test_new_limits_are_validated_and_nothing_is_stored(line, bad):
    assert error_code(line.put("/models/digits/policy", json=bad), 422) == "invalid_request"
    assert error_code(line.post("/models/digits/policy/dry-run", json=bad),
                      422) == "invalid_request"
    assert line.get("/models/digits/policy").json()["version"] is None


def test_new_limits_are_versioned_with_the_policy(line):
    line.put("/models/digits/policy", json={"max_nfr_vs_history": {"versions": 3, "max": 0.1},
                                            "negative_flip_cost": 10})
    line.put("/models/digits/policy", json={"max_group_nfr": 0.2, "min_group_size": 30})
    first = line.get("/models/digits/policy", params={"version": 1}).json()["rules"]
    assert first["max_nfr_vs_history"] == {"versions": 3, "max": 0.1}
    assert first["negative_flip_cost"] == 10 and first["max_group_nfr"] is None
    assert line.get("/models/digits/policy").json()["rules"]["min_group_size"] == 30
