"""Whole-system helpers: flipgate processes started as subprocesses (always terminated),
free ports, and bounded polling of jobs over HTTP."""

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis

from flipgate.datasets import save_evalset
from flipgate.formats.evalsets import EvalSet
from flipgate.processes import free_port, stop_process
from flipgate.train.config import TrainConfig
from flipgate.train.recipes import train
from tests.conftest import linear_onnx

ROOT = Path(__file__).resolve().parents[2]
WAIT_SECONDS = 90
POLL_SECONDS = 0.2
FEATURES, CLASSES = 4, 3


def empty_redis(url: str) -> str:
    """`url` after emptying its Redis database; unreachable Redis fails the test in CI and
    skips it elsewhere."""
    server = redis.Redis.from_url(url, socket_connect_timeout=3)
    try:
        server.flushdb()
    except redis.ConnectionError as error:
        message = f"Redis at {url} is unreachable: {error}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI must test Redis)", pytrace=False)
        pytest.skip(message)
    finally:
        server.close()
    return url


def flipgate_env(**variables: str) -> dict[str, str]:
    """This environment without FLIPGATE_* variables, plus `variables` and the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIPGATE_")}
    return {**env, **variables, "PYTHONPATH": str(ROOT)}


@contextmanager
def flipgate_process(args: list[str], env: dict[str, str], cwd: Path,
                     preexec_fn: Callable[[], None] | None = None) -> Iterator[
        subprocess.Popen[bytes]]:
    """`flipgate ARGS` as a subprocess (`preexec_fn` run in it before it starts, e.g. to set
    a resource limit), logging to cwd/<command>.log; terminated at the end."""
    with (cwd / f"{args[0]}.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "flipgate.cli", *args], env=env,
                                   cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                   preexec_fn=preexec_fn)
        try:
            yield process
        finally:
            stop_process(process, grace_seconds=30)


def child_pids(pid: int) -> list[int]:
    """The ids of a process's children, whichever of its threads started them (/proc)."""
    return [int(child) for path in Path(f"/proc/{pid}/task").glob("*/children")
            for child in path.read_text().split()]


def alive(pid: int) -> bool:
    """Whether a process with this id exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# A child may exit on its own just after its parent: multiprocessing's resource tracker, which
# uvicorn's workers make `serve` start, stops when the parent's end of its pipe closes.
EXIT_AFTER_PARENT_SECONDS = 5.0


def outliving(pids: list[int]) -> list[int]:
    """Those of `pids` (children of a process that has exited) still running
    EXIT_AFTER_PARENT_SECONDS later: orphans, not children on their way out."""
    deadline = time.monotonic() + EXIT_AFTER_PARENT_SECONDS
    while (running := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    return running


def wait_for(check: Callable[[], object], what: str, timeout: float = WAIT_SECONDS) -> object:
    """The first truthy value of `check()`, polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_for_jobs(client: httpx.Client, job_ids: list[int]) -> list[dict]:
    """The jobs once each has ended; every one must have succeeded."""

    def ended() -> list[dict] | None:
        jobs = [client.get(f"/jobs/{job_id}").json() for job_id in job_ids]
        return jobs if all(job["state"] not in ("queued", "running") for job in jobs) else None

    jobs = wait_for(ended, f"jobs {job_ids}")
    assert [job["state"] for job in jobs] == ["succeeded"] * len(jobs), jobs
    return jobs


@pytest.fixture
def models(tmp_path) -> list[Path]:
    """Three linear ONNX classifiers of CLASSES classes."""
    rng = np.random.default_rng(0)
    return [linear_onnx(tmp_path / f"v{index}.onnx", rng.normal(size=(FEATURES, CLASSES)),
                        rng.normal(size=CLASSES), ("N", FEATURES)) for index in range(3)]


@pytest.fixture
def evalset(tmp_path) -> Path:
    """An eval set of 300 samples."""
    rng = np.random.default_rng(1)
    path = tmp_path / "eval.npz"
    np.savez(path, x=rng.normal(size=(300, FEATURES)).astype(np.float32),
             y=rng.integers(0, CLASSES, 300))
    return path


@pytest.fixture
def digits(tmp_path) -> dict[str, Path]:
    """Training and eval sets of scikit-learn's 8x8 digits, production (v1: 600 samples) and a
    candidate trained on 60 samples for one epoch (v2), each with its run record."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = (data.images / 16.0).astype(np.float32), data.target
    order = np.random.default_rng(0).permutation(len(y))
    training, evaluation = EvalSet(x[order[:1000]], y[order[:1000]]), EvalSet(
        x[order[1000:]], y[order[1000:]])
    files = {"train": save_evalset(training, tmp_path / "train.npz"),
             "eval": save_evalset(evaluation, tmp_path / "eval.npz")}
    for version, samples, epochs in (("1", 600, 10), ("2", 60, 1)):
        subset = EvalSet(training.x[:samples], training.y[:samples])
        model = train("baseline", "mlp:hidden=64", subset, 10,
                      TrainConfig(epochs=epochs, seed=int(version)))
        files[version] = model.save(tmp_path / f"v{version}.onnx", (8, 8))
    return files


def register(client: httpx.Client, models: list[Path], evalset: Path) -> None:
    """Register the models as digits:1.0, 1.1, … and the eval set as "eval"."""
    for index, path in enumerate(models):
        response = client.post("/models", data={"name": "digits", "version": f"1.{index}"},
                               files={"artifact": ("model.onnx", path.read_bytes())})
        assert response.status_code == 201, response.text
    response = client.post("/evalsets", data={"name": "eval"},
                           files={"data": ("eval.npz", evalset.read_bytes())})
    assert response.status_code == 201, response.text


@contextmanager
def served(tmp_path: Path, token: str, preexec_fn: Callable[[], None] | None = None,
           serve_args: tuple[str, ...] = (),
           **variables: str) -> Iterator[tuple[str, httpx.Client]]:
    """`flipgate serve` (embedded, with `serve_args`) on a free port with `token` as its admin
    token (and the environment `variables`, flipgate_process's `preexec_fn`), once ready: its
    address and a client sending the token."""
    port = free_port()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(tmp_path / "data"), FLIPGATE_ADMIN_TOKEN=token,
                       **variables)
    address = f"http://127.0.0.1:{port}"
    with (flipgate_process(["serve", "--port", str(port), *serve_args], env, tmp_path, preexec_fn),
          httpx.Client(base_url=address, timeout=60,
                       headers={"Authorization": f"Bearer {token}"}) as client):
        wait_for(lambda: _ready(client), "/readyz")
        yield address, client


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False
