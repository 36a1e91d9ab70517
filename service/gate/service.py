"""Policies, webhook secrets and decisions: may a candidate replace the baseline?

A decision whose pair metrics are all stored is final at once. Otherwise it is `pending`:
it waits for the inference and metrics jobs it queued (gate_decision_jobs) and becomes final
in `settle_pending` once they have all ended; a failed job makes it a block. A final
decision is never changed.
"""

import secrets
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.compare.service import Pair, find_pair_metrics, queue_measurement
from service.datasets.models import Dataset, DatasetRole
from service.datasets.service import get_dataset
from service.db import insert_or_conflict, one_or_not_found, utcnow
from service.errors import Conflict, InvalidInput
from service.gate.models import (
    Callback,
    Decision,
    DecisionJob,
    GatePolicy,
    Verdict,
    WebhookSecret,
)
from service.gate.rules import DEFAULT_POLICY, Policy, check, measured_metrics
from service.gate.schemas import CallbackRead, DecisionRead, GateRequest
from service.jobs.enqueue import send_task_after_commit
from service.jobs.models import Job, JobState
from service.jobs.service import OPEN_STATES
from service.predictions.service import measured_datasets
from service.queue import CALLBACK_TASK
from service.registry.models import Alias, ModelLine, ModelVersion
from service.registry.service import PRODUCTION, find_version, get_line, get_version


def put_policy(*, session: Session, line_name: str, policy: Policy,
               created_by: str) -> GatePolicy:
    """Store `policy` as the line's next policy version; its eval sets must exist."""
    line = get_line(session=session, name=line_name)
    for name in policy.evalsets:
        _eval_dataset(session, name)
    latest = session.scalar(select(func.max(GatePolicy.version))
                            .where(GatePolicy.line_id == line.id)) or 0
    row = GatePolicy(line_id=line.id, version=latest + 1, created_by=created_by,
                     rules=policy.model_dump(exclude_none=True))
    return insert_or_conflict(session, row, code="policy_changed", message=f"the policy of "
                              f"{line_name!r} changed meanwhile; send it again")


def current_policy(*, session: Session, line: ModelLine) -> GatePolicy | None:
    """The line's newest policy version, if one was ever set."""
    statement = select(GatePolicy).where(GatePolicy.line_id == line.id)
    return session.scalars(statement.order_by(GatePolicy.version.desc()).limit(1)).first()


def get_policy(*, session: Session, line_name: str, version: int) -> GatePolicy:
    """One stored version of a line's policy."""
    line = get_line(session=session, name=line_name)
    statement = select(GatePolicy).where(GatePolicy.line_id == line.id,
                                         GatePolicy.version == version)
    return one_or_not_found(session, statement, code="policy_not_found",
                            message=f"{line_name!r} has no policy version {version}")


def rotate_secret(*, session: Session, line_name: str) -> str:
    """A new webhook secret for the line, replacing the old one; shown to the caller once."""
    line = get_line(session=session, name=line_name)
    secret = secrets.token_hex(32)
    row = session.scalars(select(WebhookSecret).where(WebhookSecret.line_id == line.id)
                          .with_for_update()).one_or_none()
    if row is None:
        insert_or_conflict(session, WebhookSecret(line_id=line.id, secret=secret),
                           code="secret_changed", message="the secret changed meanwhile")
        return secret
    row.secret, row.rotated_at = secret, utcnow()
    session.flush()
    return secret


def line_secret(*, session: Session, line_name: str) -> str | None:
    """The webhook secret of the named line, if it has one."""
    statement = (select(WebhookSecret.secret).join(ModelLine,
                                                   ModelLine.id == WebhookSecret.line_id)
                 .where(ModelLine.name == line_name))
    return session.scalar(statement)


def gate(*, session: Session, request: GateRequest, requested_by: str, base_url: str,
         request_sha256: str, delivery_id: str | None = None,
         repair_of: Decision | None = None) -> Decision:
    """The decision on `request`: final when every pair metric is stored, else pending on
    the jobs it queued. A delivery id seen before answers with that delivery's decision."""
    line = get_line(session=session, name=request.model)
    if delivery_id is not None and (earlier := _delivered(session, line, delivery_id)):
        settle_pending(session=session)
        return _replayed(earlier, request_sha256)
    candidate = find_version(session=session, line_name=line.name, version=request.candidate)
    baseline = _baseline(session, line, request.baseline)
    stored_policy = current_policy(session=session, line=line)
    policy = Policy.model_validate(stored_policy.rules) if stored_policy else DEFAULT_POLICY
    decision = Decision(
        line_id=line.id, candidate_id=candidate.id, verdict=Verdict.PENDING, reasons=[],
        baseline_id=None if baseline is None else baseline.id, metrics={}, evalsets=[],
        policy_version=stored_policy and stored_policy.version, policy=policy.model_dump(
            exclude_none=True), requested_by=requested_by, base_url=base_url,
        ci=request.ci and request.ci.model_dump(exclude_none=True), delivery_id=delivery_id,
        callback_url=request.callback_url and str(request.callback_url),
        request_sha256=request_sha256, repair_of_id=repair_of and repair_of.id)
    try:
        insert_or_conflict(session, decision, code="delivery_exists", message="")
    except Conflict:  # the same delivery arrived twice at once
        return _replayed(_delivered(session, line, delivery_id), request_sha256)
    _measure_or_decide(session, decision, candidate, baseline, policy, request.evalsets)
    return decision


def _delivered(session: Session, line: ModelLine, delivery_id: str) -> Decision | None:
    statement = select(Decision).where(Decision.line_id == line.id,
                                       Decision.delivery_id == delivery_id)
    return session.scalars(statement).one_or_none()


def _replayed(decision: Decision, request_sha256: str) -> Decision:
    """The decision of a delivery sent again; a different body under its id is refused."""
    if decision.request_sha256 != request_sha256:
        raise Conflict("delivery_reused", f"delivery {decision.delivery_id!r} was already "
                       "used for a different request body")
    return decision


def _baseline(session: Session, line: ModelLine, version: str | None) -> ModelVersion | None:
    """The named version of the line, else its production version (None if it has none)."""
    if version is not None:
        return find_version(session=session, line_name=line.name, version=version)
    return production_version(session=session, line=line)


def production_version(*, session: Session, line: ModelLine,
                       lock: bool = False) -> ModelVersion | None:
    """The version the line's production alias points at, if any (`lock`: its alias row)."""
    statement = select(Alias).where(Alias.line_id == line.id, Alias.name == PRODUCTION)
    alias = session.scalars(statement.with_for_update() if lock else statement).one_or_none()
    return None if alias is None else get_version(session=session, version_id=alias.version_id)


def _measure_or_decide(session: Session, decision: Decision, candidate: ModelVersion,
                       baseline: ModelVersion | None, policy: Policy,
                       requested: list[str]) -> None:
    """Decide now, or queue the missing measurements and leave the decision pending."""
    if baseline is None:
        return _finalize(session, decision, Verdict.APPROVE, [_note(
            "first_version", "the line has no production version; the candidate may be the "
            "first")])
    if baseline.id == candidate.id:
        return _finalize(session, decision, Verdict.APPROVE, [_note(
            "already_baseline", "the candidate is the baseline")])
    datasets = _gate_datasets(session, decision, policy, requested)
    decision.evalsets = [dataset.name for dataset in datasets]
    stored = {dataset.name: find_pair_metrics(session=session, old=baseline, new=candidate,
                                              dataset=dataset) for dataset in datasets}
    if all(stored.values()):
        measured = {name: measured_metrics(row) for name, row in stored.items()}
        return _finalize(session, decision, *check(policy, measured), measured)
    jobs = [job for dataset in datasets if stored[dataset.name] is None
            for job in _queue_measurement(session, baseline, candidate, dataset)]
    session.add_all(DecisionJob(decision_id=decision.id, job_id=job_id)
                    for job_id in dict.fromkeys(job.id for job in jobs))
    session.flush()


def _gate_datasets(session: Session, decision: Decision, policy: Policy,
                   requested: list[str]) -> list[Dataset]:
    """The policy's eval sets and the requested ones; by default those the line was
    measured on."""
    names = list(dict.fromkeys([*policy.evalsets, *requested]))
    datasets = ([_eval_dataset(session, name) for name in names]
                or measured_datasets(session=session, line_id=decision.line_id))
    if not datasets:
        raise InvalidInput("no_evalsets", "name the eval sets in the request or the policy; "
                           "the line has not been measured on any yet")
    return datasets


def _eval_dataset(session: Session, name: str) -> Dataset:
    dataset = get_dataset(session=session, name=name)
    if dataset.role != DatasetRole.EVAL:
        raise InvalidInput("not_an_evalset", f"data set {name!r} is a {dataset.role} set")
    return dataset


def _queue_measurement(session: Session, baseline: ModelVersion, candidate: ModelVersion,
                       dataset: Dataset) -> list[Job]:
    """The jobs that store baseline → candidate's metrics on `dataset`."""
    return queue_measurement(session=session, pair=Pair(baseline, candidate, dataset))


def settle_pending(*, session: Session) -> list[Decision]:
    """Make final every pending decision whose jobs have all ended."""
    still_open = (select(DecisionJob.decision_id).join(Job, Job.id == DecisionJob.job_id)
                  .where(Job.state.in_(OPEN_STATES)))
    statement = (select(Decision).where(Decision.verdict == Verdict.PENDING,
                                        Decision.id.not_in(still_open))
                 .order_by(Decision.id).with_for_update()
                 .execution_options(populate_existing=True))
    decisions = list(session.scalars(statement))
    for decision in decisions:
        _decide(session, decision)
    return decisions


def _decide(session: Session, decision: Decision) -> None:
    """The final verdict from the stored pair metrics; a block if a measurement failed."""
    failed = [job for job in waited_jobs(session=session, decision=decision)
              if job.state != JobState.SUCCEEDED]
    if failed:
        return _finalize(session, decision, Verdict.BLOCK, [_note(
            "measurement_failed", f"job {job.id} ({job.kind}) {job.state}: "
            f"{job.error or 'no error recorded'}",
            blocking=True) for job in failed])
    measured = _measured(session, decision)
    verdict, reasons = check(Policy.model_validate(decision.policy), measured)
    _finalize(session, decision, verdict, reasons, measured)


def _measured(session: Session, decision: Decision) -> dict[str, dict[str, Any]]:
    """The policy's numbers for each of the decision's eval sets, from stored pair metrics."""
    baseline = get_version(session=session, version_id=decision.baseline_id)
    candidate = get_version(session=session, version_id=decision.candidate_id)
    rows = {name: find_pair_metrics(session=session, old=baseline, new=candidate,
                                    dataset=get_dataset(session=session, name=name))
            for name in decision.evalsets}
    return {name: measured_metrics(row) for name, row in rows.items()}


def _finalize(session: Session, decision: Decision, verdict: Verdict, reasons: list[dict],
              metrics: dict[str, Any] | None = None) -> None:
    """Record the final verdict; its callback, if any, is sent after the commit."""
    decision.verdict, decision.reasons, decision.metrics = verdict, reasons, metrics or {}
    decision.decided_at = utcnow()
    if decision.callback_url is not None:
        session.add(Callback(decision_id=decision.id))
        send_task_after_commit(session=session, task=CALLBACK_TASK, argument=decision.id)
    session.flush()


def _note(code: str, message: str, *, blocking: bool = False) -> dict[str, Any]:
    """A reason that is not a measured limit."""
    return {"code": code, "blocking": blocking, "message": message}


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
        version = find_version(session=session, line_name=line_name, version=candidate)
        statement = statement.where(Decision.candidate_id == version.id)
    if before is not None:
        statement = statement.where(Decision.id < before)
    return list(session.scalars(statement.order_by(Decision.id.desc()).limit(limit)))


def decision_view(*, session: Session, decision: Decision) -> DecisionRead:
    """The wire form of a decision, with links to its HTML pair reports."""
    line = session.get_one(ModelLine, decision.line_id)
    candidate = get_version(session=session, version_id=decision.candidate_id).version
    baseline = (None if decision.baseline_id is None
                else get_version(session=session, version_id=decision.baseline_id).version)
    reports = {name: _report_url(decision.base_url, line.name, baseline, candidate, name)
               for name in decision.metrics}
    callback = None if decision.callback_url is None else session.scalars(
        select(Callback).where(Callback.decision_id == decision.id)).one_or_none()
    return DecisionRead(
        decision_id=decision.id, verdict=decision.verdict, reasons=decision.reasons,
        metrics={name: {**numbers, "report_url": reports[name]}
                 for name, numbers in decision.metrics.items()},
        report_url=next(iter(reports.values()), None), model=line.name, candidate=candidate,
        baseline=baseline, evalsets=decision.evalsets, policy_version=decision.policy_version,
        policy=decision.policy, requested_by=decision.requested_by, ci=decision.ci,
        callback_url=decision.callback_url,
        callback=callback and CallbackRead.model_validate(callback),
        waiting_for=[] if decision.verdict != Verdict.PENDING else [
            job.id for job in waited_jobs(session=session, decision=decision)
            if job.state in OPEN_STATES],
        repair_of=decision.repair_of_id, created_at=decision.created_at,
        decided_at=decision.decided_at)


def _report_url(base_url: str, line: str, baseline: str, candidate: str, evalset: str) -> str:
    return f"{base_url}compare/{line}:{baseline}/{line}:{candidate}?evalset={evalset}&format=html"
