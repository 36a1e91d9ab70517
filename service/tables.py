"""Imports every domain's ORM models, so that Base.metadata knows all tables (Alembic)."""

from service.auth.models import ApiToken
from service.compare.models import PairMetrics
from service.db import Base
from service.evalsets.models import Dataset
from service.jobs.models import Job
from service.models.models import Alias, ModelLine, ModelVersion
from service.predictions.models import Prediction

metadata = Base.metadata

__all__ = ["Alias", "ApiToken", "Dataset", "Job", "ModelLine", "ModelVersion", "PairMetrics",
           "Prediction", "metadata"]
