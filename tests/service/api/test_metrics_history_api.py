"""GET /metrics over a history that grows between scrapes, on SQLite and PostgreSQL: the jobs
that ended long ago are read once and kept, those since at each scrape
(service.metrics.collector.EndedTotals), and every ended job is counted once, before and
after it settles (benchmarks/metrics_scrape_bench.py measures what a scrape costs)."""

import time
from datetime import timedelta

import pytest

from service.db import utcnow
from service.jobs.models import Job, JobKind, JobState
from service.metrics import collector
from tests.service.api.test_observability_api import figures

pytestmark = pytest.mark.both_backends  # the collector's SQL has a branch per dialect

SUCCEEDED = ("flipgate_jobs_total", frozenset({("kind", "inference"), ("state", "succeeded")}))
RUNS = ("flipgate_job_duration_seconds_sum", frozenset({("kind", "inference")}))


def ended_job(db, ended_ago: float, run: float) -> None:
    """A succeeded inference job that ran `run` seconds and ended `ended_ago` seconds ago."""
    finished = utcnow() - timedelta(seconds=ended_ago)
    with db() as session:
        session.add(Job(kind=JobKind.INFERENCE, state=JobState.SUCCEEDED, params={},
                        created_at=finished - timedelta(seconds=run + 1),
                        started_at=finished - timedelta(seconds=run), finished_at=finished))


def test_every_ended_job_is_counted_once_before_and_after_it_settles(client, db, monkeypatch):
    monkeypatch.setattr(collector, "SETTLE_SECONDS", 1.0)
    ended_job(db, ended_ago=3600, run=10)  # settled at the first scrape
    ended_job(db, ended_ago=0, run=20)  # read at each scrape until it settles
    first = figures(client)
    assert (first[SUCCEEDED], first[RUNS]) == (2, pytest.approx(30, abs=0.01))
    ended_job(db, ended_ago=0, run=40)
    second = figures(client)
    assert (second[SUCCEEDED], second[RUNS]) == (3, pytest.approx(70, abs=0.01))
    time.sleep(1.5)  # both recent jobs settle: read once more, then kept
    for _ in range(2):
        settled = figures(client)
        assert (settled[SUCCEEDED], settled[RUNS]) == (3, pytest.approx(70, abs=0.01))
    assert settled[("flipgate_job_duration_seconds_count",
                    frozenset({("kind", "inference")}))] == 3
