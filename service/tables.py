"""Imports every domain's ORM models, so that Base.metadata knows all tables (Alembic)."""

from service.audit.models import AuditEvent
from service.auth.models import ApiToken, EndedSession
from service.callbacks.models import Callback
from service.compare.models import PairCounts, PairMetrics
from service.datasets.models import Dataset
from service.db import Base
from service.gate.models import (
           Decision,
           DecisionJob,
           GatePolicy,
           Promotion,
           WebhookSecret,
)
from service.integrations.mlflow.models import MlflowEvent
from service.jobs.models import Job, JobDependency
from service.predictions.models import Prediction
from service.projects.models import Person, Project, ProjectMember
from service.registry.models import Alias, ModelLine, ModelVersion

metadata = Base.metadata

__all__ = [
           "Alias",
           "ApiToken",
           "AuditEvent",
           "Callback",
           "Dataset",
           "Decision",
           "DecisionJob",
           "EndedSession",
           "GatePolicy",
           "Job",
           "JobDependency",
           "MlflowEvent",
           "ModelLine",
           "ModelVersion",
           "PairCounts",
           "PairMetrics",
           "Person",
           "Prediction",
           "Project",
           "ProjectMember",
           "Promotion",
           "WebhookSecret",
           "metadata",
]
