"""The figures of work and outcomes, read from the database when Prometheus scrapes: jobs,
gate decisions, callbacks, the queue and the workers seen alive. They are whole-server figures
(every API process and host answers the same), and counters only grow because the rows they
count are final: a job, a decision or a callback that has ended never changes again. So the
sums over ended jobs and decisions are read once per process up to a moment SETTLE_SECONDS
past and kept (EndedTotals), and each scrape reads only the rows that ended since, through
the indexes on when they ended: a scrape's cost does not grow with the history. With them,
the dependencies this API process reaches (the /readyz checks) and the build."""

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from sqlalchemy import ColumnElement, Select, case, exists, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, aliased

import flipgate
from service import health
from service.callbacks.models import Callback, CallbackState
from service.db import read_only, utcnow
from service.gate.models import Decision, Verdict
from service.jobs.models import Job, JobDependency, JobKind, JobState, WorkerBeat

# seconds: a job's run and wait, a verdict's delay (jobs run from a second to an hour)
BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
WORKER_ALIVE_SECONDS = 60  # a worker whose sweeper wrote its beat this recently is alive
# a row that ended this long ago is settled: the transaction that ended it committed long
# since, on any host's clock (an end written later, or by a clock further behind, is missed)
SETTLE_SECONDS = 600
SUMS = 2 + len(BUCKETS)  # a histogram's columns: its count, its sum, its cumulative buckets
DEPENDENCIES = {"database": "database", "broker": "broker", "artifacts": "artifact_store"}
logger = logging.getLogger(__name__)


class DatabaseFigures(Collector):
    """Every figure of work and outcomes, read on a read-only session of `sessions` at each
    scrape, with the dependencies' state and the build; without a database only the
    dependencies and the build are answered (flipgate_dependency_up says why)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.ended = EndedFigures()

    def collect(self) -> Iterator[Metric]:
        yield build_info()
        yield dependencies_up(self.state)
        try:
            with self.state.sessions() as session:
                read_only(session)
                yield from work_figures(session, self.ended)
        except SQLAlchemyError as error:
            logger.warning("metrics: the database figures are left out (%s)",
                           type(error).__name__)


def build_info() -> Metric:
    info = GaugeMetricFamily("flipgate_build_info", "The flipgate release this process runs",
                             labels=["version"])
    info.add_metric([flipgate.__version__], 1)
    return info


def dependencies_up(state: Any) -> Metric:
    """1 for each dependency whose /readyz check passes from this API process, else 0."""
    up = GaugeMetricFamily("flipgate_dependency_up", "Whether this API process reaches the "
                           "dependency (its /readyz check)", labels=["dependency"])
    for name, outcome in health.run_checks(state).items():
        up.add_metric([DEPENDENCIES.get(name, name)], outcome["status"] == "ok")
    return up


def work_figures(session: Session, ended: "EndedFigures") -> Iterator[Metric]:
    """The jobs', decisions', callbacks' and workers' figures."""
    yield from job_figures(session, ended.jobs.read(session))
    yield from decision_figures(session, ended.decisions.read(session))
    yield from callback_figures(session)
    yield workers_alive(session)


def job_figures(session: Session, ended_jobs: dict[tuple, list[float]]) -> Iterator[Metric]:
    """`ended_jobs`: the sums of EndedFigures.jobs, by kind and state."""
    ended = CounterMetricFamily("flipgate_jobs", "Jobs that ended, by kind and final state "
                                "(shards count as jobs of their kind)", labels=["kind", "state"])
    for (kind, state), sums in ended_jobs.items():
        ended.add_metric([kind, state], sums[0])
    yield ended
    waiting = GaugeMetricFamily("flipgate_jobs_queued", "Jobs waiting to run (for a worker "
                                "or for the jobs they need), by kind", labels=["kind"])
    running = GaugeMetricFamily("flipgate_jobs_running", "Jobs running now, by kind",
                                labels=["kind"])
    open_jobs = Counter({(kind, state): count for kind, state, count in session.execute(
        select(Job.kind, Job.state, func.count()).where(
            Job.state.in_((JobState.QUEUED, JobState.RUNNING))).group_by(Job.kind, Job.state))})
    for kind in JobKind:  # every kind, 0 included: a panel or rule sees an empty queue
        waiting.add_metric([kind], open_jobs[(kind, JobState.QUEUED)])
        running.add_metric([kind], open_jobs[(kind, JobState.RUNNING)])
    yield waiting
    yield running
    by_kind: dict[tuple, list[float]] = {}
    for (kind, _), sums in ended_jobs.items():
        add_sums(by_kind, (kind,), sums[1:])
    yield histogram("flipgate_job_duration_seconds", "Run time of the jobs that ended after "
                    "running, from their last start to their end, by kind",
                    {kind: sums[:SUMS] for kind, sums in by_kind.items()}, ["kind"])
    yield histogram("flipgate_job_queue_wait_seconds", "Time from a job's creation to its "
                    "last start, of the jobs that ended after running, by kind",
                    {kind: sums[SUMS:] for kind, sums in by_kind.items()}, ["kind"])
    yield oldest_ready_job_age(session)


def oldest_ready_job_age(session: Session) -> Metric:
    """The age of the oldest queued job that waits only for a worker, counted from when the
    last job it needed ended (or its creation); 0 when none waits."""
    other = aliased(Job)
    blocked = exists().where(JobDependency.job_id == Job.id, other.id == JobDependency.waits_for_id,
                             other.state != JobState.SUCCEEDED)
    needed_until = (select(func.max(other.finished_at))
                    .join(JobDependency, JobDependency.waits_for_id == other.id)
                    .where(JobDependency.job_id == Job.id).scalar_subquery())
    ready_since = latest(session, Job.created_at, func.coalesce(needed_until, Job.created_at))
    oldest = session.scalar(select(func.min(ready_since)).where(Job.state == JobState.QUEUED,
                                                                ~blocked))
    age = GaugeMetricFamily("flipgate_oldest_queued_job_age_seconds", "Seconds the oldest "
                            "job that waits only for a worker has waited")
    age.add_metric([], 0.0 if oldest is None else max(0.0, seconds_since(session, oldest)))
    return age


def decision_figures(session: Session,
                     ended_decisions: dict[tuple, list[float]]) -> Iterator[Metric]:
    """`ended_decisions`: the sums of EndedFigures.decisions, by verdict."""
    decisions = CounterMetricFamily("flipgate_gate_decisions", "Gate decisions that became "
                                    "final, by verdict", labels=["verdict"])
    for (verdict,), sums in ended_decisions.items():
        decisions.add_metric([verdict], sums[0])
    yield decisions
    yield GaugeMetricFamily("flipgate_gate_decisions_pending", "Gate decisions waiting for "
                            "their measurements", value=session.scalar(
                                select(func.count()).where(Decision.verdict == Verdict.PENDING)))
    overall: dict[tuple, list[float]] = {}
    for sums in ended_decisions.values():
        add_sums(overall, (), sums[1:])
    yield histogram("flipgate_time_to_verdict_seconds", "Time from a gate request to its "
                    "final verdict", overall, None)


def callback_figures(session: Session) -> Iterator[Metric]:
    deliveries = CounterMetricFamily("flipgate_callback_deliveries", "Callbacks that ended: "
                                     "delivered, or failed once their attempts were spent",
                                     labels=["outcome"])
    rows = session.execute(select(Callback.state, func.count(),
                                  func.coalesce(func.sum(Callback.attempts), 0))
                           .group_by(Callback.state)).all()
    queued = counted_by_state(deliveries, [(state, count) for state, count, _ in rows],
                              CallbackState.QUEUED)
    failed_attempts = sum(attempts - (count if state == CallbackState.DELIVERED else 0)
                          for state, count, attempts in rows)
    yield deliveries
    yield CounterMetricFamily("flipgate_callback_failed_attempts", "Callback attempts that "
                              "failed (each retried until the attempts are spent)",
                              value=failed_attempts)
    yield GaugeMetricFamily("flipgate_callbacks_queued", "Callbacks waiting to be delivered",
                            value=queued)


def counted_by_state(family: CounterMetricFamily, rows: Any, open_state: str) -> int:
    """Add each (state, count) row of an ended state to `family`; the count in `open_state`
    (not yet ended: not a counter's)."""
    still_open = 0
    for state, count in rows:
        if state == open_state:
            still_open = count
        else:
            family.add_metric([state], count)
    return still_open


def workers_alive(session: Session) -> Metric:
    alive = GaugeMetricFamily("flipgate_workers_alive", "Workers seen alive in the last "
                              f"{WORKER_ALIVE_SECONDS} s, by queue they take", labels=["queue"])
    since = utcnow() - timedelta(seconds=WORKER_ALIVE_SECONDS)
    counts: dict[str, int] = {}
    for queues in session.scalars(select(WorkerBeat.queues).where(WorkerBeat.seen_at >= since)):
        for queue in queues.split(","):
            counts[queue] = counts.get(queue, 0) + 1
    for queue, count in sorted(counts.items()):
        alive.add_metric([queue], count)
    return alive


class EndedTotals:
    """Sums over rows that have ended and never change again (`statement`'s, grouped by its
    first `labels` columns, given the condition that picks the rows by `ended`, when they
    ended, the one condition: a planner then reads them through the index on `ended`): those
    that ended before a moment SETTLE_SECONDS past are read once and kept, later ones at
    each read."""

    def __init__(self, ended: Any, labels: int,
                 statement: Callable[[Session, ColumnElement[bool]], Select]) -> None:
        self.ended, self.labels, self.statement = ended, labels, statement
        self.settled: dict[tuple, list[float]] = {}
        self.until: datetime | None = None  # the rows that ended before it are settled
        self.lock = threading.Lock()

    def read(self, session: Session) -> dict[tuple, list[float]]:
        """The sums over every ended row, by the statement's labels."""
        with self.lock:
            cutoff = utcnow() - timedelta(seconds=SETTLE_SECONDS)
            if self.until is None:
                self._add(self.settled, session, self.ended < cutoff)
                self.until = cutoff
            elif cutoff > self.until:
                self._add(self.settled, session,
                          (self.ended >= self.until) & (self.ended < cutoff))
                self.until = cutoff
            totals = {labels: list(sums) for labels, sums in self.settled.items()}
            recent = self.ended >= self.until
        self._add(totals, session, recent)
        return totals

    def _add(self, totals: dict[tuple, list[float]], session: Session,
             window: ColumnElement[bool]) -> None:
        rows = session.execute(self.statement(session, window)).all()
        for row in rows:
            add_sums(totals, tuple(row[:self.labels]), list(row[self.labels:]))


class EndedFigures:
    """The sums kept over the ended jobs (by kind and state: their count and the histograms
    of their run and queue wait) and the final decisions (by verdict: their count and the
    histogram of their time to verdict)."""

    def __init__(self) -> None:
        self.jobs = EndedTotals(Job.finished_at, 2, ended_jobs)
        self.decisions = EndedTotals(Decision.decided_at, 1, final_decisions)


def ended_jobs(session: Session, window: ColumnElement[bool]) -> Select:
    """By kind and state: a job has its end time once it is final (jobs.service)."""
    run = seconds_between(session, Job.started_at, Job.finished_at)
    wait = seconds_between(session, Job.created_at, Job.started_at)
    return (select(Job.kind, Job.state, func.count(), *histogram_sums(run),
                   *histogram_sums(wait)).where(window).group_by(Job.kind, Job.state))


def final_decisions(session: Session, window: ColumnElement[bool]) -> Select:
    """By verdict: a decision has its time of decision once it is final (gate.verdicts)."""
    seconds = seconds_between(session, Decision.created_at, Decision.decided_at)
    return (select(Decision.verdict, func.count(), *histogram_sums(seconds))
            .where(window).group_by(Decision.verdict))


def histogram_sums(seconds: ColumnElement[float]) -> list[ColumnElement[Any]]:
    """The columns of a histogram of `seconds` (null: not counted), counted in the database:
    its count, its sum and its cumulative buckets."""
    return [func.sum(case((seconds.is_not(None), 1), else_=0)),
            func.coalesce(func.sum(seconds), 0.0),
            *(func.sum(case((seconds <= bound, 1), else_=0)) for bound in BUCKETS)]


def add_sums(totals: dict[tuple, list[float]], labels: tuple, sums: list[Any]) -> None:
    """Add `sums` to those of `labels` in `totals`."""
    kept = totals.setdefault(labels, [0] * len(sums))
    for index, value in enumerate(sums):
        kept[index] += value or 0


def histogram(name: str, documentation: str, sums: dict[tuple, list[float]],
              label: list[str] | None) -> Metric:
    """A histogram family from `histogram_sums` by label values (none when `label` is
    None); a label value that counted nothing is left out."""
    family = HistogramMetricFamily(name, documentation, labels=label)
    for labels, (count, total, *cumulative) in sums.items():
        if count:
            family.add_metric(list(labels), [(floatToGoString(bound), found) for bound, found
                                             in zip(BUCKETS, cumulative, strict=True)]
                              + [("+Inf", count)], float(total))
    return family


def seconds_between(session: Session, start: Any, end: Any) -> ColumnElement[float]:
    """end - start in seconds, in SQL on either backend."""
    if session.get_bind().dialect.name == "sqlite":
        return (func.julianday(end) - func.julianday(start)) * 86400.0
    return func.extract("epoch", end - start)


def latest(session: Session, *values: Any) -> ColumnElement[Any]:
    """The latest of the values, in SQL on either backend."""
    greatest: Callable[..., ColumnElement[Any]] = (
        func.max if session.get_bind().dialect.name == "sqlite" else func.greatest)
    return greatest(*values)


def seconds_since(session: Session, moment: Any) -> float:
    """Seconds from `moment` (a timestamp as the database returned it) until now."""
    if isinstance(moment, str):  # SQLite's max() of two timestamps is their text
        return session.scalar(select((func.julianday("now") - func.julianday(moment))
                                     * 86400.0))
    aware = moment if moment.tzinfo else moment.replace(tzinfo=utcnow().tzinfo)
    return (utcnow() - aware).total_seconds()
