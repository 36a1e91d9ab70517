"""Jobs and the states they move through."""

from datetime import timedelta

import pytest

from service import flows
from service.celery_app import create_celery_app
from service.config import Settings
from service.db import utcnow
from service.errors import Conflict, InvalidInput
from service.jobs.enqueue import create_job, send_unsent
from service.jobs.leases import lost_jobs, renew
from service.jobs.models import JobKind, JobState
from service.jobs.schemas import JobRead
from service.jobs.service import (
    claim_job,
    dependencies,
    get_job,
    mark_finished,
    set_progress,
    start_job,
)


def test_a_job_runs_and_succeeds(session):
    job = create_job(session=session, kind=JobKind.INFERENCE, params={"version_id": 1})
    assert (job.state, job.progress) == (JobState.QUEUED, 0.0)
    start_job(session=session, job=job)
    set_progress(session=session, job=job, progress=0.5)
    mark_finished(session=session, job=job, state=JobState.SUCCEEDED, result={"rows": 3})
    read = JobRead.model_validate(get_job(session=session, job_id=job.id))
    assert (read.state, read.progress, read.result) == ("succeeded", 1.0, {"rows": 3})
    assert read.started_at <= read.finished_at


def test_shards_point_at_their_parent(session):
    parent = create_job(session=session, kind=JobKind.INFERENCE, params={})
    shard = create_job(session=session, kind=JobKind.INFERENCE, params={"shard": 0},
                       parent=parent)
    assert shard.parent_id == parent.id


def test_failures_keep_their_error(session):
    job = start_job(session=session, job=create_job(session=session, kind=JobKind.TRAIN,
                                                    params={}))
    mark_finished(session=session, job=job, state=JobState.FAILED, error="CUDA out of memory")
    assert (job.state, job.error) == (JobState.FAILED, "CUDA out of memory")


def test_impossible_moves_are_refused(session):
    job = create_job(session=session, kind=JobKind.METRICS, params={})
    with pytest.raises(Conflict):
        mark_finished(session=session, job=job, state=JobState.SUCCEEDED)
    with pytest.raises(Conflict):
        set_progress(session=session, job=job, progress=0.1)
    with pytest.raises(InvalidInput):
        mark_finished(session=session, job=job, state=JobState.RUNNING)
    mark_finished(session=session, job=job, state=JobState.CANCELLED)
    with pytest.raises(Conflict):
        start_job(session=session, job=job)


def test_progress_lies_between_zero_and_one(session):
    job = start_job(session=session, job=create_job(session=session, kind=JobKind.METRICS,
                                                    params={}))
    with pytest.raises(InvalidInput):
        set_progress(session=session, job=job, progress=1.5)


def test_a_job_waits_for_its_dependencies_and_one_that_failed_cancels_it(session):
    failed = start_job(session=session, job=create_job(session=session, kind=JobKind.INFERENCE,
                                                       params={"version_id": 1}))
    running = start_job(session=session, job=create_job(session=session,
                                                        kind=JobKind.INFERENCE, params={}))
    waiting = create_job(session=session, kind=JobKind.METRICS, params={},
                         waits_for=[failed, running])
    assert waiting.state == JobState.QUEUED
    assert [job.id for job in dependencies(session=session, job=waiting)] == [failed.id,
                                                                              running.id]
    mark_finished(session=session, job=failed, state=JobState.FAILED, error="out of memory")
    assert (waiting.state, waiting.error) == (JobState.CANCELLED,
                                              f"job {failed.id}, which it waited for, failed: "
                                              "out of memory")
    late = create_job(session=session, kind=JobKind.METRICS, params={}, waits_for=[failed])
    assert (late.state, late.error) == (JobState.CANCELLED,
                                        f"job {failed.id}, which it waited for, failed")


def age(job, **delta) -> None:
    """Make a job's heartbeat and last send look `delta` old."""
    job.heartbeat_at = job.sent_at = utcnow() - timedelta(**delta)


def test_a_job_is_claimed_once_and_renews_its_lease_while_it_runs(session):
    job = create_job(session=session, kind=JobKind.INFERENCE, params={})
    claimed = claim_job(session=session, job_id=job.id)
    assert (claimed.state, claimed.attempts) == (JobState.RUNNING, 1)
    assert claim_job(session=session, job_id=job.id) is None  # a message delivered twice
    age(job, seconds=60)
    assert renew(session=session, job_id=job.id)
    session.refresh(job)
    assert utcnow() - job.heartbeat_at < timedelta(seconds=5)
    mark_finished(session=session, job=job, state=JobState.SUCCEEDED)
    assert not renew(session=session, job_id=job.id)


def test_a_lost_job_is_queued_again_then_fails_after_its_attempts(session):
    job = create_job(session=session, kind=JobKind.INFERENCE, params={})
    fresh = claim_job(session=session, job_id=create_job(
        session=session, kind=JobKind.INFERENCE, params={"other": 1}).id)
    claim_job(session=session, job_id=job.id)
    age(job, seconds=60)
    assert flows.reap_lost_jobs(session=session, settings=Settings(), lease_seconds=30,
                               max_attempts=2) == [job]
    assert (job.state, job.attempts, job.sent_at, fresh.state) == (
        JobState.QUEUED, 1, None, JobState.RUNNING)
    claim_job(session=session, job_id=job.id)
    age(job, seconds=60)
    flows.reap_lost_jobs(session=session, settings=Settings(), lease_seconds=30, max_attempts=2)
    assert (job.state, job.error) == (JobState.FAILED,
                                      "worker_lost: no heartbeat for 30 s, 2 attempts made")


def test_a_job_split_into_shards_is_not_lost_while_its_shards_run(session):
    parent = claim_job(session=session, job_id=create_job(
        session=session, kind=JobKind.INFERENCE, params={}).id)
    create_job(session=session, kind=JobKind.INFERENCE, params={"start": 0}, parent=parent)
    age(parent, seconds=60)
    assert lost_jobs(session=session, lease_seconds=30) == []


def test_ready_jobs_the_broker_has_not_accepted_are_sent(session, tmp_path):
    celery = create_celery_app(Settings(data_dir=tmp_path))
    messages = tmp_path / "broker" / "messages"
    ready = create_job(session=session, kind=JobKind.METRICS, params={"ready": 1})
    running = claim_job(session=session, job_id=create_job(
        session=session, kind=JobKind.INFERENCE, params={}).id)
    waiting = create_job(session=session, kind=JobKind.METRICS, params={}, waits_for=[running])
    assert send_unsent(session=session, celery=celery, resend_seconds=60) == [ready.id]
    assert len(list(messages.iterdir())) == 1 and ready.sent_at is not None
    assert send_unsent(session=session, celery=celery, resend_seconds=60) == []
    age(ready, seconds=120)  # accepted long ago and still queued: the broker lost it
    assert send_unsent(session=session, celery=celery, resend_seconds=60) == [ready.id]
    mark_finished(session=session, job=running, state=JobState.SUCCEEDED)
    assert send_unsent(session=session, celery=celery, resend_seconds=60) == [waiting.id]
    assert len(list(messages.iterdir())) == 3
