"""Each documented policy rule at its bound, on the hand-counted line of test_gate_api
(1 → 2 on `ev`: 10 negative and 5 positive flips of 100, ER 0.10 → 0.15, worst class 4 of 33):
a bound the candidate just meets approves, one it just misses blocks with that rule's reason;
`significance` waives exactly the limits on negative flips; and a decision waiting on a job
whose worker is lost blocks when the sweeper gives the job up."""

import math
from datetime import timedelta

import numpy as np
import pytest

from flipgate.metrics.multilabel import compare_multilabel
from flipgate.metrics.report import compare_logits
from service.compare.models import PairMetrics
from service.compare.service import report_columns
from service.config import Settings
from service.db import utcnow
from service.gate.models import Verdict
from service.gate.rules import Policy, check, measured_metrics
from service.jobs.service import get_job, start_job
from tests.reasons import rate_figures
from tests.service.api.conftest import measure, post_evalset, post_logits, shared_store
from tests.service.api.test_gate_api import (  # noqa: F401
    CLASSES,
    P_VALUE,
    N,
    gate,
    line,
    logits_wrong_on,
    measured,
    seed_line,
)
from tests.service.conftest import FEATURES
from worker.sweeper import sweep

NEGATIVE_FLIPS, ER_OLD, ER_NEW, WORST_CLASS_NFR = 10, 0.10, 0.15, 4 / 33
EPSILON = 1e-9


def wilson_upper(successes: int, n: int, z: float = 1.959963984540054) -> float:
    """The upper end of the Wilson 95% interval, from its formula."""
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + spread) / (1 + z * z / n)


def decided_under(client, policy: dict) -> dict:
    """The decision on 2 against 1 under `policy`."""
    assert client.put("/models/digits/policy", json=policy).status_code == 200
    return gate(client, candidate="2").json()


def verdict_under(client, policy: dict) -> tuple[str, list[tuple[str, float, bool]]]:
    """Gate 2 against 1 under `policy`: the verdict and each reason's code, measured, blocking."""
    decision = decided_under(client, policy)
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
    assert {code for code, _, _ in reasons} == set(flip_limits)  # no separate significance one


def test_a_p_value_equal_to_the_significance_level_is_not_significant(line):  # noqa: F811
    """The test is one-sided at level α: significant when p < α; the server's own p as α
    waives the flip limits."""
    p_value = measured(line).json()["metrics"]["ev"]["mcnemar_p"]
    verdict, reasons = verdict_under(line, {"max_nfr": 0.05, "significance": p_value})
    assert (verdict, reasons) == ("approve", [("max_nfr", 0.1, False)])


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


# The same two versions on `gv`, an eval set with groups: `a` (samples 0-14: 5 negative flips
# of 15, error 10/15 before and after), `tiny` (15-19: 5 of 5, error 0 -> 1) and `rest`.
GROUPS = np.array(["a"] * 15 + ["tiny"] * 5 + ["rest"] * (N - 20))
GROUP_A_NFR = 5 / 15


def seed_grouped(client, folder) -> None:
    """seed_line, and 1 → 2 measured on `gv`."""
    seed_line(client, folder)
    path = folder / "gv.npz"
    np.savez(path, x=np.zeros((N, FEATURES), np.float32), y=np.arange(N) % CLASSES,
             groups=GROUPS)
    assert post_evalset(client, "gv", path).status_code == 201
    for version, wrong in (("1", range(0, 10)), ("2", range(5, 20))):
        assert post_logits(client, f"digits:{version}", "gv",
                           logits_wrong_on(wrong)).status_code == 201
    assert measure(client, "digits:1", "digits:2", "gv")["n"] == N


# one store per database for the tests that use `grouped`, one for those that use only `line`
client, settings = shared_store(grouped=seed_grouped, line=seed_line)


@pytest.fixture
def grouped(line):  # noqa: F811
    """The client, on the store that seed_grouped seeded."""
    return line


def group_reasons(client, policy: dict) -> tuple[str, list[tuple[str, str, float]]]:
    """Gate 2 against 1 on `gv` under `policy`: the verdict and each reason's code, group and
    measured value."""
    decision = decided_under(client, {**policy, "evalsets": ["gv"]})
    return decision["verdict"], [(reason["code"], reason.get("group"), reason["measured"])
                                 for reason in decision["reasons"]]


def test_a_group_over_its_nfr_limit_blocks_naming_it_and_small_groups_are_not_gated(grouped):
    at_bound = {"max_group_nfr": GROUP_A_NFR, "min_group_size": 10}
    assert group_reasons(grouped, at_bound) == ("approve", [])  # `tiny` (n = 5) not gated
    verdict, reasons = group_reasons(grouped, {**at_bound, "max_group_nfr": GROUP_A_NFR
                                               - EPSILON})
    assert (verdict, reasons) == ("block", [("max_group_nfr", "a", pytest.approx(GROUP_A_NFR))])
    verdict, reasons = group_reasons(grouped, {**at_bound, "min_group_size": 5})
    assert (verdict, reasons) == ("block", [("max_group_nfr", "tiny", pytest.approx(1.0))])
    [reason] = decided_under(grouped, {**at_bound, "min_group_size": 5, "evalsets": ["gv"]})[
        "reasons"]
    assert (reason["evalset"], reason["limit"], reason["blocking"]) == ("gv", GROUP_A_NFR, True)


def test_a_group_whose_error_rises_over_its_limit_blocks_naming_it(grouped):
    verdict, reasons = group_reasons(grouped, {"max_group_er_increase": 0.0,
                                               "min_group_size": 5})
    assert (verdict, reasons) == ("block", [("max_group_er_increase", "tiny",
                                             pytest.approx(1.0))])
    assert group_reasons(grouped, {"max_group_er_increase": 1.0, "min_group_size": 5}) == (
        "approve", [])


def test_a_reason_says_which_side_of_its_bound_the_candidate_is_and_when_it_is_waived(line):  # noqa: F811
    assert measured(line).status_code == 200
    decision = decided_under(line, {"min_er_decrease": 0.0, "max_nfr": 0.05,
                                    "significance": 0.05})
    messages = {reason["code"]: reason["message"] for reason in decision["reasons"]}
    assert set(messages) == {"min_er_decrease", "max_nfr"}
    decrease, nfr = messages["min_er_decrease"], messages["max_nfr"]
    assert decrease.startswith("on ev: the error-rate decrease ")
    assert "is below the minimum" in decrease
    assert rate_figures(decrease) == (pytest.approx(ER_OLD - ER_NEW, abs=5e-5), None, 0.0)
    assert nfr.startswith("on ev: NFR ") and "is above the maximum" in nfr
    assert nfr.endswith(" (waived: the flips are not significant)")
    measured_nfr, interval, limit = rate_figures(nfr)
    assert (measured_nfr, limit) == (pytest.approx(NEGATIVE_FLIPS / N, abs=5e-5),
                                     pytest.approx(0.05, abs=1e-12))
    assert interval[1] == pytest.approx(wilson_upper(NEGATIVE_FLIPS, N), abs=5e-5)


def test_the_measured_numbers_include_the_sample_count_and_both_error_rates(grouped):
    assert measured(grouped).status_code == 200  # 1 -> 2 on `ev` too
    metrics = decided_under(grouped, {"evalsets": ["ev", "gv"]})["metrics"]
    assert {name: (metrics[name]["n"], metrics[name]["er_old"], metrics[name]["er_new"],
                   metrics[name]["pfr"]) for name in ("ev", "gv")} == dict.fromkeys(
        ("ev", "gv"), (N, pytest.approx(ER_OLD), pytest.approx(ER_NEW), pytest.approx(5 / N)))
    groups = {group["group"]: (group["n"], group["er_old"], group["er_new"])
              for group in metrics["gv"]["groups"]}
    errors_old, errors_new = np.zeros(N, bool), np.zeros(N, bool)
    errors_old[0:10], errors_new[5:20] = True, True
    assert groups == {name: (int(members.sum()), pytest.approx(errors_old[members].mean()),
                             pytest.approx(errors_new[members].mean()))
                      for name in set(GROUPS) for members in [name == GROUPS]}


def stored_row(old: np.ndarray, new: np.ndarray, labels: np.ndarray, **options) -> PairMetrics:
    """A pair's metrics as the server stores them, from flipgate's report on the logits."""
    return PairMetrics(**report_columns(compare_logits(old, new, labels, **options)))


def test_the_worst_class_is_one_with_samples_when_the_eval_set_lacks_a_class():
    """A class the eval set has no sample of has no NFR; it is never the worst class."""
    classes = np.eye(3, dtype=np.float32)
    row = stored_row(classes[[0, 0, 1, 1]], classes[[0, 2, 1, 1]], np.array([0, 0, 1, 1]))
    numbers = measured_metrics(row, row.report, Policy())
    assert (numbers["worst_class"], numbers["worst_class_nfr"]) == (0, 0.5)


def test_without_negative_flips_the_worst_class_nfr_is_zero_and_every_group_is_gated():
    """No policy minimum: a group of one sample is gated; no flips: the worst class's NFR is 0."""
    logits = np.eye(3, dtype=np.float32)[[0, 1, 2, 2]]
    row = stored_row(logits, logits, np.array([0, 1, 2, 2]),
                     groups=np.array(["one", "rest", "rest", "rest"]))
    numbers = measured_metrics(row, row.report, Policy())
    assert numbers["worst_class_nfr"] == 0.0
    assert {group["group"]: (group["n"], group["gated"]) for group in numbers["groups"]} == {
        "one": (1, True), "rest": (3, True)}


def test_a_multilabel_pair_measured_before_fixed_samples_were_kept_blocks_a_cost_limit():
    """A report without `fixed_indices` cannot be weighed: a cost limit or the cost test
    blocks saying so; costs merely reported block nothing."""
    y = np.array([[1, 0], [0, 1], [1, 1]], dtype=bool)
    report = compare_multilabel(y, y, ~y, label_names=["a", "b"])
    del report["fixed_indices"]
    row = PairMetrics(**report_columns(report))
    for policy in (Policy(max_expected_cost=0.5),
                   Policy(significance=0.05, significance_test="cost")):
        numbers = measured_metrics(row, report, policy)
        assert (numbers["expected_cost"], numbers["cost_p"]) == (None, None)
        verdict, reasons = check(policy, {"ev": numbers})
        assert verdict == Verdict.BLOCK
        assert [reason["code"] for reason in reasons] == ["label_costs_not_measured"]
    reported = Policy(negative_flip_cost={"a": 2.0})
    assert check(reported, {"ev": measured_metrics(row, report, reported)})[0] == \
        Verdict.APPROVE
