"""The server's subcommands of `flipgate`: migrate, serve, token, project and store.

They reach the `flipgate` command through the entry-point group "flipgate.commands"
(pyproject.toml, see flipgate/commands.py); the worker package contributes `flipgate worker`
the same way. The server's modules are imported when a command runs, not when it is parsed.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from flipgate.commands import Parser, comma_list, positive_int
from flipgate.errors import InputError
from flipgate.processes import stop_process

if TYPE_CHECKING:
    import uvicorn
    from sqlalchemy.orm import Session


def run_migrate(args: argparse.Namespace) -> int:
    """Create or upgrade the server's database to the newest schema (or move it to the
    revision --to names) and print its revision."""
    from alembic.util import CommandError

    from service.config import get_settings
    from service.migrate import MigrationRefused, migrate_to

    settings = get_settings()
    try:
        revision = migrate_to(settings, args.to, merge_projects=args.merge_projects)
    except MigrationRefused as error:
        raise InputError(error.code, error.message) from error
    except CommandError as error:  # no such revision
        raise InputError("invalid_revision", str(error)) from error
    print(f"{settings.safe_database_url}: at revision {revision}")
    return 0


STARTUP_FAILURE = 3  # uvicorn's exit code when it could not start serving (a port in use)
APP_FACTORY = "service.main:serve_app"  # what each API process serves
METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # the API processes' request figures (one host)
# memory-backed where there is one: the figures are memory-mapped files, and a write to a page
# that a disk is writing back waits for it (a request's tail latency)
MEMORY_FOLDER = "/dev/shm"


def run_serve(args: argparse.Namespace) -> int:
    """Serve the API with uvicorn in --workers processes on one port, with a worker
    subprocess unless --api-only; SIGTERM stops them all within about
    FLIPGATE_SHUTDOWN_GRACE_SECONDS, whatever their clients do (the worker's own shutdown runs
    meanwhile)."""
    from service.config import get_settings

    settings = get_settings()  # refused settings leave no metrics folder behind
    own_metrics_dir = prepare_metrics_dir()  # before anything imports prometheus_client
    import uvicorn

    from service.integrations.mlflow.service import report_link_note
    from service.migrate import upgrade
    from service.observability.logs import configure_logging

    if note := report_link_note(settings):
        print(f"flipgate serve: {note}", file=sys.stderr)
    configure_logging(settings.log_format, "api")
    if not os.environ.get("FLIPGATE_DATABASE_URL"):  # embedded mode: its own SQLite file
        upgrade(settings)
    worker = None if args.api_only else start_worker()
    config = uvicorn.Config(APP_FACTORY, factory=True, host=args.host, port=args.port,
                            workers=args.workers, log_config=None, access_log=False,
                            timeout_graceful_shutdown=settings.shutdown_grace_seconds)
    try:
        started = (serve_one(config, worker) if args.workers == 1
                   else serve_several(config, worker))
    finally:
        if worker is not None:
            stop_process(worker)
        if own_metrics_dir is not None:
            shutil.rmtree(own_metrics_dir, ignore_errors=True)
    return 0 if started else STARTUP_FAILURE


def prepare_metrics_dir() -> Path | None:
    """Empty PROMETHEUS_MULTIPROC_DIR (figures of an earlier run must not be summed with this
    one's), or make a temporary one (in MEMORY_FOLDER when it can) and name it there; the
    folder to remove at exit, if it is this run's own."""
    named = os.environ.get(METRICS_DIR)
    if named:
        folder = Path(named)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.db"):
            stale.unlink()
        return None
    memory = MEMORY_FOLDER if os.access(MEMORY_FOLDER, os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="flipgate-metrics-", dir=memory))
    os.environ[METRICS_DIR] = str(folder)
    return folder


def start_worker() -> subprocess.Popen:
    """`flipgate worker` on every queue (its default), as a subprocess (it counts no
    request)."""
    env = {name: value for name, value in os.environ.items() if name != METRICS_DIR}
    return subprocess.Popen([sys.executable, "-m", "flipgate.cli", "worker"], env=env)


def serve_one(config: "uvicorn.Config", worker: subprocess.Popen | None) -> bool:
    """Serve in this process; whether it started serving."""
    import uvicorn

    server = uvicorn.Server(config)
    if worker is not None:
        server.handle_exit = stopping_first(worker, server.handle_exit)
    # uvicorn re-raises SIGTERM after its graceful shutdown: exit normally so `finally` runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with suppress(KeyboardInterrupt):  # likewise Ctrl-C
        server.run()
    return server.started


def serve_several(config: "uvicorn.Config", worker: subprocess.Popen | None) -> bool:
    """Serve in config.workers processes that share one listening socket (uvicorn's
    supervisor restarts one that dies); whether they started serving."""
    from uvicorn.supervisors import Multiprocess

    class ApiProcesses(Multiprocess):
        """On SIGTERM or SIGINT the worker is told first, then every API process."""

        def handle_term(self) -> None:
            stop_asking(worker)
            super().handle_term()

        def handle_int(self) -> None:
            stop_asking(worker)
            super().handle_int()

    shared = listening_socket(config.host, config.port)
    if shared is None:
        return False
    processes = ApiProcesses(config, sockets=[shared])
    processes.run()
    return all(process.exitcode != STARTUP_FAILURE for process in processes.processes)


def listening_socket(host: str, port: int) -> socket.socket | None:
    """The socket the API processes share, bound to `host`:`port` and made with protocol
    IPPROTO_TCP, so that asyncio turns TCP_NODELAY on for every connection it accepts (it does
    so only for sockets that say they are TCP; uvicorn's own has protocol 0, and each
    keep-alive response would wait about 40 ms for the client's delayed ACK: uvicorn #3149);
    None when it cannot be bound (said on stderr)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        print(f"flipgate serve: cannot listen on {host}:{port}: {error}", file=sys.stderr)
        return None
    listener.set_inheritable(True)
    return listener


def stop_asking(worker: subprocess.Popen | None) -> None:
    """SIGTERM to the worker, if it still runs: its shutdown runs meanwhile."""
    if worker is not None and worker.poll() is None:
        worker.terminate()


def stopping_first(worker: subprocess.Popen,
                   handle_exit: Callable[[int, FrameType | None], None]) -> Callable[
                       [int, FrameType | None], None]:
    """uvicorn's signal handler, preceded by a SIGTERM to the worker: its shutdown then runs
    while the API finishes its open requests, not after them."""

    def handle(sig: int, frame: FrameType | None) -> None:
        stop_asking(worker)
        handle_exit(sig, frame)

    return handle


@contextmanager
def token_session() -> Iterator["Session"]:
    """A committing session on the server's database; service refusals become InputError."""
    from service.config import get_settings
    from service.db import settings_session
    from service.errors import ServiceError

    try:
        with settings_session(get_settings()) as session:
            yield session
    except ServiceError as error:
        raise InputError(error.code, error.message) from error


def run_token_create(args: argparse.Namespace) -> int:
    """Mint an API token in the server's database and print its plaintext, shown only once
    (written to the audit trail)."""
    from service import urls
    from service.audit.service import record_cli
    from service.auth.service import create_token

    expires_in = None if args.expires_in is None else timedelta(days=args.expires_in)
    with token_session() as session:
        row, token = create_token(session=session, name=args.name, scopes=args.scopes,
                                  project=_token_project(args), expires_in=expires_in)
        record_cli(session, action="token_create", resource=urls.token(row.name),
                   project_id=row.project_id, details={"scopes": row.scopes})
        expiry = "" if row.expires_at is None else f", expires {row.expires_at:%Y-%m-%d %H:%M} UTC"
    print(token)
    print(f"token {row.name!r} with scopes {','.join(row.scopes)}{expiry}; it is not shown again",
          file=sys.stderr)
    return 0


def run_token_revoke(args: argparse.Namespace) -> int:
    """Stop a stored token from authenticating (its row stays for the audit trail, which
    records the revocation)."""
    from service import urls
    from service.audit.service import record_cli
    from service.auth.service import revoke_token

    with token_session() as session:
        row = revoke_token(session=session, name=args.name, project=_token_project(args))
        record_cli(session, action="token_revoke", resource=urls.token(row.name),
                   project_id=row.project_id)
    print(f"token {args.name!r} is revoked", file=sys.stderr)
    return 0


def run_project_create(args: argparse.Namespace) -> int:
    """Create an empty project in the server's database (written to the audit trail)."""
    from service.audit.service import record_cli
    from service.projects.service import create_project

    with token_session() as session:
        project = create_project(session=session, name=args.name)
        record_cli(session, action="project_create", resource=f"/projects/{project.name}",
                   project_id=project.id)
    print(f"project {args.name!r} is created; mint its tokens with `flipgate token create "
          f"--project {args.name}`", file=sys.stderr)
    return 0


def _token_project(args: argparse.Namespace) -> str | None:
    """The project --project names; None with --server-level."""
    return None if args.server_level else args.project


def run_store_check(args: argparse.Namespace) -> int:
    """Print the artifacts no row references, the rows whose artifact is missing and the
    unfinished uploads; exit 1 when there is either of the first two, or an upload abandoned
    (begun more than FLIPGATE_STAGING_IDLE_MINUTES ago: the sweep's to remove)."""
    from service.config import get_settings
    from service.housekeeping import check_store
    from service.storage import open_store

    settings = get_settings()
    with token_session() as session:
        report = check_store(session=session, store=open_store(settings))
    for sha256 in report.unreferenced:
        print(f"unreferenced artifact {sha256}")
    for sha256 in report.missing:
        print(f"missing artifact {sha256} (a row references it)")
    now, idle_seconds = time.time(), settings.staging_idle_minutes * 60
    for name, began in report.unfinished:
        print(f"unfinished upload: {name}, begun {(now - began) / 60:.0f} minutes ago")
    abandoned = sum(now - began > idle_seconds for _, began in report.unfinished)
    print(f"{len(report.unreferenced)} unreferenced, {len(report.missing)} missing, "
          f"{len(report.unfinished)} unfinished uploads ({abandoned} begun over "
          f"{settings.staging_idle_minutes:g} minutes ago)", file=sys.stderr)
    return 1 if report.unreferenced or report.missing or abandoned else 0


def run_store_gc(args: argparse.Namespace) -> int:
    """Delete the unreferenced artifacts older than --min-age-minutes and print them; the
    uploads abandoned that long ago (staging files; in a bucket, staging objects and
    incomplete multipart uploads) go too."""
    from service.config import get_settings
    from service.housekeeping import collect_garbage
    from service.storage import open_store

    store, min_age_seconds = open_store(get_settings()), args.min_age_minutes * 60
    with token_session() as session:
        removed = collect_garbage(session=session, store=store,
                                  min_age_seconds=min_age_seconds)
    for sha256 in removed:
        print(f"removed {sha256}")
    partial = store.sweep_partial(min_age_seconds)
    print(f"{len(removed)} unreferenced artifacts removed, {len(partial)} abandoned uploads",
          file=sys.stderr)
    return 0


def run_store_migrate(args: argparse.Namespace) -> int:
    """Copy the configured store's artifacts into the bucket --to; exit 1 if an artifact's
    bytes do not match its address (those are listed, the others copied)."""
    from flipgate.progress import progress_bars
    from service.config import get_settings
    from service.housekeeping import migrate_store
    from service.storage import open_store

    settings = get_settings()
    try:
        target = open_store(settings.model_copy(update={"artifact_store": args.to}))
    except ValueError as error:
        raise InputError("invalid_store", str(error)) from error
    with progress_bars() as bar:
        report = migrate_store(source=open_store(settings), target=target,
                               progress=bar("copying artifacts"))
    for sha256 in report.corrupt:
        print(f"corrupt artifact {sha256} (its bytes do not match its address; not copied)")
    print(f"{len(report.copied)} copied, {len(report.present)} already there, "
          f"{len(report.corrupt)} corrupt", file=sys.stderr)
    return 1 if report.corrupt else 0


def add_migrate_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate migrate` subcommand."""
    migrate = commands.add_parser(
        "migrate", help="create or upgrade the server's database to the newest schema",
        description="Applies the Alembic migrations to $FLIPGATE_DATABASE_URL (default: the "
                    "SQLite file flipgate.db in $FLIPGATE_DATA_DIR or ./flipgate-data).")
    migrate.add_argument("--to", default="head", metavar="REVISION",
                         help="upgrade or downgrade to this revision (default: the newest)")
    migrate.add_argument("--merge-projects", action="store_true",
                         help="let a downgrade below 0017_projects merge every project into "
                              "the one namespace of older releases, where every token acts on "
                              "every project's lines and data sets (refused without it)")
    migrate.set_defaults(run=run_migrate)


def add_serve_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate serve` subcommand."""
    serve = commands.add_parser(
        "serve", help="serve the HTTP API, with a worker unless --api-only",
        description="With no FLIPGATE_DATABASE_URL the database is the SQLite file in "
                    "$FLIPGATE_DATA_DIR (migrated here) and the broker a folder beside it; "
                    "otherwise run `flipgate migrate` first.")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=positive_int, default=8000)
    serve.add_argument("--api-only", action="store_true",
                       help="start no worker (run `flipgate worker` elsewhere)")
    serve.add_argument("--workers", type=positive_int, default=1, metavar="N",
                       help="API processes on the one port (default 1); each admits its own "
                            "few requests at once, and they share one worker")
    serve.set_defaults(run=run_serve)


TOKEN_STORE = ("The token's hash is kept in the server's database ($FLIPGATE_DATABASE_URL or "
               "flipgate.db in $FLIPGATE_DATA_DIR).")


def add_token_project(parser: argparse.ArgumentParser) -> None:
    """--project P (default `default`) or --server-level: where a token is bound."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--project", default="default",
                       help="the project the token is bound to (default: default)")
    where.add_argument("--server-level", action="store_true",
                       help="bound to no project: the scopes admin (the server admin) or "
                            "metrics only")


def add_token_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate token` subcommand: create and revoke."""
    token = commands.add_parser("token", help="manage the server's API tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True,
                                          parser_class=Parser)
    create = token_commands.add_parser(
        "create", help="mint a bearer token and print it (only this once)",
        description=TOKEN_STORE)
    create.add_argument("--name", required=True, help="a unique name, e.g. ci")
    create.add_argument("--scopes", required=True, type=comma_list, metavar="read,write",
                        help="comma-separated scopes: read, write, gate, admin, metrics "
                             "(GET /metrics only)")
    add_token_project(create)
    create.add_argument("--expires-in", type=positive_int, metavar="DAYS",
                        help="the token stops authenticating after this many days "
                             "(default: never)")
    create.set_defaults(run=run_token_create)
    revoke = token_commands.add_parser(
        "revoke", help="stop a token from authenticating, at once and for good",
        description=TOKEN_STORE)
    revoke.add_argument("name", metavar="NAME", help="the name the token was created with")
    add_token_project(revoke)
    revoke.set_defaults(run=run_token_revoke)


def add_project_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate project` subcommand: create."""
    project = commands.add_parser("project", help="manage the server's projects")
    project_commands = project.add_subparsers(dest="project_command", required=True,
                                              parser_class=Parser)
    create = project_commands.add_parser(
        "create", help="create an empty project (lines, data sets and tokens are per project)",
        description="The project is kept in the server's database ($FLIPGATE_DATABASE_URL or "
                    "flipgate.db in $FLIPGATE_DATA_DIR).")
    create.add_argument("name", metavar="NAME", help="letters, digits and . _ -")
    create.set_defaults(run=run_project_create)


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def add_store_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate store` subcommand: check, gc and migrate."""
    store = commands.add_parser("store", help="check or clean the server's artifact store")
    store_commands = store.add_subparsers(dest="store_command", required=True,
                                          parser_class=Parser)
    where = ("The artifacts in the store ($FLIPGATE_ARTIFACT_STORE, default "
             "$FLIPGATE_DATA_DIR/artifacts) against the rows of "
             "$FLIPGATE_DATABASE_URL.")
    check = store_commands.add_parser(
        "check", help="list unreferenced artifacts, rows without theirs and unfinished "
                      "uploads (exit 1 if any but an upload begun in the idle period)",
        description=where)
    check.set_defaults(run=run_store_check)
    gc = store_commands.add_parser(
        "gc", help="delete the artifacts no row references (never a referenced one)",
        description=where)
    gc.add_argument("--min-age-minutes", type=non_negative_float, default=60.0,
                    help="keep younger artifacts: a registration may not have committed its "
                         "row yet (default 60)")
    gc.set_defaults(run=run_store_gc)
    migrate = store_commands.add_parser(
        "migrate", help="copy the store's artifacts into a bucket (resumable)",
        description="Copies every artifact of the store ($FLIPGATE_ARTIFACT_STORE, default "
                    "$FLIPGATE_DATA_DIR/artifacts) that the bucket lacks, each verified "
                    "against its digest, into the S3 store --to (credentials and endpoint "
                    "from the standard AWS chain). Run it again to resume; then set "
                    "FLIPGATE_ARTIFACT_STORE to the same URL.")
    migrate.add_argument("--to", required=True, metavar="s3://BUCKET[/PREFIX]",
                         help="the artifact store to copy into")
    migrate.set_defaults(run=run_store_migrate)
