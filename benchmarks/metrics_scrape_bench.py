"""What a `GET /metrics` scrape costs at a long history (issue 43): a SQLite and a PostgreSQL
store (127.0.0.1:5432, database `test`, a schema of its own, dropped afterwards) filled with
100,000 ended and open jobs and 10,000 gate decisions by bulk inserts, then the collector's
scrape timed (the whole registry, as `GET /metrics` renders it: the dependencies' checks and
every figure read from the rows) and the database's figures alone.

    python benchmarks/metrics_scrape_bench.py [--jobs 100000] [--decisions 10000]

Printed per backend: the first scrape of a process (which reads the settled history once,
service.metrics.collector.EndedTotals), then p50 and max of the scrapes after it, and of the
database's figures alone; the goal: every scrape after the first <= 250 ms.
"""

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import generate_latest
from sqlalchemy import insert

from service.config import Settings
from service.db import read_only, settings_session, utcnow
from service.gate.models import Decision, Verdict
from service.jobs.models import Job, JobKind, JobState
from service.main import create_app
from service.metrics.collector import EndedFigures, work_figures
from service.migrate import upgrade
from service.projects.models import DEFAULT_PROJECT
from service.projects.service import get_project
from service.registry.models import ModelLine, ModelVersion
from tests.service.conftest import postgres_schema  # the suite's: a schema of its own

GOAL_MS = 250
SCRAPES = 20
BATCH = 5000
# a long-lived server's mix: nearly every job ended, a few queued or running
STATES = [JobState.SUCCEEDED] * 90 + [JobState.FAILED] * 5 + [JobState.CANCELLED] * 2 + [
    JobState.QUEUED] * 2 + [JobState.RUNNING]
VERDICTS = [Verdict.APPROVE] * 7 + [Verdict.BLOCK] * 2 + [Verdict.PENDING]


def job_rows(project_id: int, count: int) -> Iterator[dict]:
    """`count` jobs of every kind, created over the last weeks, mostly ended."""
    kinds, now = list(JobKind), utcnow()
    for index in range(count):
        state = STATES[index % len(STATES)]
        created = now - timedelta(seconds=30 * (count - index))
        started = None if state == JobState.QUEUED else created + timedelta(seconds=index % 7)
        ended = state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
        yield {"project_id": project_id, "kind": kinds[index % len(kinds)], "state": state,
               "progress": 1.0 if ended else 0.0, "params": {}, "created_at": created,
               "started_at": started, "attempts": 1,
               "finished_at": started + timedelta(seconds=index % 300) if ended else None}


def decision_rows(project_id: int, line_id: int, versions: tuple[int, int],
                  count: int) -> Iterator[dict]:
    now = utcnow()
    for index in range(count):
        verdict = VERDICTS[index % len(VERDICTS)]
        created = now - timedelta(seconds=300 * (count - index))
        yield {"project_id": project_id, "line_id": line_id, "candidate_id": versions[1],
               "baseline_id": versions[0], "verdict": verdict, "reasons": [], "metrics": {},
               "evalsets": ["eval"], "policy": {}, "requested_by": "bench",
               "request_sha256": f"{index:064x}", "base_url": "http://127.0.0.1",
               "delivery_id": f"delivery-{index}", "created_at": created,
               "decided_at": None if verdict == Verdict.PENDING
               else created + timedelta(seconds=index % 900)}


def fill(settings: Settings, jobs: int, decisions: int) -> float:
    """Migrate the database and bulk-insert the history; the seconds it took."""
    started = time.perf_counter()
    upgrade(settings)
    with settings_session(settings) as session:
        project_id = get_project(session=session, name=DEFAULT_PROJECT).id
        line = ModelLine(project_id=project_id, name="bench", num_classes=10)
        session.add(line)
        session.flush()
        versions = [ModelVersion(line=line, version=str(number), num_classes=10)
                    for number in (1, 2)]
        session.add_all(versions)
        session.flush()
        batches = [(Job, job_rows(project_id, jobs)),
                   (Decision, decision_rows(project_id, line.id,
                                            (versions[0].id, versions[1].id), decisions))]
        for model, rows in batches:
            for batch in batched(rows):
                session.execute(insert(model), batch)
    return time.perf_counter() - started


def batched(rows: Iterator[dict]) -> Iterator[list[dict]]:
    batch = []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def scrape_times(settings: Settings) -> tuple[float, list[float], list[float]]:
    """Milliseconds of a process's first scrape (it reads the settled history once), of
    each later whole scrape, and of the database's figures alone."""
    app = create_app(settings)
    registry, sessions, ended = app.state.metrics, app.state.sessions, EndedFigures()
    started = time.perf_counter()
    text_format = generate_latest(registry).decode()
    first = (time.perf_counter() - started) * 1000
    assert 'flipgate_jobs_total{kind="inference",state="succeeded"}' in text_format
    with sessions() as session:
        list(work_figures(session, ended))
    whole, figures = [], []
    for _ in range(SCRAPES):
        started = time.perf_counter()
        generate_latest(registry)
        whole.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        with sessions() as session:
            read_only(session)
            list(work_figures(session, ended))
        figures.append((time.perf_counter() - started) * 1000)
    app.state.engine.dispose()
    return first, whole, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--decisions", type=int, default=10_000)
    args = parser.parse_args()
    print(f"GET /metrics at {args.jobs} jobs and {args.decisions} decisions, "
          f"{SCRAPES} scrapes each (goal <= {GOAL_MS} ms)")
    print(f"{'backend':<12} {'fill s':>7} {'first ms':>9} {'p50 ms':>8} {'max ms':>8} "
          f"{'rows p50 ms':>12}")
    within = True
    with tempfile.TemporaryDirectory() as folder, postgres_schema() as postgres_url:
        backends = {"sqlite": "", "postgresql": postgres_url}
        for name, url in backends.items():
            settings = Settings(data_dir=Path(folder) / name, database_url=url,
                                admin_token="metrics-scrape-bench-token-0123456")
            filled = fill(settings, args.jobs, args.decisions)
            first, whole, figures = scrape_times(settings)
            p50 = statistics.median(whole)
            within &= max(whole) <= GOAL_MS
            print(f"{name:<12} {filled:>7.1f} {first:>9.1f} {p50:>8.1f} {max(whole):>8.1f} "
                  f"{statistics.median(figures):>12.1f}")
    print("within the goal" if within else "OVER the goal")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
