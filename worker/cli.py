"""`flipgate worker`, contributed to the `flipgate` command through the entry-point group
"flipgate.commands" (pyproject.toml, see flipgate/commands.py)."""

import argparse

from flipgate.commands import positive_int


def queues_taken(requested: str | None) -> str:
    """The comma-separated queues a worker takes: those requested, else every queue a task is
    routed to (service.celery_app, imported when the worker runs: celery is slow to import)."""
    from service.celery_app import QUEUES

    return requested or ",".join(QUEUES)


def run_worker(args: argparse.Namespace) -> int:
    """Run a Celery worker that takes the server's jobs from the broker, with the sweeper
    that requeues lost jobs and sends unsent ones (worker.sweeper), restarted if it dies."""
    from celery.signals import setup_logging, worker_shutting_down

    from service.config import get_settings
    from service.observability.logs import configure_logging
    from worker.app import app
    from worker.sweeper import SupervisedSweeper, start_sweeper

    log_format = get_settings().log_format
    # the worker's lines in FLIPGATE_LOG_FORMAT, with the request id of the job under way,
    # from its first line on, and in place of Celery's own logging setup
    configure_logging(log_format, "worker")
    setup_logging.connect(lambda **_: None, weak=False)
    queues = queues_taken(args.queues)
    sweeper = SupervisedSweeper(lambda: start_sweeper(queues))
    # a SIGTERM or Ctrl-C sent to the whole process group also ends the sweeper: not a death
    worker_shutting_down.connect(sweeper.stop_restarting, weak=False)
    try:
        quiet = ["--quiet"] if log_format == "json" else []  # no banner among JSON lines
        app.worker_main([*quiet, "worker", f"--queues={queues}",
                         f"--concurrency={args.concurrency}", "--loglevel=INFO"])
    finally:
        sweeper.stop()
    return 0


def add_worker_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate worker` subcommand."""
    worker = commands.add_parser(
        "worker", help="run a worker for inference, metrics, training and callback jobs",
        description="Takes jobs from $FLIPGATE_REDIS_URL, or from the folder broker in "
                    "$FLIPGATE_DATA_DIR when it is unset.")
    worker.add_argument("--queues",
                        help="comma-separated queues: gpu (inference, training), default "
                             "(metrics, matrices, MLflow), callbacks (a decision's status: "
                             "give them a worker of their own in production); default: all")
    worker.add_argument("--concurrency", type=positive_int, default=1)
    worker.set_defaults(run=run_worker)
