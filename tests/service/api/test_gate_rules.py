"""Each documented policy rule at its bound, on the hand-counted line of test_gate_api
(1 → 2 on `ev`: 10 negative and 5 positive flips of 100, ER 0.10 → 0.15, worst class 4 of 33):
a bound the candidate just meets approves, one it just misses blocks with that rule's reason;
`significance` waives exactly the limits on negative flips; and a decision waiting on a job
whose worker is lost blocks when the sweeper gives the job up."""

import math
from datetime import timedelta

import pytest

from service.config import Settings
from service.db import utcnow
from service.jobs.service import get_job, start_job
from tests.service.api.test_gate_api import P_VALUE, N, gate, line, measured  # noqa: F401
from worker.sweeper import sweep

NEGATIVE_FLIPS, ER_OLD, ER_NEW, WORST_CLASS_NFR = 10, 0.10, 0.15, 4 / 33
EPSILON = 1e-9


def wilson_upper(successes: int, n: int, z: float = 1.959963984540054) -> float:
    """The upper end of the Wilson 95% interval, from its formula."""
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + spread) / (1 + z * z / n)


def verdict_under(client, policy: dict) -> tuple[str, list[tuple[str, float, bool]]]:
    """Gate 2 against 1 under `policy`: the verdict and each reason's code, measured, blocking."""
    assert client.put("/models/digits/policy", json=policy).status_code == 200
    decision = gate(client, candidate="2").json()
    return decision["verdict"], [(reason["code"], reason["measured"], reason["blocking"])
                                 for reason in decision["reasons"]]


@pytest.mark.parametrize(("rule", "value"), [
    ("max_nfr_upper", wilson_upper(NEGATIVE_FLIPS, N)),
    ("max_class_nfr", WORST_CLASS_NFR),
    ("min_er_decrease", ER_OLD - ER_NEW),
])
def test_a_rule_approves_at_its_bound_and_blocks_just_past_it(line, rule, value):  # noqa: F811
    assert measured(line).status_code == 200
    met, missed = (value + EPSILON, value - EPSILON) if rule.startswith("max") else (
        value - EPSILON, value + EPSILON)
    assert verdict_under(line, {rule: met}) == ("approve", [])
    verdict, reasons = verdict_under(line, {rule: missed})
    assert verdict == "block"
    assert reasons == [(rule, pytest.approx(value, abs=1e-12), True)]


def test_significance_waives_the_flip_limits_and_nothing_else(line):  # noqa: F811
    assert measured(line).status_code == 200
    flip_limits = {"max_nfr": 0.05, "max_nfr_upper": 0.05, "max_rel_nfr": 0.05,
                   "max_class_nfr": 0.05}
    others = {"max_churn": 0.1, "max_er_increase": 0.0, "min_er_decrease": 0.0}
    verdict, reasons = verdict_under(line, {**flip_limits, **others, "significance": 0.05})
    assert P_VALUE > 0.05 and verdict == "block"
    assert {code: blocking for code, _, blocking in reasons} == {
        **dict.fromkeys(flip_limits, False), **dict.fromkeys(others, True)}
    verdict, reasons = verdict_under(line, {**flip_limits, "significance": 0.05})
    assert verdict == "approve" and {code for code, _, _ in reasons} == set(flip_limits)
    verdict, reasons = verdict_under(line, {**flip_limits, "significance": 0.2})  # p < 0.2
    assert verdict == "block" and all(blocking for _, _, blocking in reasons)


def test_a_decision_waiting_on_a_job_whose_worker_is_lost_blocks(line, db):  # noqa: F811
    decision = gate(line, candidate="2").json()
    assert decision["verdict"] == "pending"
    with db() as session:
        job = start_job(session=session, job=get_job(session=session,
                                                     job_id=decision["waiting_for"][0]))
        job.heartbeat_at = utcnow() - timedelta(seconds=60)  # its worker died a minute ago
    sweep(line.app.state.sessions, line.app.state.celery,
          Settings(job_lease_seconds=30, job_attempts=1))
    final = line.get(f"/gate/decisions/{decision['decision_id']}").json()
    assert final["verdict"] == "block" and final["waiting_for"] == []
    assert final["reasons"][0]["code"] == "measurement_failed"
    assert "worker_lost" in final["reasons"][0]["message"]


def test_a_block_by_significance_alone_names_the_eval_set_and_the_level(line):  # noqa: F811
    assert measured(line).status_code == 200
    assert line.put("/models/digits/policy", json={"significance": 0.2}).status_code == 200
    [reason] = gate(line, candidate="2").json()["reasons"]
    assert reason == {
        "code": "significance", "evalset": "ev", "measured": pytest.approx(P_VALUE),
        "limit": 0.2, "blocking": True,
        "message": f"on ev: the candidate makes more new errors than it fixes (one-sided "
                   f"McNemar p = {P_VALUE:.3g} < 0.2)"}


@pytest.mark.parametrize(("rule", "value"), [("max_class_nfr", WORST_CLASS_NFR),
                                             ("min_er_decrease", ER_OLD - ER_NEW)])
def test_a_candidate_exactly_at_a_bound_is_approved(line, rule, value):  # noqa: F811
    """"At most" and "at least" include the bound (the same float the server computes)."""
    assert measured(line).status_code == 200
    assert verdict_under(line, {rule: value}) == ("approve", [])
