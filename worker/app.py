"""The worker's Celery app: the server's Celery configuration (service.celery_app) with the
task modules of this package registered; its settings are read from FLIPGATE_* when Celery first
needs them."""

from celery import Celery

TASK_MODULES = ["worker.tasks", "worker.training", "worker.callbacks", "worker.mlflow"]

app = Celery("flipgate", include=TASK_MODULES)
app.config_from_object("worker.celeryconfig")
