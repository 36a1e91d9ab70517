"""The demo's second half: the same two models and eval set through a real `flipgate serve`.

The server runs in embedded mode (SQLite and a folder broker in its own data directory) with a
fresh admin token; the demo talks to it over HTTP like any client would.
"""

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from flipgate.demo import DemoFiles
from flipgate.processes import free_port, stop_process

LINE, EVALSET = "mnist", "mnist-eval"
WAIT_SECONDS, POLL_SECONDS = 300, 0.2


class ServerDemoError(RuntimeError):
    """The demo server did not start or a job it ran failed."""


def run_through_server(files: DemoFiles, folder: Path) -> tuple[dict, dict]:
    """Register both models and the eval set, wait for the server's jobs, and return its
    compare report of version 1 → 2 and the line's matrix."""
    with demo_server(folder) as client:
        upload(client, "/evalsets", {"name": EVALSET}, "data", files.evalset)
        upload(client, "/models", {"name": LINE, "version": "1"}, "artifact", files.old_model)
        upload(client, "/models", {"name": LINE, "version": "2", "parent": f"{LINE}:1"},
               "artifact", files.new_model)
        report = compare_when_ready(client, f"{LINE}:1", f"{LINE}:2")
        matrix = client.get(f"/models/{LINE}/matrix", params={"evalset": EVALSET})
        return report, checked(matrix).json()


@contextmanager
def demo_server(folder: Path) -> Iterator[httpx.Client]:
    """`flipgate serve` on a free port with its data in `folder`; a client holding its token."""
    folder.mkdir(parents=True, exist_ok=True)
    token, port = secrets.token_urlsafe(24), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIPGATE_")}
    env.update(FLIPGATE_DATA_DIR=str(folder.resolve()), FLIPGATE_ADMIN_TOKEN=token)
    with (folder / "server.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "flipgate.cli", "serve", "--port", str(port)], env=env,
            stdout=log, stderr=subprocess.STDOUT)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120,
                              headers={"Authorization": f"Bearer {token}"}) as client:
                wait_for(lambda: ready(client, process, folder), "the server to start")
                yield client
        finally:
            stop_process(process)


def ready(client: httpx.Client, process: subprocess.Popen, folder: Path) -> bool:
    """Whether the server answers /readyz; an exited server is an error."""
    if process.poll() is not None:
        raise ServerDemoError(f"flipgate serve exited with code {process.returncode}; "
                              f"see {folder / 'server.log'}")
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def upload(client: httpx.Client, path: str, fields: dict, file_field: str, file: Path) -> dict:
    """POST a multipart form with one file; the created record."""
    with file.open("rb") as content:
        response = client.post(path, data=fields, files={file_field: (file.name, content)})
    return checked(response).json()


def compare_when_ready(client: httpx.Client, old: str, new: str) -> dict:
    """The compare report, after waiting for the inference jobs a 202 answer names."""
    path, params = f"/compare/{old}/{new}", {"evalset": EVALSET}
    response = client.get(path, params=params)
    if response.status_code == 202:
        for job_id in response.json()["job_ids"]:
            wait_for(lambda job_id=job_id: job_succeeded(client, job_id), f"job {job_id}")
        response = client.get(path, params=params)
    return checked(response).json()


def job_succeeded(client: httpx.Client, job_id: int) -> bool:
    """Whether the job succeeded; a failed or cancelled job is an error."""
    job = checked(client.get(f"/jobs/{job_id}")).json()
    if job["state"] in ("failed", "cancelled"):
        raise ServerDemoError(f"job {job_id} {job['state']}: {job.get('error')}")
    return job["state"] == "succeeded"


def checked(response: httpx.Response) -> httpx.Response:
    """The response, or a ServerDemoError with the server's error message."""
    if response.is_error:
        raise ServerDemoError(f"{response.request.method} {response.request.url.path}: "
                              f"{response.status_code} {response.text}")
    return response


def wait_for(check: Callable[[], bool], what: str) -> None:
    """Poll `check` until it is true, for at most WAIT_SECONDS."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not check():
        if time.monotonic() > deadline:
            raise ServerDemoError(f"timed out after {WAIT_SECONDS} s waiting for {what}")
        time.sleep(POLL_SECONDS)
