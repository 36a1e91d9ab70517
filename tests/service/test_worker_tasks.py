"""The worker's tasks called directly (no broker) on migrated SQLite and PostgreSQL databases
of this module's own; their data is committed, so every name is unique to its test."""

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from sqlalchemy import Engine

from flipgate.formats.evalsets import load_evalset
from flipgate.inference import OnnxClassifier
from flipgate.metrics import compare_logits
from service.config import get_settings
from service.datasets.models import DatasetRole
from service.datasets.service import get_dataset, register_dataset
from service.db import create_session_factory
from service.errors import NotFound
from service.jobs.enqueue import create_job
from service.jobs.models import JobKind, JobState
from service.jobs.service import get_job, list_shards, mark_cancelled
from service.predictions.service import get_predictions, read_logits
from service.registry.service import get_version, register_version
from service.storage import open_store
from tests.conftest import save_graph
from tests.service.conftest import (
    BACKENDS,
    FEATURES,
    default_session,
    empty_database,
    migrated_engine,
)
from worker import runtime, tasks
from worker.app import app as worker_app


@pytest.fixture(scope="module", params=BACKENDS)
def engine(request, tmp_path_factory) -> Iterator[Engine]:
    """Databases of this module's own: its tasks commit what they do, and the other modules
    on the same process expect the shared ones empty."""
    with (empty_database(request.param, tmp_path_factory) as url,
          migrated_engine(url) as engine):
        yield engine


@pytest.fixture
def ctx(engine, store, monkeypatch, tmp_path) -> Iterator[runtime.WorkerContext]:
    """The tasks' context, on the test database and artifact store (and the Celery app's
    folder broker, configured on first use, in a temporary folder)."""
    monkeypatch.setenv("FLIPGATE_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    context = runtime.WorkerContext(create_session_factory(engine), store, worker_app,
                                    get_settings())
    # the settings as the test has set them (FLIPGATE_* changed, then get_settings cleared)
    monkeypatch.setattr(runtime, "context", lambda: replace(context, settings=get_settings()))
    yield context
    get_settings.cache_clear()


@pytest.fixture
def arrange(ctx, onnx_file, npz_file) -> Callable[..., dict]:
    """Commits `versions` linear models of one line and an eval set; returns their ids."""

    def create(versions: int = 1, n: int = 500) -> dict:
        line, evalset = f"line-{uuid.uuid4().hex[:8]}", f"set-{uuid.uuid4().hex[:8]}"
        with default_session(ctx.sessions) as session:
            ids = [register_version(session=session, store=ctx.store, line_name=line,
                                    version=f"1.{seed}", onnx_path=onnx_file(3, seed)).id
                   for seed in range(versions)]
            register_dataset(session=session, store=ctx.store, name=evalset,
                             role=DatasetRole.EVAL, npz_path=npz_file(n))
        return {"version_ids": ids, "evalset": evalset, "npz": npz_file(n),
                "onnx": [onnx_file(3, seed) for seed in range(versions)]}

    return create


def queue(ctx: runtime.WorkerContext, kind: JobKind, **params) -> int:
    with default_session(ctx.sessions) as session:
        return create_job(session=session, kind=kind, params=params).id


def queue_inference(ctx: runtime.WorkerContext, data: dict) -> int:
    """An inference job for the first arranged version on the arranged eval set."""
    return queue(ctx, JobKind.INFERENCE, version_id=data["version_ids"][0],
                 evalset=data["evalset"])


def job_row(ctx: runtime.WorkerContext, job_id: int):
    with default_session(ctx.sessions) as session:
        return get_job(session=session, job_id=job_id)


def stored_logits(ctx: runtime.WorkerContext, version_id: int, evalset: str) -> np.ndarray:
    with default_session(ctx.sessions) as session:
        prediction = get_predictions(session=session, dataset=get_dataset(
            session=session, name=evalset), version=get_version(session=session,
                                                                version_id=version_id))
        return read_logits(store=ctx.store, prediction=prediction)


def test_inference_stores_the_logits_of_the_classifier(ctx, arrange):
    data = arrange()
    job_id = queue_inference(ctx, data)
    tasks.inference(job_id)
    job = job_row(ctx, job_id)
    assert (job.state, job.progress, job.error) == (JobState.SUCCEEDED, 1.0, None)
    assert job.result["provider"] in ("CPUExecutionProvider", "CUDAExecutionProvider")
    expected = OnnxClassifier(data["onnx"][0]).predict(load_evalset(data["npz"]).x)
    np.testing.assert_array_equal(stored_logits(ctx, data["version_ids"][0], data["evalset"]),
                                  expected)


def test_a_finished_job_is_not_run_again(ctx, arrange):
    data = arrange()
    job_id = queue_inference(ctx, data)
    tasks.inference(job_id)
    first = job_row(ctx, job_id)
    tasks.inference(job_id)
    again = job_row(ctx, job_id)
    assert (again.state, again.finished_at, again.result) == (first.state, first.finished_at,
                                                              first.result)


def test_a_cancelled_job_is_not_run(ctx, arrange):
    data = arrange()
    job_id = queue_inference(ctx, data)
    with default_session(ctx.sessions) as session:
        mark_cancelled(session=session, job_id=job_id)
    tasks.inference(job_id)
    job = job_row(ctx, job_id)
    assert (job.state, job.started_at, job.result) == (JobState.CANCELLED, None, None)


def test_a_job_cancelled_while_it_runs_keeps_nothing(ctx, arrange, monkeypatch):
    data = arrange()
    job_id = queue_inference(ctx, data)
    write = runtime.JobProgress.__call__

    def cancel_midway(progress: runtime.JobProgress, done: int, total: int) -> None:
        with default_session(ctx.sessions) as session:
            mark_cancelled(session=session, job_id=job_id)
        write(progress, done, total)

    monkeypatch.setattr(runtime.JobProgress, "__call__", cancel_midway)
    tasks.inference(job_id)
    assert job_row(ctx, job_id).state == JobState.CANCELLED
    with pytest.raises(Exception, match="has no logits"):
        stored_logits(ctx, data["version_ids"][0], data["evalset"])


def wedging_onnx(path: Path) -> Path:
    """A 4-class "classifier" whose Loop adds 1 to its input 10^15 times: it never ends."""
    scalar = [helper.make_tensor_value_info(name, kind, []) for name, kind in (
        ("i", TensorProto.INT64), ("cond_in", TensorProto.BOOL))]
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"])], "body",
        [*scalar, helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["logits"], body=body)], "wedge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", FEATURES])],
        [numpy_helper.from_array(np.array(10**15, np.int64), "trips"),
         numpy_helper.from_array(np.array(True), "cond")])
    return save_graph(graph, path)


@pytest.fixture
def wedged(ctx, npz_file, tmp_path, monkeypatch) -> Callable[[], int]:
    """Queues inference of a wedging model, with a lease renewed every 0.2 s and jobs
    limited to 1.5 s; returns the job's id."""
    monkeypatch.setenv("FLIPGATE_JOB_HEARTBEAT_SECONDS", "0.2")
    monkeypatch.setenv("FLIPGATE_JOB_TIME_LIMIT_SECONDS", "1.5")
    get_settings.cache_clear()
    line, evalset = f"wedge-{uuid.uuid4().hex[:8]}", f"set-{uuid.uuid4().hex[:8]}"
    with default_session(ctx.sessions) as session:
        version = register_version(session=session, store=ctx.store, line_name=line,
                                   version="1", onnx_path=wedging_onnx(tmp_path / "w.onnx"))
        register_dataset(session=session, store=ctx.store, name=evalset,
                         role=DatasetRole.EVAL, npz_path=npz_file(20))
    return lambda: queue(ctx, JobKind.INFERENCE, version_id=version.id, evalset=evalset)


@pytest.mark.serial  # bounds a time
def test_a_wedging_model_is_stopped_by_the_time_limit(ctx, wedged):
    job_id = wedged()
    took = seconds_to_run(tasks.inference, job_id)
    job = job_row(ctx, job_id)
    assert job.state == JobState.FAILED and job.error.startswith("time_limit:"), job.error
    assert 1.5 <= took < 5, took


@pytest.mark.serial  # bounds a time
def test_a_cancel_stops_a_running_model_within_seconds(ctx, wedged):
    job_id = wedged()

    def cancel() -> None:
        with default_session(ctx.sessions) as session:
            mark_cancelled(session=session, job_id=job_id)

    threading.Timer(0.5, cancel).start()
    assert seconds_to_run(tasks.inference, job_id) < 1.4  # before the limit would stop it
    assert job_row(ctx, job_id).state == JobState.CANCELLED


def seconds_to_run(task: Callable[[int], None], job_id: int, give_up: float = 10) -> float:
    """How long the task took on the job, run in a thread; a failure after `give_up`
    seconds (the run is left to the daemon thread) instead of a hung test."""
    started = time.monotonic()
    runner = threading.Thread(target=task, args=(job_id,), daemon=True)
    runner.start()
    runner.join(give_up)
    assert not runner.is_alive(), f"the job still runs after {give_up} s"
    return time.monotonic() - started


def test_progress_is_written_in_steps(ctx, arrange, monkeypatch):
    data = arrange(n=2000)  # four batches of 512
    job_id = queue_inference(ctx, data)
    seen: list[float] = []
    write = runtime.JobProgress.__call__

    def record(progress: runtime.JobProgress, done: int, total: int) -> None:
        write(progress, done, total)
        seen.append(job_row(ctx, job_id).progress)

    monkeypatch.setattr(runtime.JobProgress, "__call__", record)
    tasks.inference(job_id)
    assert seen[-1] == 1.0 and seen == sorted(seen) and 0.0 < seen[0] < 1.0


def test_a_failing_job_records_its_error(ctx, arrange):
    data = arrange()
    job_id = queue(ctx, JobKind.INFERENCE, version_id=data["version_ids"][0],
                   evalset="no-such-set")
    tasks.inference(job_id)
    job = job_row(ctx, job_id)
    assert job.state == JobState.FAILED and job.error.startswith("dataset_not_found:")


def test_a_failed_jobs_error_names_no_file_of_the_server(ctx, arrange):
    data = arrange()
    with default_session(ctx.sessions) as session:
        sha256 = get_version(session=session, version_id=data["version_ids"][0]).artifact_sha256
    ctx.store.remove([sha256])  # the model's file is gone from the store
    job_id = queue_inference(ctx, data)
    tasks.inference(job_id)
    job = job_row(ctx, job_id)
    assert job.state == JobState.FAILED
    assert str(ctx.store.root.parent) not in job.error and "/" not in job.error, job.error
    assert job.error.startswith("artifact_not_found:")  # the store says which is missing


def test_metrics_store_the_compare_report_of_the_pair(ctx, arrange):
    data = arrange(versions=2)
    old_id, new_id = data["version_ids"]
    for version_id in data["version_ids"]:
        tasks.inference(queue(ctx, JobKind.INFERENCE, version_id=version_id,
                              evalset=data["evalset"]))
    job_id = queue(ctx, JobKind.METRICS, old_version_id=old_id, new_version_id=new_id,
                   evalset=data["evalset"])
    tasks.metrics(job_id)
    job = job_row(ctx, job_id)
    labels = load_evalset(data["npz"]).y
    expected = compare_logits(stored_logits(ctx, old_id, data["evalset"]),
                              stored_logits(ctx, new_id, data["evalset"]), labels)
    assert job.state == JobState.SUCCEEDED
    assert job.result["nfr"] == pytest.approx(expected["nfr"])
    assert job.result["churn"] == pytest.approx(expected["churn"])


@pytest.fixture
def shard_size(ctx, monkeypatch) -> int:
    """Eval sets of more than 7 samples are sharded."""
    monkeypatch.setenv("FLIPGATE_SHARD_SIZE", "7")
    get_settings.cache_clear()
    return 7


def split_inference(ctx: runtime.WorkerContext, data: dict) -> tuple[int, list[int]]:
    """A sharded inference job, run once to split it; its id and its shards' ids."""
    job_id = queue_inference(ctx, data)
    tasks.inference(job_id)
    with default_session(ctx.sessions) as session:
        shards = list_shards(session=session, job=get_job(session=session, job_id=job_id))
        return job_id, [shard.id for shard in shards]


def test_shards_merge_into_the_logits_of_the_whole_set(ctx, arrange, shard_size):
    data = arrange(n=30)
    job_id, shard_ids = split_inference(ctx, data)
    assert [job_row(ctx, shard).params["start"] for shard in shard_ids] == [0, 7, 14, 21, 28]
    for shard in reversed(shard_ids):
        tasks.inference(shard)
    job = job_row(ctx, job_id)
    assert (job.state, job.progress, job.result["shards"]) == (JobState.SUCCEEDED, 1.0, 5)
    expected = OnnxClassifier(data["onnx"][0]).predict(load_evalset(data["npz"]).x)
    np.testing.assert_array_equal(stored_logits(ctx, data["version_ids"][0], data["evalset"]),
                                  expected)
    tasks.inference(shard_ids[0])  # delivered again: nothing changes
    assert job_row(ctx, job_id).finished_at == job.finished_at


def test_the_parent_progress_is_the_mean_of_its_shards(ctx, arrange, shard_size):
    job_id, shard_ids = split_inference(ctx, arrange(n=30))
    for shard in shard_ids[:2]:
        tasks.inference(shard)
    job = job_row(ctx, job_id)
    assert (job.state, job.progress) == (JobState.RUNNING, pytest.approx(0.4))


def test_cancelling_the_parent_cancels_its_shards(ctx, arrange, shard_size):
    job_id, shard_ids = split_inference(ctx, arrange(n=30))
    tasks.inference(shard_ids[0])
    with default_session(ctx.sessions) as session:
        mark_cancelled(session=session, job_id=job_id)
    for shard in shard_ids[1:]:
        tasks.inference(shard)
    states = [job_row(ctx, shard).state for shard in shard_ids]
    assert states == [JobState.SUCCEEDED] + [JobState.CANCELLED] * 4


def test_a_shard_that_ends_without_logits_fails_the_parent(ctx, arrange, shard_size):
    job_id, shard_ids = split_inference(ctx, arrange(n=30))
    with default_session(ctx.sessions) as session:
        mark_cancelled(session=session, job_id=shard_ids[2])
    job = job_row(ctx, job_id)
    assert job.state == JobState.FAILED and job.error.startswith(f"shard {shard_ids[2]} ")
    assert {job_row(ctx, shard).state for shard in shard_ids} == {JobState.CANCELLED}


def with_external_data(onnx_path: Path) -> Path:
    """The model saved again with its weights in a data file beside it (a bundle)."""
    folder = onnx_path.parent / "external"
    folder.mkdir(exist_ok=True)
    onnx.save_model(onnx.load(onnx_path), folder / "model.onnx", save_as_external_data=True,
                    location="model.onnx.data", size_threshold=0)
    return folder / "model.onnx"


@pytest.fixture(params=["onnx", "bundle"])
def s3_hosts(request, ctx, s3_settings, tmp_path, onnx_file, npz_file, monkeypatch):
    """A version (a single .onnx, then one with external data: a bundle) and an eval set
    registered through one host's S3 store (the API's), and the worker's context on another
    host's (its own empty data and cache folders, the same bucket); (the API's store, the
    worker's context, the job's params)."""
    api = open_store(s3_settings)
    line, evalset = f"line-{uuid.uuid4().hex[:8]}", f"set-{uuid.uuid4().hex[:8]}"
    model = onnx_file(3, 0)
    with default_session(ctx.sessions) as session:
        version = register_version(session=session, store=api, line_name=line, version="1",
                                   onnx_path=model if request.param == "onnx"
                                   else with_external_data(model))
        register_dataset(session=session, store=api, name=evalset, role=DatasetRole.EVAL,
                         npz_path=npz_file(40))
    worker = replace(ctx, store=open_store(s3_settings.model_copy(
        update={"data_dir": tmp_path / "worker-host"})))
    monkeypatch.setattr(runtime, "context", lambda: worker)
    return api, worker, {"version_id": version.id, "evalset": evalset}


def test_a_worker_sharing_no_disk_writes_its_logits_to_the_bucket(s3_hosts, onnx_file,
                                                                  npz_file):
    api, worker, params = s3_hosts
    job_id = queue(worker, JobKind.INFERENCE, **params)
    tasks.inference(job_id)
    assert job_row(worker, job_id).state == JobState.SUCCEEDED, job_row(worker, job_id).error
    with default_session(worker.sessions) as session:
        prediction = get_predictions(session=session, dataset=get_dataset(
            session=session, name=params["evalset"]), version=get_version(
            session=session, version_id=params["version_id"]))
        api.cache.discard([prediction.logits_sha256])  # the API reads it from the bucket
        logits = read_logits(store=api, prediction=prediction)
        model = get_version(session=session, version_id=params["version_id"]).artifact_sha256
    assert worker.store.cache.path(model).exists()  # the worker read the model via its cache
    expected = OnnxClassifier(onnx_file(3, 0)).predict(load_evalset(npz_file(40)).x)
    np.testing.assert_allclose(logits, expected, rtol=1e-5)


def test_a_worker_that_loses_the_store_fails_the_job_and_keeps_nothing(
        s3_hosts, s3_settings, tmp_path, monkeypatch):
    _, worker, params = s3_hosts
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")  # the store refuses it
    cut_off = replace(worker, store=open_store(s3_settings.model_copy(
        update={"data_dir": tmp_path / "worker-host"})))
    monkeypatch.setattr(runtime, "context", lambda: cut_off)
    job_id = queue(cut_off, JobKind.INFERENCE, **params)
    tasks.inference(job_id)
    job = job_row(cut_off, job_id)
    assert job.state == JobState.FAILED and job.error.startswith("storage_unavailable:")
    with default_session(cut_off.sessions) as session, pytest.raises(NotFound):
        get_predictions(session=session, dataset=get_dataset(
            session=session, name=params["evalset"]), version=get_version(
            session=session, version_id=params["version_id"]))
