"""The Celery app: Redis as broker when FLIPGATE_REDIS_URL is set, else kombu's filesystem
transport under the data directory (no server needed). Job state lives in the job rows, so
there is no result backend."""

from typing import Any

from celery import Celery

from service.config import Settings
from service.jobs.models import TASK_NAMES, JobKind

QUEUES = ("gpu", "default")
ROUTES = {TASK_NAMES[JobKind.INFERENCE]: {"queue": "gpu"},
          TASK_NAMES[JobKind.TRAIN]: {"queue": "gpu"},
          TASK_NAMES[JobKind.METRICS]: {"queue": "default"}}
TASK_MODULES = ["worker.tasks", "worker.training", "worker.callbacks"]
FILESYSTEM_POLL_SECONDS = 0.1


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for the broker of `settings`: late acks, one message per worker slot."""
    return {
        **_broker(settings),
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": "default",
        "task_routes": ROUTES,
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
    }


def _broker(settings: Settings) -> dict[str, Any]:
    """The Redis URL, or a filesystem broker whose folders are created under data_dir."""
    if settings.redis_url:
        return {"broker_url": settings.redis_url}
    root = (settings.data_dir / "broker").resolve()
    messages, processed, control = root / "messages", root / "processed", root / "control"
    for folder in (messages, processed, control):
        folder.mkdir(parents=True, exist_ok=True)
    return {"broker_url": "filesystem://", "broker_transport_options": {
        "data_folder_in": str(messages), "data_folder_out": str(messages),
        "processed_folder": str(processed), "store_processed": False,
        "control_folder": str(control), "polling_interval": FILESYSTEM_POLL_SECONDS}}


def create_celery_app(settings: Settings) -> Celery:
    """A Celery app on the broker of `settings` (the API uses one to send tasks by name)."""
    celery = Celery("flipgate", include=TASK_MODULES, set_as_current=False)
    celery.conf.update(celery_config(settings))
    return celery


app = Celery("flipgate", include=TASK_MODULES)
app.config_from_object("worker.celeryconfig")
