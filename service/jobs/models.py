"""ORM models of a background job and of the jobs it waits for."""

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import CheckConstraint, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.celery_app import INFERENCE_TASK, MATRIX_TASK, METRICS_TASK, MLFLOW_TASK, TRAIN_TASK
from service.db import Base, Record, str_enum
from service.projects.models import ProjectOwned

REQUEST_ID_LENGTH = 128
TRACEPARENT_LENGTH = 55
WORKER_NAME_LENGTH = 200


class JobKind(StrEnum):
    INFERENCE = "inference"
    METRICS = "metrics"
    MATRIX = "matrix"
    TRAIN = "train"
    MLFLOW = "mlflow"  # the MLflow connector's work (worker.mlflow)


JOB_TASKS = {JobKind.INFERENCE: INFERENCE_TASK, JobKind.METRICS: METRICS_TASK,
             JobKind.MATRIX: MATRIX_TASK, JobKind.TRAIN: TRAIN_TASK,
             JobKind.MLFLOW: MLFLOW_TASK}  # the Celery task that runs each kind of job


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Job(ProjectOwned, Record, Base):
    """A unit of work for a worker; shards of a large job point at it as their parent.

    The row is the message (service.jobs.leases): a queued job is sent until the broker has
    accepted it, and a running job is a lease its worker renews (heartbeat_at)."""

    __tablename__ = "jobs"
    __table_args__ = (CheckConstraint("progress >= 0 AND progress <= 1", name="progress"),)

    kind: Mapped[JobKind] = mapped_column(str_enum(JobKind, "job_kind"))
    state: Mapped[JobState] = mapped_column(str_enum(JobState, "job_state"),
                                            default=JobState.QUEUED, index=True)
    progress: Mapped[float] = mapped_column(default=0.0)
    params: Mapped[dict[str, Any]]
    result: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    started_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(default=0, server_default="0")  # times claimed
    heartbeat_at: Mapped[datetime | None]  # renewed by the worker while the job runs
    sent_at: Mapped[datetime | None]  # when the broker last accepted the job's message
    finished_at: Mapped[datetime | None] = mapped_column(index=True)  # GET /metrics
    # the request that queued the job (X-Request-ID) and its trace context (W3C traceparent,
    # with the otel extra): the worker's log lines and spans for the job carry them
    request_id: Mapped[str | None] = mapped_column(String(REQUEST_ID_LENGTH))
    traceparent: Mapped[str | None] = mapped_column(String(TRACEPARENT_LENGTH))

    parent: Mapped["Job | None"] = relationship(remote_side="Job.id", lazy="raise")


class JobDependency(Base):
    """`job_id` is sent to the workers only once `waits_for_id` has succeeded, and is
    cancelled if that one fails or is cancelled (service.jobs.enqueue, service.flows)."""

    __tablename__ = "job_dependencies"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    waits_for_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True,
                                              index=True)


class WorkerBeat(Base):
    """A `flipgate worker` seen alive: its sweeper writes `seen_at` every few seconds."""

    __tablename__ = "worker_beats"

    name: Mapped[str] = mapped_column(String(WORKER_NAME_LENGTH), primary_key=True)
    queues: Mapped[str] = mapped_column(String(WORKER_NAME_LENGTH))  # comma-separated
    seen_at: Mapped[datetime]
