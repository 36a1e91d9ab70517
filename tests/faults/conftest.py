"""Whole-system fault injection: a `flipgate worker` in its own process group, the API
in-process, slow ONNX models so a kill lands mid-job, a Redis of the test's own on a spare
port, and the job rows read straight from the database."""

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper, numpy_helper
from sqlalchemy import func, select

from flipgate.inference import OnnxClassifier
from flipgate.processes import free_port, stop_process
from service.config import Settings
from service.datasets.service import get_dataset
from service.db import settings_session
from service.gate.models import Decision
from service.jobs.models import Job
from service.main import create_app
from service.migrate import upgrade
from service.predictions.models import Prediction
from service.predictions.service import get_predictions, read_logits
from service.registry.service import get_named_version
from service.storage import open_store
from tests.conftest import save_graph
from tests.e2e.conftest import child_pids, flipgate_env, wait_for

TOKEN = "faults-admin-token-0123456789"
FEATURES, HIDDEN, LAYERS, CLASSES, SAMPLES = 64, 768, 6, 10, 8000
# the worker's lease in these tests: renewed every HEARTBEAT s, lost after LEASE s
HEARTBEAT, LEASE, SWEEP, RESEND = 0.5, 4.0, 0.5, 5.0
WAIT_SECONDS = 240


def slow_mlp(path: Path, seed: int) -> Path:
    """An ONNX MLP deep and wide enough that scoring SAMPLES takes seconds."""
    rng = np.random.default_rng(seed)
    sizes = [FEATURES, *[HIDDEN] * LAYERS, CLASSES]
    nodes, weights, current = [], [], "x"
    for index, (rows, columns) in enumerate(itertools.pairwise(sizes)):
        name = f"w{index}"
        weights.append(numpy_helper.from_array(
            (rng.normal(size=(rows, columns)) / np.sqrt(rows)).astype(np.float32), name))
        nodes.append(helper.make_node("MatMul", [current, name], [f"h{index}"]))
        current = f"h{index}"
        if index < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [current], [f"r{index}"]))
            current = f"r{index}"
    nodes.append(helper.make_node("Identity", [current], ["logits"]))
    graph = helper.make_graph(
        nodes, "slow_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          ["N", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])], weights)
    return save_graph(graph, path)


@dataclass(frozen=True)
class Workload:
    """Two slow versions and an eval set, with the logits a clean run gives."""

    models: list[Path]
    evalset: Path
    clean_logits: list[np.ndarray]


@pytest.fixture(scope="session")
def workload(tmp_path_factory) -> Workload:
    folder = tmp_path_factory.mktemp("workload")
    models = [slow_mlp(folder / f"v{seed}.onnx", seed) for seed in range(2)]
    rng = np.random.default_rng(7)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    evalset = folder / "eval.npz"
    np.savez(evalset, x=x, y=rng.integers(0, CLASSES, SAMPLES))
    return Workload(models, evalset, [OnnxClassifier(path).predict(x) for path in models])


@dataclass
class System:
    """The API (in-process), its database, and the worker processes started for a test."""

    settings: Settings
    env: dict[str, str]
    folder: Path
    client: TestClient
    workers: list[subprocess.Popen] = field(default_factory=list)

    def start_worker(self) -> subprocess.Popen:
        """`flipgate worker` (one pool process) in a process group of its own."""
        log = (self.folder / f"worker-{len(self.workers)}.log").open("wb")
        worker = subprocess.Popen([sys.executable, "-m", "flipgate.cli", "worker",
                                   "--concurrency", "1"], env=self.env, cwd=self.folder,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers.append(worker)
        return worker

    def wait_for_log(self, text: str, seconds: float) -> None:
        """Wait until a worker has logged `text`."""
        wait_for(lambda: any(text in log.read_text(errors="replace")
                             for log in self.folder.glob("worker-*.log")),
                 f"a worker to log {text!r}", seconds)

    def jobs(self) -> list[Job]:
        """Every job row, oldest first."""
        with settings_session(self.settings) as session:
            return list(session.scalars(select(Job).order_by(Job.id)))

    def decisions(self) -> list[Decision]:
        with settings_session(self.settings) as session:
            return list(session.scalars(select(Decision).order_by(Decision.id)))

    def gate(self, workload: Workload) -> int:
        """Register the workload and ask the gate about 1.1 over 1.0: the id of the pending
        decision (its jobs: inference of both versions, then their metrics)."""
        for index, path in enumerate(workload.models):
            response = self.client.post("/models", data={"name": "digits",
                                                         "version": f"1.{index}"},
                                        files={"artifact": ("model.onnx", path.read_bytes())})
            assert response.status_code == 201, response.text
        response = self.client.post("/evalsets", data={"name": "eval"}, files={
            "data": ("eval.npz", workload.evalset.read_bytes())})
        assert response.status_code == 201, response.text
        decision = self.client.post("/gate", json={"model": "digits", "candidate": "1.1",
                                                   "baseline": "1.0", "evalsets": ["eval"]})
        assert decision.status_code == 202, decision.text
        return decision.json()["decision_id"]

    def wait_running(self) -> Job:
        """A job seen running its first run with some progress: one to kill mid-job. When
        none is seen in time, the failure shows the jobs and the end of each worker's log
        (one CI run timed out here once; it has not been reproduced)."""
        try:
            return wait_for(lambda: next((job for job in self.jobs()
                                          if job.state == "running" and job.attempts == 1
                                          and job.progress > 0), None),
                            "a job running its first run", WAIT_SECONDS)
        except AssertionError as timeout:
            raise AssertionError(f"{timeout}\n{self.describe()}") from None

    def describe(self) -> str:
        """The jobs' states and the last lines of each worker's log, for a failure."""
        jobs = "\n".join(f"job {job.id} {job.kind} {job.state} attempts={job.attempts} "
                         f"progress={job.progress} error={job.error!r}" for job in self.jobs())
        logs = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
                         for log in sorted(self.folder.glob("worker-*.log")))
        return f"{jobs}\n{logs}"

    def wait_ended(self) -> list[Job]:
        """Every job once none is queued or running."""
        def ended() -> list[Job] | None:
            jobs = self.jobs()
            return jobs if all(job.state not in ("queued", "running") for job in jobs) else None

        return wait_for(ended, "every job to end", WAIT_SECONDS)

    def logits(self) -> list[np.ndarray]:
        """The stored logits of versions 1.0 and 1.1 on the eval set."""
        store = open_store(self.settings)
        with settings_session(self.settings) as session:
            dataset = get_dataset(session=session, name="eval")
            return [read_logits(store=store, prediction=get_predictions(
                session=session, dataset=dataset, version=get_named_version(
                    session=session, line_name="digits", version=f"1.{index}")))
                    for index in range(2)]

    def assert_all_done_once(self, workload: Workload) -> list[Job]:
        """Every job succeeded, the logits are byte-identical to a clean run's, one
        prediction row per version, and no decision is pending; the jobs."""
        jobs = self.wait_ended()
        assert [job.state for job in jobs] == ["succeeded"] * len(jobs), [
            (job.id, job.state, job.error) for job in jobs]
        for stored, clean in zip(self.logits(), workload.clean_logits, strict=True):
            assert stored.tobytes() == clean.tobytes()
        with settings_session(self.settings) as session:
            assert session.scalar(select(func.count()).select_from(Prediction)) == 2
        assert [decision.verdict for decision in self.decisions()] != []
        assert "pending" not in [decision.verdict for decision in self.decisions()]
        return jobs


def pool_processes(worker: subprocess.Popen) -> list[int]:
    """The pids of a Celery worker's pool processes: its children but the sweeper."""
    return [pid for pid, sweeper in children(worker) if not sweeper]


def sweepers(worker: subprocess.Popen) -> list[int]:
    """The pids of the worker's sweepers (`flipgate worker` runs `python -m worker.sweeper`)."""
    return [pid for pid, sweeper in children(worker) if sweeper]


def children(worker: subprocess.Popen) -> list[tuple[int, bool]]:
    """The worker's live child processes, whichever of its threads started them (the
    sweepers' supervisor is not the main one): each pid, and whether it is a sweeper."""
    found = []
    for pid in child_pids(worker.pid):
        try:
            found.append((pid, b"worker.sweeper" in Path(f"/proc/{pid}/cmdline").read_bytes()))
        except FileNotFoundError:  # it ended meanwhile
            continue
    return found


def kill_group(worker: subprocess.Popen) -> None:
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()


@contextmanager
def system(tmp_path: Path, **settings: object) -> Iterator[System]:
    """A migrated data directory, the API on it, and the workers the test starts (whose
    process groups are killed at the end)."""
    data_dir = tmp_path / "data"
    config = Settings(data_dir=data_dir, admin_token=TOKEN, job_heartbeat_seconds=HEARTBEAT,
                      job_lease_seconds=LEASE, sweep_seconds=SWEEP, job_resend_seconds=RESEND,
                      **settings)
    upgrade(config)
    env = flipgate_env(
        FLIPGATE_DATA_DIR=str(data_dir), FLIPGATE_DATABASE_URL=config.database_url,
        FLIPGATE_JOB_HEARTBEAT_SECONDS=str(HEARTBEAT), FLIPGATE_JOB_LEASE_SECONDS=str(LEASE),
        FLIPGATE_SWEEP_SECONDS=str(SWEEP), FLIPGATE_JOB_RESEND_SECONDS=str(RESEND),
        **({"FLIPGATE_REDIS_URL": config.redis_url} if config.redis_url else {}))
    with TestClient(create_app(config), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        running = System(config, env, tmp_path, client)
        try:
            yield running
        finally:
            for worker in running.workers:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGTERM)
                    stop_process(worker, grace_seconds=20)


class SpareRedis:
    """A redis-server of the test's own on a spare port, without persistence."""

    def __init__(self, folder: Path) -> None:
        self.port, self.folder, self.process = free_port(), folder, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], cwd=self.folder, stdout=subprocess.DEVNULL)
        import redis
        wait_for(lambda: _pings(redis, self.url), f"redis on port {self.port}", 30)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def _pings(redis_module, url: str) -> bool:
    try:
        return redis_module.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis_module.ConnectionError:
        return False


@pytest.fixture
def spare_redis(tmp_path) -> Iterator[SpareRedis]:
    if subprocess.run(["which", "redis-server"], capture_output=True).returncode:
        pytest.fail("redis-server is needed for the fault suite", pytrace=False)
    server = SpareRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.kill()


def seconds_since(moment: float, started_at: datetime) -> float:
    """Seconds from a time.time() `moment` to a row's timestamp."""
    return (started_at - datetime.fromtimestamp(moment, UTC)).total_seconds()


def now() -> float:
    return time.time()
