"""The gate over HTTP: policies, verdicts and reasons checked against hand-counted flips,
webhook signatures and replays, the audit log, promotion and repair requests.

The line `digits` has two versions with uploaded logits on `ev` (100 samples, 3 classes):
version 1 is wrong on samples 0..9 and version 2 on samples 5..19, so 1 → 2 has 10 negative
flips (samples 10..19) and 5 positive flips (0..4): NFR 0.10, PFR 0.05, ER 0.10 → 0.15,
churn 0.15 and a one-sided McNemar p of P(X ≥ 10 | 15, ½) = 4944/32768.
"""

import json
from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import event, func, select

from flipgate.signing import signature
from service.callbacks.scheduling import due_callbacks, queued_callback, record_attempt
from service.config import Settings
from service.db import utcnow
from service.gate.models import Decision
from service.gate.settling import settle_pending
from service.gate.statuses import callback_body
from service.jobs.models import Job, JobState
from service.jobs.service import get_job, mark_finished, start_job
from tests.reasons import rate_figures
from tests.service.api.conftest import (
    bearer,
    error_code,
    measure,
    post_evalset,
    post_logits,
    post_model,
    shared_store,
)
from tests.service.conftest import FEATURES, write_npz, write_onnx

N, CLASSES = 100, 3
P_VALUE = 4944 / 32768


def logits_wrong_on(wrong: range) -> np.ndarray:
    """One-hot logits that are right except on the samples in `wrong`."""
    labels = np.arange(N) % CLASSES
    predictions = labels.copy()
    predictions[list(wrong)] = (labels[list(wrong)] + 1) % CLASSES
    return np.eye(CLASSES)[predictions] * 3.0


def seed_line(client, folder) -> None:
    """Versions 1 and 2 of `digits` with logits on `ev`; version 1 is production."""
    post_evalset(client, "ev", write_npz(folder, n=N, num_classes=CLASSES))
    model = write_onnx(folder).read_bytes()
    for version, wrong in (("1", range(0, 10)), ("2", range(5, 20))):
        post_model(client, "digits", version, model, metadata=json.dumps({"arch": "mlp"}))
        assert post_logits(client, f"digits:{version}", "ev",
                           logits_wrong_on(wrong)).status_code == 201
    assert gate(client, candidate="1").json()["verdict"] == "approve"
    assert client.post("/models/digits/aliases/production", json={"version": "1"}).is_success



@pytest.fixture
def line(client):
    """The client, on the store that seed_line seeded."""
    return client


def gate(client, headers=None, **body):
    return client.post("/gate", json={"model": "digits", **body}, headers=headers)


def measured(client) -> dict:
    """Store the pair's metrics (POST /compare, its metrics job run here) and gate 2."""
    assert measure(client, "digits:1", "digits:2", "ev")["n"] == N
    return gate(client, candidate="2")


def test_the_first_version_is_approved_and_promotable(client, upload_model):
    upload_model("digits", "1")
    decision = gate(client, candidate="1").json()
    assert decision["verdict"] == "approve" and decision["baseline"] is None
    assert [reason["code"] for reason in decision["reasons"]] == ["first_version"]
    assert client.post("/models/digits/aliases/production", json={"version": "1"}).is_success


def test_a_candidate_over_the_limits_is_blocked_with_the_measured_numbers(line):
    policy = line.put("/models/digits/policy", json={"max_nfr": 0.05, "max_churn": 0.2,
                                                     "evalsets": ["ev"]})
    assert policy.status_code == 200 and policy.json()["version"] == 1
    response = measured(line)
    assert response.status_code == 200
    decision = response.json()
    assert decision["verdict"] == "block" and decision["policy_version"] == 1
    assert decision["baseline"] == "1" and decision["evalsets"] == ["ev"]
    [reason] = decision["reasons"]
    assert {**reason, "message": None} == {
        "code": "max_nfr", "evalset": "ev", "measured": 0.1, "limit": 0.05, "blocking": True,
        "message": None}
    numbers = decision["metrics"]["ev"]
    assert reason["message"].startswith("on ev: NFR ")  # the fields in percentages
    nfr, interval, limit = rate_figures(reason["message"])
    assert (nfr, limit) == (pytest.approx(0.1, abs=5e-5), pytest.approx(0.05, abs=1e-12))
    assert interval == pytest.approx(numbers["nfr_interval"], abs=5e-5)
    assert interval[0] < 0.1 < interval[1]
    assert numbers["negative_flips"] == 10 and numbers["positive_flips"] == 5
    assert numbers["er_increase"] == pytest.approx(0.05)
    assert numbers["churn"] == pytest.approx(0.15)
    assert numbers["mcnemar_p"] == pytest.approx(P_VALUE)
    assert numbers["worst_class"] == 1  # 4 of samples 10..19 are among its 33
    assert numbers["worst_class_nfr"] == pytest.approx(4 / 33)
    assert numbers["report_url"].endswith("/compare/digits:1/digits:2?evalset=ev&format=html")
    assert decision["report_url"].endswith(
        f"/ui/decisions/{decision['decision_id']}?project=default")


def test_significance_waives_flip_limits_the_test_does_not_support(line):
    line.put("/models/digits/policy", json={"max_nfr": 0.05, "significance": 0.05})
    decision = measured(line).json()
    assert decision["verdict"] == "approve"
    assert [(reason["code"], reason["blocking"]) for reason in decision["reasons"]] == [
        ("max_nfr", False)]
    line.put("/models/digits/policy", json={"max_nfr": 0.05, "significance": 0.2})
    assert gate(line, candidate="2").json()["verdict"] == "block"


def test_significance_alone_blocks_a_significantly_worse_candidate(line):
    line.put("/models/digits/policy", json={"significance": 0.2})
    reasons = measured(line).json()["reasons"]
    assert [(reason["code"], reason["measured"]) for reason in reasons] == [
        ("significance", pytest.approx(P_VALUE))]


def test_policies_are_versioned_and_validated(line):
    assert line.get("/models/digits/policy").json()["version"] is None
    line.put("/models/digits/policy", json={"max_nfr": 0.05})
    line.put("/models/digits/policy", json={"max_churn": 0.1})
    assert line.get("/models/digits/policy").json()["rules"]["max_churn"] == 0.1
    first = line.get("/models/digits/policy", params={"version": 1}).json()
    assert first["rules"]["max_nfr"] == 0.05 and first["rules"]["max_churn"] is None
    for bad in ({"max_nfr": 2}, {"max_flips": 1}, {"significance": 0}):
        assert error_code(line.put("/models/digits/policy", json=bad), 422) == "invalid_request"
    unknown = line.put("/models/digits/policy", json={"evalsets": ["nope"]})
    assert error_code(unknown, 404) == "dataset_not_found"
    assert line.get("/models/digits/policy").json()["version"] == 2


def test_policy_changes_need_the_admin_scope(line, mint):
    response = line.put("/models/digits/policy", json={"max_nfr": 0.5},
                        headers=bearer(mint("write", "gate")))
    assert error_code(response, 403) == "missing_scope"


def test_unmeasured_pairs_are_pending_and_a_failed_job_blocks(line, db, settings):
    response = gate(line, candidate="2")
    assert response.status_code == 202
    decision = response.json()
    assert decision["verdict"] == "pending" and len(decision["waiting_for"]) == 1
    with db() as session:
        job = start_job(session=session, job=get_job(session=session,
                                                     job_id=decision["waiting_for"][0]))
        mark_finished(session=session, job=job, state=JobState.FAILED, error="out of memory")
        # what the worker runs at a job's end
        settle_pending(session=session, settings=settings, job_ids=[job.id])
    final = line.get(f"/gate/decisions/{decision['decision_id']}").json()
    assert final["verdict"] == "block" and final["waiting_for"] == []
    assert final["reasons"][0]["code"] == "measurement_failed"
    assert "out of memory" in final["reasons"][0]["message"]


def test_a_gate_token_asks_and_polls_but_cannot_read_the_line(line, mint):
    token = mint("gate")
    decision = measured(line).json()
    assert gate(line, headers=bearer(token), candidate="2").json()["requested_by"] == "gate"
    assert line.get(f"/gate/decisions/{decision['decision_id']}",
                    headers=bearer(token)).is_success
    assert error_code(line.get("/models/digits", headers=bearer(token)), 403) == "missing_scope"
    reader = mint("read")
    assert error_code(gate(line, headers=bearer(reader), candidate="2"), 403) == "missing_scope"


def signed_post(client, secret: str | None, body: bytes, **headers: str):
    """POST /gate without a token; signed with `secret` unless it is None."""
    headers = {"Authorization": "", "Content-Type": "application/json", **headers}
    if secret is not None:
        headers["X-Flipgate-Signature-256"] = signature(secret, body)
    return client.post("/gate", content=body, headers=headers)


def test_webhook_signatures_are_checked_against_the_line_secret(line):
    body = json.dumps({"model": "digits", "candidate": "1",
                       "ci": {"provider": "github", "sha": "abc123"}}).encode()
    assert error_code(signed_post(line, "whatever", body), 401) == "invalid_signature"
    secret = line.post("/models/digits/webhook-secret").json()["secret"]
    accepted = signed_post(line, secret, body)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["requested_by"] == "webhook"
    assert accepted.json()["ci"] == {"provider": "github", "sha": "abc123"}
    assert error_code(signed_post(line, "wrong-secret", body), 401) == "invalid_signature"
    tampered = {"X-Flipgate-Signature-256": signature(secret, body)}
    response = signed_post(line, None, body.replace(b'"1"', b'"2"'), **tampered)
    assert error_code(response, 401) == "invalid_signature"
    assert error_code(signed_post(line, None, body), 401) == "missing_credentials"
    line.app.state.settings.secret_grace_seconds = 0  # the old secret stops at once
    rotated = line.post("/models/digits/webhook-secret").json()["secret"]
    assert error_code(signed_post(line, secret, body), 401) == "invalid_signature"
    assert signed_post(line, rotated, body).is_success


def test_a_replayed_delivery_gets_the_first_decision(line):
    secret = line.post("/models/digits/webhook-secret").json()["secret"]
    body = json.dumps({"model": "digits", "candidate": "2", "evalsets": ["ev"]}).encode()
    first = signed_post(line, secret, body, **{"X-Flipgate-Delivery": "run-7"})
    again = signed_post(line, secret, body, **{"X-Flipgate-Delivery": "run-7"})
    assert again.json()["decision_id"] == first.json()["decision_id"]
    assert len(line.get("/models/digits/decisions").json()) == 2  # v1, and this delivery
    other = json.dumps({"model": "digits", "candidate": "1"}).encode()
    response = signed_post(line, secret, other, **{"X-Flipgate-Delivery": "run-7"})
    assert error_code(response, 409) == "delivery_reused"


def test_decisions_form_an_audit_log_newest_first(line):
    measured(line)
    log = line.get("/models/digits/decisions").json()
    assert [(entry["candidate"], entry["verdict"]) for entry in log] == [
        ("2", "approve"), ("1", "approve")]  # the default policy: significance 0.05
    assert all(entry["requested_by"] == "admin" and entry["decided_at"] for entry in log)
    assert all(entry["created_at"] <= entry["decided_at"] for entry in log)  # decided at once
    only_2 = line.get("/models/digits/decisions", params={"candidate": "2"}).json()
    assert [entry["decision_id"] for entry in only_2] == [log[0]["decision_id"]]


@pytest.mark.parametrize("alias", ["Production", "PRODUCTION", "producTion"])
def test_look_alikes_of_production_are_reserved(line, alias):
    response = line.post(f"/models/digits/aliases/{alias}", json={"version": "2"})
    assert error_code(response, 422) == "alias_reserved"
    aliases = line.get("/models/digits").json()["aliases"]
    assert [entry["name"] for entry in aliases] == ["production"]


def test_the_decision_log_reads_in_the_same_number_of_queries_for_5_or_50(line):
    line.app.state.settings.callback_allowlist = ["10.0.0.0/8"]
    measure(line, "digits:1", "digits:2", "ev")

    def add_decisions(count: int) -> None:
        for index in range(count):  # with a baseline and a callback, and without
            body = ({"candidate": "2", "callback_url": "http://10.0.0.1/status"} if index % 2
                    else {"candidate": "1"})
            assert gate(line, **body).status_code == 200

    def queries_to_list() -> tuple[int, int]:
        statements: list[str] = []
        connection = line.app.state.connection  # every session of the test app uses it
        record = event.listens_for(connection, "before_cursor_execute")(
            lambda *args: statements.append(args[2]))
        try:
            listed = line.get("/models/digits/decisions", params={"limit": 1000}).json()
        finally:
            event.remove(connection, "before_cursor_execute", record)
        return len(listed), len(statements)

    add_decisions(5)
    few, queries_for_few = queries_to_list()
    add_decisions(45)
    many, queries_for_many = queries_to_list()
    assert (few, many) == (5 + 1, 50 + 1)  # and the one the line fixture made
    assert queries_for_many == queries_for_few


def test_production_moves_only_with_an_approval_or_by_force(line, mint):
    line.put("/models/digits/policy", json={"max_nfr": 0.05})
    promote = {"version": "2"}
    assert error_code(line.post("/models/digits/aliases/production", json=promote),
                      409) == "not_approved"
    measured(line)  # blocked
    assert error_code(line.post("/models/digits/aliases/production", json=promote),
                      409) == "not_approved"
    writer = bearer(mint("write"))
    forced = {"version": "2", "force": True}
    assert error_code(line.post("/models/digits/aliases/production", json=forced,
                                headers=writer), 403) == "missing_scope"
    assert line.post("/models/digits/aliases/production", json=forced).is_success
    history = line.get("/models/digits/promotions").json()
    assert [(entry["forced"], entry["requested_by"]) for entry in history] == [
        (False, "admin"), (True, "admin")]
    assert history[0]["decision_id"] is not None and history[1]["decision_id"] is None


def test_an_approval_against_the_current_production_allows_promotion(line):
    measured(line)
    response = line.post("/models/digits/aliases/production", json={"version": "2"})
    assert response.is_success and response.json()["name"] == "production"
    assert error_code(line.post("/models/digits/aliases/production", json={"version": "2"}),
                      409) == "already_production"
    assert line.post("/models/digits/aliases/canary", json={"version": "1"}).is_success


def test_a_final_decision_with_a_callback_url_queues_its_delivery(line):
    line.app.state.settings.callback_allowlist = ["127.0.0.1"]
    decision = gate(line, candidate="1", callback_url="http://127.0.0.1:9/status").json()
    assert decision["callback"]["state"] == "queued"
    assert decision["callback"]["attempts"] == 0
    assert error_code(gate(line, candidate="1", callback_url="ftp://x"), 422) == (
        "invalid_request")



def test_a_failed_callback_is_due_again_from_its_row_with_a_doubling_delay(line, db):
    line.app.state.settings.callback_allowlist = ["127.0.0.1"]
    decision_id = gate(line, candidate="1", callback_url="http://127.0.0.1:9/status").json()[
        "decision_id"]
    settings = Settings(callback_attempts=3, callback_backoff_seconds=10)
    with db() as session:
        assert due_callbacks(session=session, resend_seconds=60) == []  # sent after commit
        callback = queued_callback(session=session, decision_id=decision_id)
        delays = []
        for _ in range(2):
            record_attempt(callback=callback, status=500, error="HTTP 500", settings=settings)
            delays.append(round((callback.due_at - utcnow()).total_seconds()))
        assert delays == [10, 20] and callback.state == "queued"
        callback.due_at = utcnow() - timedelta(seconds=1)
        assert due_callbacks(session=session, resend_seconds=60) == [decision_id]
        assert due_callbacks(session=session, resend_seconds=60) == []  # due again in 60 s
        record_attempt(callback=callback, status=None, error="timeout", settings=settings)
        assert (callback.state, callback.attempts) == ("failed", 3)
        assert due_callbacks(session=session, resend_seconds=0) == []


def seed_blocked(client, folder) -> int:
    """seed_line, and a decision blocking 2 under max_nfr 0.05: its id."""
    seed_line(client, folder)
    client.put("/models/digits/policy", json={"max_nfr": 0.05})
    decision = measured(client).json()
    assert decision["verdict"] == "block"
    return decision["decision_id"]


# The tests that use `blocked` share one store per database seeded by seed_blocked, those that
# use `line` one seeded by seed_line; the others start from an empty store.
client, settings = shared_store(blocked=seed_blocked, line=seed_line)


@pytest.fixture
def blocked(line, module_store) -> int:
    """The id of the decision that seed_blocked made."""
    return module_store.seeded


def with_training_set(client, npz_file) -> None:
    client.post("/trainsets", data={"name": "train"},
                files={"data": ("d.npz", npz_file(n=60, num_classes=CLASSES).read_bytes())})
    assert client.put("/models/digits/training-dataset", json={"dataset": "train"}).is_success


def test_repair_queues_a_training_job_with_the_legacy_term(line, blocked, npz_file):
    repair = f"/gate/decisions/{blocked}/repair"
    assert error_code(line.post(repair, json={}), 422) == "no_training_dataset"
    with_training_set(line, npz_file)
    response = line.post(repair, json={"config": {"epochs": 2}})
    assert response.status_code == 202, response.text
    job = response.json()["job"]
    assert job["kind"] == "train" and job["state"] == "queued"
    params = job["params"]
    assert params["method"] == "elodi" and params["arch"] == "mlp"
    assert params["options"]["legacy_weight"] == 0.5  # production was not trained with ELODI
    assert params["config"]["epochs"] == 2 and params["version"] == "2-elodi"
    assert params["dataset"] == "train" and params["old_version_id"] is not None


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"method": "magic"}, 422, "unknown_method"),
    ({"options": {"alpha": 0.5, "nonsense": 1}}, 422, "invalid_options"),
    ({"options": {"members": 0}}, 422, "invalid_options"),
    ({"config": {"epochs": 0}}, 422, "invalid_request"),
    ({"config": {"epochs": 10**12}}, 422, "invalid_config"),
    ({"config": {"batch_size": 10**12}}, 422, "invalid_config"),
    ({"options": {"members": 10**9}}, 422, "invalid_options"),
    ({"method": "fd", "options": {"divergence": "bogus"}}, 422, "invalid_options"),
    ({"method": "fd", "options": {"temperature": 0}}, 422, "invalid_options"),
    ({"arch": "unittest.__main__:x"}, 422, "architecture_not_allowed"),
    ({"arch": "mlp:hidden=100000000"}, 422, "invalid_architecture"),
    ({"arch": "mlp:width=3"}, 422, "invalid_architecture"),
    ({"dataset": "ev"}, 422, "not_a_training_set"),
    ({"version": "1"}, 409, "version_exists"),
])
def test_bad_repair_requests_are_refused(line, blocked, npz_file, body, status, code):
    with_training_set(line, npz_file)
    assert error_code(line.post(f"/gate/decisions/{blocked}/repair", json=body),
                      status) == code


@pytest.mark.parametrize("seed", [2**64, 2**63, -1])
def test_a_repair_seed_outside_a_signed_64_bit_integer_is_422_naming_it(line, blocked, npz_file,
                                                                         db, seed):
    with_training_set(line, npz_file)
    jobs_before = count_jobs(db)
    response = line.post(f"/gate/decisions/{blocked}/repair", json={"config": {"seed": seed}})
    assert error_code(response, 422) == "invalid_request"
    assert "config.seed" in response.json()["error"]["message"]
    assert count_jobs(db) == jobs_before


def test_a_repair_too_large_to_train_is_refused_with_its_size(line, blocked, npz_file, db):
    with_training_set(line, npz_file)
    jobs_before = count_jobs(db)
    widths = [4096] * 8  # the zoo's largest MLP, 64 ELODI members: each bound alone holds
    response = line.post(f"/gate/decisions/{blocked}/repair", json={
        "arch": "mlp:hidden=" + ",".join(map(str, widths)), "options": {"members": 64}})
    layers = zip([FEATURES, *widths], [*widths, CLASSES], strict=True)
    parameters = sum(width_in * width_out + width_out for width_in, width_out in layers)
    models = 64 + 1 + 1  # the members, the student, the production model it distils towards
    needed = (models * parameters * 16 + 60 * FEATURES * 4) / 2**30
    assert error_code(response, 422) == "repair_too_large"
    assert f"about {needed:.1f} GiB" in response.json()["error"]["message"]
    assert count_jobs(db) == jobs_before


def count_jobs(db) -> int:
    with db() as session:
        return session.scalar(select(func.count()).select_from(Job))


def test_only_blocked_candidates_are_repaired(line):
    decision = measured(line).json()
    assert decision["verdict"] == "approve"
    response = line.post(f"/gate/decisions/{decision['decision_id']}/repair", json={})
    assert error_code(response, 409) == "not_blocked"


def test_cancelling_a_measurement_blocks_the_decision_waiting_for_it(line):
    decision = gate(line, candidate="2").json()
    assert line.post(f"/jobs/{decision['waiting_for'][0]}/cancel").is_success
    final = line.get(f"/gate/decisions/{decision['decision_id']}").json()
    assert final["verdict"] == "block"
    assert final["reasons"][0]["code"] == "measurement_failed"


def test_links_use_the_public_url_when_one_is_set(line, db):
    line.app.state.settings.public_url = "https://flipgate.example.com/api"
    decision = measured(line).json()
    assert decision["metrics"]["ev"]["report_url"].startswith(
        "https://flipgate.example.com/api/compare/digits:1/digits:2?")
    assert decision["report_url"] == (
        f"https://flipgate.example.com/api/ui/decisions/{decision['decision_id']}"
        "?project=default")
    assert status_sent(db, decision)["target_url"] == decision["report_url"]


def test_without_a_public_url_links_are_relative_whatever_the_host_header(line, db):
    assert measure(line, "digits:1", "digits:2", "ev")["n"] == N
    decision = gate(line, headers={"Host": "evil.example"}, candidate="2").json()
    assert decision["report_url"] == f"/ui/decisions/{decision['decision_id']}?project=default"
    assert decision["metrics"]["ev"]["report_url"].startswith("/compare/digits:1/digits:2?")
    assert "target_url" not in status_sent(db, decision)  # a relative link means nothing there


def status_sent(db, decision: dict) -> dict:
    """The status a callback would send for the decision."""
    with db() as session:
        stored = session.get(Decision, decision["decision_id"])
        return callback_body(session=session, decision=stored)


def test_the_worst_class_is_named_by_the_lines_class_names(line):
    line.put("/models/digits/classes", json={"class_names": ["cat", "dog", "owl"]})
    line.put("/models/digits/policy", json={"max_class_nfr": 0.1, "evalsets": ["ev"]})
    decision = measured(line).json()
    assert decision["verdict"] == "block"
    [message] = [reason["message"] for reason in decision["reasons"]]
    assert message.startswith("on ev: the NFR of class dog ")
    assert rate_figures(message) == (pytest.approx(4 / 33, abs=5e-5), None,
                                     pytest.approx(0.1, abs=1e-12))
    assert decision["metrics"]["ev"]["worst_class_name"] == "dog"
