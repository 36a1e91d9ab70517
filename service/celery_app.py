"""The Celery side of the server: the broker configuration, queue routes and every task
name. The API sends tasks by name through `create_celery_app`; the worker package builds its
app from the same configuration and registers its tasks under these names."""

from typing import Any

from celery import Celery

from service.config import Settings

INFERENCE_TASK = "flipgate.inference"
METRICS_TASK = "flipgate.metrics"
MATRIX_TASK = "flipgate.matrix"
TRAIN_TASK = "flipgate.train"
CALLBACK_TASK = "flipgate.callback"
MLFLOW_TASK = "flipgate.mlflow"
ROUTES = {INFERENCE_TASK: {"queue": "gpu"}, TRAIN_TASK: {"queue": "gpu"},
          METRICS_TASK: {"queue": "default"}, MATRIX_TASK: {"queue": "default"},
          MLFLOW_TASK: {"queue": "default"}, CALLBACK_TASK: {"queue": "callbacks"}}
QUEUES = tuple(dict.fromkeys(route["queue"] for route in ROUTES.values()))  # every one routed to
FILESYSTEM_POLL_SECONDS = 0.1
FOLDER_TRANSPORT = "service.folder_broker:Transport"  # kombu's, with atomic writes
# a send to a broker that does not answer gives up after this (once: the job row is the
# message, and the sweeper sends what was not sent), so no request waits on the broker
BROKER_SOCKET_SECONDS = 2.0


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for the broker of `settings`: late acks, a message whose worker died is
    delivered again (the job's lease decides whether it runs: service.jobs.leases), one
    message per worker slot."""
    return {
        **_broker(settings),
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": "default",
        "task_routes": ROUTES,
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        # the worker's timer thread sleeps at most this long: stopping it waited up to 1 s
        "worker_timer_precision": 0.25,
        # a pool process that died frees its slot after this (Celery's default, 10 s, waits for
        # a result it might have sent; results are ignored here, the job row is the truth)
        "worker_lost_wait": 1.0,
    }


def _broker(settings: Settings) -> dict[str, Any]:
    """The Redis URL, or a filesystem broker whose folders are created under data_dir."""
    if settings.redis_url:  # an unacknowledged message comes back after twice a job's lease
        return {"broker_url": settings.redis_url, "task_publish_retry": False,
                "broker_connection_timeout": BROKER_SOCKET_SECONDS,
                "broker_transport_options": {
                    "visibility_timeout": 2 * settings.job_lease_seconds,
                    "socket_timeout": BROKER_SOCKET_SECONDS,
                    "socket_connect_timeout": BROKER_SOCKET_SECONDS}}
    root = (settings.data_dir / "broker").resolve()
    messages, processed, control = root / "messages", root / "processed", root / "control"
    for folder in (messages, processed, control):
        folder.mkdir(parents=True, exist_ok=True)
    return {"broker_url": "filesystem://", "broker_transport": FOLDER_TRANSPORT,
            "broker_transport_options": {
                "data_folder_in": str(messages), "data_folder_out": str(messages),
                "processed_folder": str(processed), "store_processed": False,
                "control_folder": str(control), "polling_interval": FILESYSTEM_POLL_SECONDS}}


def create_celery_app(settings: Settings, include: list[str] | None = None) -> Celery:
    """A Celery app on the broker of `settings`; the API uses one to send tasks by name, the
    worker passes the modules that register the tasks in `include`."""
    celery = Celery("flipgate", include=include or [], set_as_current=False)
    celery.conf.update(celery_config(settings))
    return celery
