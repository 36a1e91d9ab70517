"""The demo's second half: the models through a real `flipgate serve` and its deploy gate.

The server runs in embedded mode (SQLite and a folder broker in its own data directory) with a
fresh admin token; the demo talks to it over HTTP like any client would.
"""

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from flipgate.demo import DemoFiles
from flipgate.processes import free_port, stop_process

LINE, EVALSET, TRAINSET = "mnist", "mnist-eval", "mnist-train"
WAIT_SECONDS, POLL_SECONDS = 300, 0.2
DEFAULT_SERVE_URL = "http://127.0.0.1:8000"  # where a plain `flipgate serve` listens


class ServerDemoError(RuntimeError):
    """The demo server did not start or a job it ran failed."""


POLICY = {"max_nfr": 0.01, "max_er_increase": 0.0, "evalsets": [EVALSET]}


@dataclass(frozen=True)
class ServerDemo:
    """What the server answered: the compare report of version 1 → 3 (the update the local
    compare showed), the line's matrix, and the gate's decisions in the order asked; and
    where the server keeps its data and shows its dashboard."""

    report: dict
    matrix: dict
    decisions: list[dict]
    folder: Path
    base_url: str
    token: str

    @property
    def dashboard_url(self) -> str:
        """The dashboard's page of the demo's line."""
        return f"{self.base_url}/ui/lines/{LINE}"


@contextmanager
def run_through_server(files: DemoFiles, folder: Path) -> Iterator[ServerDemo]:
    """Register the models and data sets, gate each update under POLICY (1 → 2 approved and
    promoted, 2 → 3 blocked), repair the blocked one with ELODI and promote the repair; the
    server runs until the block ends."""
    with demo_server(folder) as client:
        yield ServerDemo(*gate_the_demo(client, files), folder=folder,
                         base_url=str(client.base_url).rstrip("/"),
                         token=client.headers["Authorization"].removeprefix("Bearer "))


def gate_the_demo(client: httpx.Client, files: DemoFiles) -> tuple[dict, dict, list[dict]]:
    """The report of 1 → 3, the matrix and the decisions of the demo's updates."""
    upload(client, "/evalsets", {"name": EVALSET}, "data", files.evalset)
    upload(client, "/trainsets", {"name": TRAINSET}, "data", files.train_set)
    decisions = [register_and_gate(client, "1", files.old_model)]
    checked(client.put(f"/models/{LINE}/training-dataset", json={"dataset": TRAINSET}))
    promote(client, "1")
    checked(client.put(f"/models/{LINE}/policy", json=POLICY))
    decisions.append(register_and_gate(client, "2", files.fd_model, parent="1"))
    promote(client, "2")
    decisions.append(register_and_gate(client, "3", files.new_model, parent="2"))
    decisions.append(repair(client, decisions[-1]["decision_id"]))
    promote(client, decisions[-1]["candidate"])
    report = compare_when_ready(client, f"{LINE}:1", f"{LINE}:3")
    return report, matrix_when_ready(client), decisions


def show_dashboard(served: ServerDemo, *, serve: bool) -> None:
    """Print where the dashboard shows the demo's line; with `serve`, keep the server up
    until Ctrl-C."""
    if not serve:
        url = served.dashboard_url.replace(served.base_url, DEFAULT_SERVE_URL)
        print(f"\nThe dashboard of this line: {url}\nThe demo's server has stopped; "
              f"`flipgate demo --serve` keeps it running, or serve its data again with\n"
              f"  FLIPGATE_DATA_DIR={served.folder} flipgate serve\nand sign in with a token "
              f"from\n  FLIPGATE_DATA_DIR={served.folder} flipgate token create --name me "
              f"--scopes read")
        return
    print(f"\nThe dashboard of this line: {served.dashboard_url}\nSign in with the demo's "
          f"admin token: {served.token}\nServing until Ctrl-C.", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopping the demo server", file=sys.stderr)


def register_and_gate(client: httpx.Client, version: str, model: Path,
                      parent: str | None = None) -> dict:
    """Register `model` (its run record as metadata) and the gate's final decision on it."""
    record = json.loads(model.with_suffix(".json").read_text())
    fields = {"name": LINE, "version": version, "metadata": json.dumps({"record": record})}
    upload(client, "/models", fields | ({"parent": f"{LINE}:{parent}"} if parent else {}),
           "artifact", model)
    decision = checked(client.post("/gate", json={"model": LINE, "candidate": version})).json()
    return final_decision(client, decision["decision_id"])


def final_decision(client: httpx.Client, decision_id: int) -> dict:
    """The decision once the worker's measurements have made it final."""
    path = f"/gate/decisions/{decision_id}"
    wait_for(lambda: checked(client.get(path)).json()["verdict"] != "pending",
             f"decision {decision_id}")
    return checked(client.get(path)).json()


def repair(client: httpx.Client, decision_id: int) -> dict:
    """Retrain the blocked candidate with ELODI on the server; its new decision."""
    queued = checked(client.post(f"/gate/decisions/{decision_id}/repair",
                                 json={"method": "elodi"})).json()
    job_id = queued["job"]["id"]
    wait_for(lambda: job_succeeded(client, job_id), f"repair job {job_id}")
    job = checked(client.get(f"/jobs/{job_id}")).json()
    return final_decision(client, job["result"]["decision_id"])


def promote(client: httpx.Client, version: str) -> None:
    """Point production at `version` (the server checks for an approving decision)."""
    checked(client.post(f"/models/{LINE}/aliases/production", json={"version": version}))


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
    """The compare report, after waiting for the jobs that measure the pair (POST /compare)."""
    path, params = f"/compare/{old}/{new}", {"evalset": EVALSET}
    response = checked(client.post(path, params=params))
    if response.status_code == 202:
        wait_for_jobs(client, response.json()["job_ids"])
        response = client.get(path, params=params)
    return checked(response).json()


def matrix_when_ready(client: httpx.Client) -> dict:
    """The line's matrix, after waiting for the matrix jobs that count its missing pairs
    (POST answers 200 once none is missing, else 202 with the job that counts them)."""
    path, params = f"/models/{LINE}/matrix", {"evalset": EVALSET}
    while (response := checked(client.post(path, params=params))).status_code == 202:
        wait_for_jobs(client, sorted({pair["job_id"] for pair in response.json()["missing"]}))
    return response.json()


def wait_for_jobs(client: httpx.Client, job_ids: list[int]) -> None:
    """Wait until every job succeeded."""
    for job_id in job_ids:
        wait_for(lambda job_id=job_id: job_succeeded(client, job_id), f"job {job_id}")


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
