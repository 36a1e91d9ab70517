"""Jobs and the states they move through."""

import pytest

from service.errors import Conflict, InvalidInput
from service.jobs.enqueue import create_job
from service.jobs.models import JobKind, JobState
from service.jobs.schemas import JobRead
from service.jobs.service import (
    dependencies,
    finish_job,
    get_job,
    set_progress,
    start_job,
)


def test_a_job_runs_and_succeeds(session):
    job = create_job(session=session, kind=JobKind.INFERENCE, params={"version_id": 1})
    assert (job.state, job.progress) == (JobState.QUEUED, 0.0)
    start_job(session=session, job=job)
    set_progress(session=session, job=job, progress=0.5)
    finish_job(session=session, job=job, state=JobState.SUCCEEDED, result={"rows": 3})
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
    finish_job(session=session, job=job, state=JobState.FAILED, error="CUDA out of memory")
    assert (job.state, job.error) == (JobState.FAILED, "CUDA out of memory")


def test_impossible_moves_are_refused(session):
    job = create_job(session=session, kind=JobKind.METRICS, params={})
    with pytest.raises(Conflict):
        finish_job(session=session, job=job, state=JobState.SUCCEEDED)
    with pytest.raises(Conflict):
        set_progress(session=session, job=job, progress=0.1)
    with pytest.raises(InvalidInput):
        finish_job(session=session, job=job, state=JobState.RUNNING)
    finish_job(session=session, job=job, state=JobState.CANCELLED)
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
    finish_job(session=session, job=failed, state=JobState.FAILED, error="out of memory")
    assert (waiting.state, waiting.error) == (JobState.CANCELLED,
                                              f"job {failed.id}, which it waited for, failed: "
                                              "out of memory")
    late = create_job(session=session, kind=JobKind.METRICS, params={}, waits_for=[failed])
    assert (late.state, late.error) == (JobState.CANCELLED,
                                        f"job {failed.id}, which it waited for, failed")
