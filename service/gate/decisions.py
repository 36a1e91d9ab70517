"""The gate's decisions: may a candidate replace the baseline?

A decision whose pair metrics are all stored is final at once. Otherwise it is `pending`:
it waits for the inference and metrics jobs it queued (gate_decision_jobs) and is settled
(service.gate.settling) when they end. A final decision is never changed.
"""

import hashlib
import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.callbacks.targets import check_callback_url, stored_callback_url
from service.compare.service import Pair, check_scorable, queue_measurement
from service.config import Settings
from service.datasets.labels import label_revision
from service.datasets.models import Dataset, DatasetRole
from service.datasets.service import get_dataset_of_role
from service.db import insert_or_conflict, one_or_not_found, utcnow
from service.errors import Conflict, InvalidInput, ServiceError, Unauthorized
from service.gate.evidence import HistoryRead, history_plan, pair_evidence
from service.gate.history import HistoryInputs
from service.gate.models import Decision, DecisionJob, GatePolicy, Verdict
from service.gate.policies import current_policy
from service.gate.rules import DEFAULT_POLICY, Policy, check
from service.gate.schemas import GateRequest
from service.gate.verdicts import announce, judge, note
from service.jobs.models import Job
from service.predictions.service import measured_datasets
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import (
    check_evalset_fits,
    get_line,
    get_named_version,
    production_version,
)


def gate(*, session: Session, settings: Settings, request: GateRequest, requested_by: str,
         base_url: str, request_sha256: str, delivery_id: str | None = None,
         signature_digest: str | None = None, repair_of: Decision | None = None,
         known_history: HistoryRead | None = None) -> Decision:
    """The decision on `request`: final when every pair metric is stored, else pending on
    the jobs it queued. A delivery id seen before answers with that delivery's decision; a
    signed request (`signature_digest`: the digest that matched) seen before under another
    delivery id, or none, is refused. `known_history`: the breaks of `history_plan`, read
    before the caller's transaction began."""
    line = get_line(session=session, name=request.model)
    if delivery_id is not None and (earlier := _delivered(session, line, delivery_id)):
        return _replayed(earlier, request_sha256)
    if signature_digest is not None and _signed_before(session, line, signature_digest):
        raise replayed_signature()
    callback_url = request.callback_url and str(request.callback_url)
    if callback_url is not None:
        check_callback_url(callback_url, settings.callback_allowlist)
    shown_callback_url, sealed_callback_url = stored_callback_url(settings, callback_url)
    candidate = get_named_version(session=session, line_name=line.name, version=request.candidate)
    baseline = _baseline(session, line, request.baseline)
    stored_policy = current_policy(session=session, line=line)
    policy = _rules(stored_policy)
    decision = Decision(
        created_at=utcnow(),  # not after a verdict given before the row is inserted
        line_id=line.id, candidate_id=candidate.id, verdict=Verdict.PENDING, reasons=[],
        baseline_id=None if baseline is None else baseline.id, metrics={}, evalsets=[],
        policy_version=stored_policy and stored_policy.version, policy=policy.model_dump(
            exclude_none=True), requested_by=requested_by, base_url=base_url,
        ci=request.ci and request.ci.model_dump(exclude_none=True), delivery_id=delivery_id,
        callback_url=shown_callback_url, callback_url_sealed=sealed_callback_url,
        request_sha256=request_sha256, signature_digest=signature_digest,
        repair_of_id=repair_of and repair_of.id)
    datasets = _gate_datasets(session, line, policy, request.evalsets,
                              settings.min_gate_samples) if _compares(candidate, baseline) else []
    judged = _judge(session, settings, decision, line, candidate, baseline, policy, datasets,
                    known_history)
    try:
        _insert(session, decision)
    except Conflict:  # the same delivery, or signed request, arrived twice at once
        earlier = delivery_id and _delivered(session, line, delivery_id)
        if not earlier:
            raise replayed_signature() from None
        return _replayed(earlier, request_sha256)
    if judged:
        announce(session=session, decision=decision)
    else:
        _measure(session, decision, baseline, candidate, datasets)
    return decision


def _insert(session: Session, decision: Decision) -> None:
    """Insert the decision; Conflict when its delivery id or signature is taken (in a
    savepoint, needed only then: nothing else of a decision is unique)."""
    if decision.delivery_id is None and decision.signature_digest is None:
        session.add(decision)
        session.flush()
    else:
        insert_or_conflict(session, decision, code="delivery_exists", message="")


def history_plan_of(*, session: Session, settings: Settings,
                    request: GateRequest) -> list[HistoryInputs]:
    """What `gate` on `request` would read from disk for the policy's history limit (read it
    with evidence.read_history before a write transaction, and pass it as `known_history`);
    nothing when the request does not resolve (`gate` then says why)."""
    try:
        line = get_line(session=session, name=request.model)
        policy = _rules(current_policy(session=session, line=line))
        if not policy.max_nfr_vs_history:
            return []
        candidate = get_named_version(session=session, line_name=line.name,
                                      version=request.candidate)
        baseline = _baseline(session, line, request.baseline)
        if baseline is None or not _compares(candidate, baseline):
            return []
        datasets = _gate_datasets(session, line, policy, request.evalsets,
                                  settings.min_gate_samples)
    except ServiceError:
        return []
    return history_plan(session=session, policy=policy, line=line, baseline=baseline,
                        candidate=candidate, datasets=datasets)


def _rules(stored_policy: GatePolicy | None) -> Policy:
    """The rules of the line's stored policy, or the default policy."""
    return Policy.model_validate(stored_policy.rules) if stored_policy else DEFAULT_POLICY


def gate_request(*, session: Session, settings: Settings, request: GateRequest,
                 requested_by: str, base_url: str, delivery_id: str | None = None,
                 repair_of: Decision | None = None) -> Decision:
    """The decision on a request the server makes itself (a repair job, a connector), with no
    body of its own: its digest is that of the request's canonical JSON."""
    body = json.dumps(request.model_dump(mode="json"), sort_keys=True).encode()
    return gate(session=session, settings=settings, request=request, requested_by=requested_by,
                base_url=base_url, request_sha256=hashlib.sha256(body).hexdigest(),
                delivery_id=delivery_id, repair_of=repair_of)


def _delivered(session: Session, line: ModelLine, delivery_id: str) -> Decision | None:
    statement = select(Decision).where(Decision.line_id == line.id,
                                       Decision.delivery_id == delivery_id)
    return session.scalars(statement).one_or_none()


def _signed_before(session: Session, line: ModelLine, signature_digest: str) -> bool:
    statement = select(Decision.id).where(Decision.line_id == line.id,
                                          Decision.signature_digest == signature_digest)
    return session.scalars(statement).first() is not None


def replayed_signature() -> Unauthorized:
    return Unauthorized("replayed_signature", "this signed request was already accepted; sign "
                        "each request anew (a retry that sends its first X-Flipgate-Delivery "
                        "again gets the first decision)")


def _replayed(decision: Decision, request_sha256: str) -> Decision:
    """The decision of a delivery sent again; a different body under its id is refused."""
    if decision.request_sha256 != request_sha256:
        raise Conflict("delivery_reused", f"delivery {decision.delivery_id!r} was already "
                       "used for a different request body")
    return decision


def _baseline(session: Session, line: ModelLine, version: str | None) -> ModelVersion | None:
    """The named version of the line, else its production version (None if it has none)."""
    if version is not None:
        return get_named_version(session=session, line_name=line.name, version=version)
    return production_version(session=session, line=line)


def _compares(candidate: ModelVersion, baseline: ModelVersion | None) -> bool:
    """Whether the decision measures a pair (not a first version or the baseline itself)."""
    return baseline is not None and baseline.id != candidate.id


def _judge(session: Session, settings: Settings, decision: Decision, line: ModelLine,
           candidate: ModelVersion, baseline: ModelVersion | None, policy: Policy,
           datasets: list[Dataset], known_history: HistoryRead | None) -> bool:
    """Give the decision, before it is inserted (one write), the verdict it can have now: a
    first version or the baseline itself, or every pair's metrics stored; False when it
    waits for measurements."""
    if baseline is None:
        judge(decision, verdict=Verdict.APPROVE, reasons=[note(
            "first_version", "the line has no production version; the candidate may be the "
            "first")])
        return True
    if not _compares(candidate, baseline):
        judge(decision, verdict=Verdict.APPROVE,
              reasons=[note("already_baseline", "the candidate is the baseline")])
        return True
    decision.evalsets = [dataset.name for dataset in datasets]
    measured = pair_evidence(session=session, settings=settings, policy=policy, line=line,
                             baseline=baseline, candidate=candidate, datasets=datasets,
                             known=known_history)
    if measured is None:
        return False
    verdict, reasons = check(policy, measured)
    judge(decision, verdict=verdict, reasons=reasons, metrics=measured)
    return True


def _measure(session: Session, decision: Decision, baseline: ModelVersion,
             candidate: ModelVersion, datasets: list[Dataset]) -> None:
    """Queue the measurements a stored pending decision waits for."""
    for dataset in datasets:  # an external version's predictions can only be uploaded
        check_scorable(session=session, pair=_pair(session, baseline, candidate, dataset))
    jobs = [job for dataset in datasets
            for job in _queue_measurement(session, baseline, candidate, dataset)]
    session.add_all(DecisionJob(decision_id=decision.id, job_id=job_id)
                    for job_id in dict.fromkeys(job.id for job in jobs))
    session.flush()


def _gate_datasets(session: Session, line: ModelLine, policy: Policy, requested: list[str],
                   min_samples: int) -> list[Dataset]:
    """The policy's eval sets and the requested ones; by default the labeled sets the line
    was measured on. A traffic set joins only where the policy names it. Without policy eval
    sets, each must hold at least `min_samples`."""
    names = list(dict.fromkeys([*policy.evalsets, *requested]))
    datasets = ([get_dataset_of_role(session=session, name=name, role=DatasetRole.EVAL)
                 for name in names]
                or [dataset for dataset in measured_datasets(session=session, line_id=line.id)
                    if dataset.labeled])
    if unnamed := [d.name for d in datasets if not d.labeled and d.name not in policy.evalsets]:
        raise InvalidInput("traffic_set_not_in_policy", f"{unnamed[0]!r} is a traffic set; "
                           "traffic sets join a gate only where the line's policy names them")
    for dataset in datasets:
        check_evalset_fits(line=line, dataset=dataset)
    if not datasets:
        raise InvalidInput("no_evalsets", "name the eval sets in the request or the policy; "
                           "the line has not been measured on any yet")
    small = [dataset for dataset in datasets if dataset.n < min_samples]
    if small and not policy.evalsets:
        raise InvalidInput("evalset_too_small", f"eval set {small[0].name!r} has "
                           f"{small[0].n} samples; without eval sets in the line's policy "
                           f"the gate decides on sets of at least {min_samples} "
                           "(FLIPGATE_MIN_GATE_SAMPLES)")
    return datasets


def _queue_measurement(session: Session, baseline: ModelVersion, candidate: ModelVersion,
                       dataset: Dataset) -> list[Job]:
    """The jobs that store baseline → candidate's metrics on `dataset`."""
    return queue_measurement(session=session, pair=_pair(session, baseline, candidate, dataset))


def _pair(session: Session, baseline: ModelVersion, candidate: ModelVersion,
          dataset: Dataset) -> Pair:
    """The pair measured on `dataset` (with a traffic set's newest labels)."""
    return Pair(baseline, candidate, dataset, label_revision(session=session, dataset=dataset))


def waited_jobs(*, session: Session, decision: Decision) -> list[Job]:
    """The jobs the decision waits (or waited) for."""
    statement = (select(Job).join(DecisionJob, DecisionJob.job_id == Job.id)
                 .where(DecisionJob.decision_id == decision.id).order_by(Job.id))
    return list(session.scalars(statement))


def get_decision(*, session: Session, decision_id: int) -> Decision:
    """The decision with this id."""
    return one_or_not_found(session, select(Decision).where(Decision.id == decision_id),
                            code="decision_not_found", message=f"no decision {decision_id}")


def list_decisions(*, session: Session, line_name: str, candidate: str | None = None,
                   limit: int = 100, before: int | None = None) -> list[Decision]:
    """The line's decisions, newest first (`before`: only older ids than this)."""
    line = get_line(session=session, name=line_name)
    statement = select(Decision).where(Decision.line_id == line.id)
    if candidate is not None:
        version = get_named_version(session=session, line_name=line_name, version=candidate)
        statement = statement.where(Decision.candidate_id == version.id)
    if before is not None:
        statement = statement.where(Decision.id < before)
    return list(session.scalars(statement.order_by(Decision.id.desc()).limit(limit)))
