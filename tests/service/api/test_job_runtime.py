"""The worker runtime on a claimed job: code that exits fails the job with its reason (the
pool process lives on), and a job is claimed by one delivery only."""

import sys

import pytest

from service.jobs.enqueue import create_job
from service.jobs.models import JobKind
from worker import runtime

pytestmark = pytest.mark.both_backends  # leases lock rows (SKIP LOCKED) on PostgreSQL alone


def exits(_ctx, _job_id, _params) -> None:
    sys.exit("repair gave up")


def test_a_job_whose_code_exits_fails_with_the_reason(client, worker, db):
    with db() as session:
        job_id = create_job(session=session, kind=JobKind.TRAIN, params={"seed": 1}).id
    claimed = runtime.claim(worker, job_id)
    assert claimed.params == {"seed": 1}
    assert runtime.claim(worker, job_id) is None  # the same message delivered again
    runtime.run_job(job_id, claimed.params, exits)
    job = client.get(f"/jobs/{job_id}").json()
    assert (job["state"], job["error"]) == ("failed", "SystemExit: repair gave up")
