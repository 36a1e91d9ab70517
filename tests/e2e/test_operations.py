"""Operating flipgate (issue 37) on `flipgate serve --workers 2` with its worker, on PostgreSQL
and Redis, logging JSON: a scripted flow (requests that succeed, 404s, refused tokens, an
upload over the limit, two gates that approve and block, a failed job, a delivered and a
failed callback) changes every counter of /metrics by exactly what it did, summed over the
two API processes; one request id joins the gate request, its jobs' worker lines and its
callback; no secret the flow used appears in any log line."""

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from flipgate.processes import free_port
from flipgate.signing import signature
from service.ui.session import COOKIE
from tests.conftest import linear_onnx
from tests.e2e.conftest import (
    child_pids,
    empty_redis,
    flipgate_env,
    flipgate_process,
    outliving,
    wait_for,
)
from tests.service.conftest import postgres_schema

# a database of its own: the files of the parallel run may run at once, and test_redis_worker
# empties database 15 (and test_object_store 13, the shards 14) when it starts
REDIS_URL = os.environ.get("FLIPGATE_TEST_OPERATIONS_REDIS_URL", "redis://127.0.0.1:6379/12")
ADMIN = "ops-admin-token-0a1b2c3d4e5f"
SECRET_KEY = "ops-server-key-9f8e7d6c5b4a"
SESSION_KEY = "ops-session-key-3c4d5e6f7a8b"  # the two API processes sign cookies alike
DB_PASSWORD = "ops-db-password-5e6f7a8b"  # PostgreSQL trusts the test's connections: unused
WRONG_TOKEN = "fg_ops-wrong-token-1a2b3c4d"
CALLBACK_TOKEN = "ops-callback-query-token-77aa"  # in the query of a callback URL
GATE_REQUEST_ID = "ci-run-42.block"
FEATURES, CLASSES, SAMPLES = 4, 3, 300
pytestmark = pytest.mark.slow


class Receiver(BaseHTTPRequestHandler):
    """Callback receivers on loopback: /ok answers 200, /fail 500; each POST is recorded."""

    received: ClassVar[list[tuple[str, dict[str, str]]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, dict(self.headers)))
        self.send_response(200 if self.path.startswith("/ok") else 500)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@dataclass
class Flow:
    """What the scripted flow did and saw."""

    address: str
    folder: Path
    calls: Counter = field(default_factory=Counter)  # (method, route, status) -> requests
    counted: Counter = field(default_factory=Counter)  # the calls the last scrape counts
    secrets: dict[str, str] = field(default_factory=dict)
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    decisions: dict[str, dict] = field(default_factory=dict)
    callbacks: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    gate_job_ids: list[int] = field(default_factory=list)
    job_request_ids: dict[int, str | None] = field(default_factory=dict)
    echoed_request_id: str | None = None
    children: list[int] = field(default_factory=list)  # serve's: API processes and worker
    exit_code: int | None = None
    orphans: list[int] = field(default_factory=list)  # children alive after serve exited

    def call(self, method: str, route: str, token: str | None = ADMIN, *,
             path: dict[str, Any] | None = None, **request: Any) -> httpx.Response:
        """One request on a new connection (so that either API process may take it),
        recorded by its route template and status."""
        headers = request.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        response = httpx.request(method, self.address + route.format(**(path or {})),
                                 headers=headers, timeout=60, **request)
        self.calls[(method, route, str(response.status_code))] += 1
        return response


def scrape(flow: Flow) -> dict[tuple[str, str, frozenset], float]:
    """/metrics as {(type, sample name, labels): value}, parsed by prometheus-client."""
    response = flow.call("GET", "/metrics", flow.secrets["metrics token"])
    assert response.status_code == 200, response.text
    return {(family.type, sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples}


@pytest.fixture(scope="module")
def receivers() -> Iterator[str]:
    Receiver.received = []
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def flow(tmp_path_factory, receivers) -> Iterator[Flow]:
    """The scripted flow, run once against two API processes and a worker."""
    folder = tmp_path_factory.mktemp("operations")
    models = models_of(folder)
    with postgres_schema() as schema_url:
        database_url = make_url(schema_url).set(password=DB_PASSWORD).render_as_string(
            hide_password=False)
        port = free_port()
        env = flipgate_env(
            FLIPGATE_DATABASE_URL=database_url, FLIPGATE_REDIS_URL=empty_redis(REDIS_URL),
            FLIPGATE_DATA_DIR=str(folder / "data"), FLIPGATE_ADMIN_TOKEN=ADMIN,
            FLIPGATE_SECRET_KEY=SECRET_KEY, FLIPGATE_LOG_FORMAT="json",
            FLIPGATE_SESSION_KEY=SESSION_KEY, FLIPGATE_MAX_UPLOAD_MB="1",
            FLIPGATE_CALLBACK_ALLOWLIST="127.0.0.1", FLIPGATE_CALLBACK_ATTEMPTS="1",
            PROMETHEUS_MULTIPROC_DIR=str(folder / "prometheus"))
        subprocess.run([sys.executable, "-m", "flipgate.cli", "migrate"], env=env, check=True,
                       capture_output=True)
        flow = Flow(f"http://127.0.0.1:{port}", folder)
        flow.secrets = {"admin token": ADMIN, "server key": SECRET_KEY, "session key": SESSION_KEY,
                        "database password": DB_PASSWORD, "wrong token": WRONG_TOKEN,
                        "metrics token": mint(env, "prometheus", "metrics")}
        with flipgate_process(["serve", "--workers", "2", "--port", str(port)], env,
                              folder) as server:
            wait_for(lambda: ready(flow.address), "/readyz")
            flow.children = child_pids(server.pid)
            wait_for(lambda: scrape(flow).get(
                ("gauge", "flipgate_workers_alive", frozenset({("queue", "gpu")}))),
                "the worker's beat")
            flow.before = scrape(flow)
            flow.calls = Counter({("GET", "/metrics", "200"): 1})  # counted once it answered
            run_flow(flow, models, receivers)
            flow.counted = Counter(flow.calls)
            flow.after = scrape(flow)
            (folder / "metrics.txt").write_text(flow.call(  # beside serve.log, to read
                "GET", "/metrics", flow.secrets["metrics token"]).text)
            flow.job_request_ids = job_request_ids(database_url)
        flow.exit_code = server.returncode  # SIGTERM'd at the block's end
        flow.orphans = outliving(flow.children)  # now, before their ids can be reused
        flow.callbacks = list(Receiver.received)
        yield flow


def models_of(folder: Path) -> dict[str, Path]:
    """Three linear classifiers and the eval set."""
    rng = np.random.default_rng(0)
    files = {name: linear_onnx(folder / f"{name}.onnx", rng.normal(size=(FEATURES, CLASSES)),
                               rng.normal(size=CLASSES), ("N", FEATURES))
             for name in ("1.0", "1.1", "1.2")}
    np.savez(folder / "eval.npz", x=rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32),
             y=rng.integers(0, CLASSES, SAMPLES))
    return {**files, "eval": folder / "eval.npz"}


def mint(env: dict[str, str], name: str, scopes: str) -> str:
    """A token minted by the server's admin with `flipgate token create`."""
    created = subprocess.run([sys.executable, "-m", "flipgate.cli", "token", "create", "--name",
                              name, "--scopes", scopes], env=env, check=True,
                             capture_output=True, text=True)
    return created.stdout.strip()


def ready(address: str) -> bool:
    try:
        return httpx.get(f"{address}/readyz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def run_flow(flow: Flow, models: dict[str, Path], receivers: str) -> None:
    for version in ("1.0", "1.1", "1.2"):
        assert flow.call("POST", "/models", data={"name": "digits", "version": version},
                         files={"artifact": ("m.onnx", models[version].read_bytes())}
                         ).status_code == 201
    assert flow.call("POST", "/evalsets", data={"name": "eval"}, files={
        "data": ("eval.npz", models["eval"].read_bytes())}).status_code == 201
    served_by_both(flow)
    assert flow.call("GET", "/models/{name}", path={"name": "nope"}).status_code == 404
    assert flow.call("GET", "/no/such/route").status_code == 404
    assert flow.call("GET", "/models", WRONG_TOKEN).status_code == 401
    assert flow.call("GET", "/models", flow.secrets["metrics token"]).status_code == 403
    assert flow.call("PUT", "/evalsets/{name}", path={"name": "big"}, content=bytes(2 << 20),
                     headers={"Content-Type": "application/octet-stream"}).status_code == 413
    sign_in(flow)
    flow.secrets["callback URL token"] = CALLBACK_TOKEN
    approved = flow.call("POST", "/gate", json={
        "model": "digits", "candidate": "1.0",
        "callback_url": f"{receivers}/ok?token={CALLBACK_TOKEN}"}).json()
    assert approved["verdict"] == "approve", approved
    assert flow.call("POST", "/models/{name}/aliases/{alias}",
                     path={"name": "digits", "alias": "production"},
                     json={"version": "1.0"}).status_code == 200
    assert flow.call("PUT", "/models/{name}/policy", path={"name": "digits"},
                     json={"max_nfr": 0.0, "evalsets": ["eval"]}).status_code == 200
    flow.decisions = {"approve": approved, "block": gate_signed(flow, receivers)}
    lose_artifact(flow, models["1.2"])  # its inference job fails
    failed = flow.call("POST", "/compare/{old}/{new}", path={"old": "digits:1.0",
                                                             "new": "digits:1.2"},
                       params={"evalset": "eval"})
    assert failed.status_code == 202, failed.text
    wait_for(lambda: all(job_state(flow, job_id) not in ("queued", "running")
                         for job_id in failed.json()["job_ids"]), "the failing comparison")
    wait_for(lambda: all(callback_state(flow, decision) != "queued"
                         for decision in flow.decisions.values()), "the callbacks")


def lose_artifact(flow: Flow, model: Path) -> None:
    """Remove a registered model's file from the server's artifact store."""
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    (flow.folder / "data" / "artifacts" / "sha256" / digest[:2] / digest[2:]).unlink()


def served_by_both(flow: Flow) -> None:
    """Requests at once, on new connections, until both API processes have served some (as
    many as one process admits at once, so few if any are answered 503 server_busy)."""
    def burst() -> bool:
        threads = [threading.Thread(target=flow.call, args=("GET", "/models"))
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return len({path.stem.rsplit("_", 1)[1]
                    for path in (flow.folder / "prometheus").glob("counter_*.db")}) == 2
    wait_for(burst, "both API processes to serve requests", timeout=30)


def sign_in(flow: Flow) -> None:
    """A dashboard sign-in: its session cookie is one more secret."""
    signed_in = flow.call("POST", "/ui/signin", None, data={"token": ADMIN},
                          follow_redirects=False)
    assert signed_in.status_code == 303, signed_in.text
    flow.secrets["session cookie"] = signed_in.cookies[COOKIE]
    assert flow.call("GET", "/ui", None, cookies=dict(signed_in.cookies)).status_code == 200


def gate_signed(flow: Flow, receivers: str) -> dict:
    """The CI's gate of 1.1, signed with the line's webhook secret, with its own request id;
    it blocks once measured, and its callback fails."""
    secret = flow.call("POST", "/models/{name}/webhook-secret", path={"name": "digits"})
    flow.secrets["webhook secret"] = secret.json()["secret"]
    body = json.dumps({"model": "digits", "candidate": "1.1",
                       "callback_url": f"{receivers}/fail"}).encode()
    flow.secrets["signature"] = signature(flow.secrets["webhook secret"], body)
    pending = flow.call("POST", "/gate", None, content=body, headers={
        "Content-Type": "application/json", "X-Request-ID": GATE_REQUEST_ID,
        "X-Flipgate-Signature-256": flow.secrets["signature"]})
    assert pending.status_code == 202, pending.text
    flow.echoed_request_id = pending.headers["X-Request-ID"]
    flow.gate_job_ids = pending.json()["waiting_for"]
    decision_id = pending.json()["decision_id"]
    return wait_for(lambda: (decision := flow.call(
        "GET", "/gate/decisions/{decision_id}", path={"decision_id": decision_id}).json())[
        "verdict"] != "pending" and decision, "the blocking verdict")


def job_state(flow: Flow, job_id: int) -> str:
    return flow.call("GET", "/jobs/{job_id}", path={"job_id": job_id}).json()["state"]


def callback_state(flow: Flow, decision: dict) -> str:
    return flow.call("GET", "/gate/decisions/{decision_id}", path={
        "decision_id": decision["decision_id"]}).json()["callback"]["state"]


def job_request_ids(database_url: str) -> dict[int, str | None]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return dict(connection.execute(text("SELECT id, request_id FROM jobs")).all())
    finally:
        engine.dispose()


def changes(flow: Flow, kind: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of the metric type `kind` whose value the flow changed, by how much."""
    return {(name, labels): value - flow.before.get((kind, name, labels), 0.0)
            for (type_, name, labels), value in flow.after.items()
            if type_ == kind and value != flow.before.get((kind, name, labels), 0.0)}


def sample(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset(labels.items())


def test_every_counter_changes_by_exactly_what_the_flow_did(flow):
    expected = {sample("flipgate_http_requests_total", method=method, route=route,
                       status=status): float(count)
                for (method, route, status), count in flow.counted.items()}
    expected = {**unrouted(expected), **expected,
                sample("flipgate_auth_refusals_total", reason="invalid_token"): 1.0,
                sample("flipgate_auth_refusals_total", reason="missing_scope"): 1.0,
                sample("flipgate_admission_refusals_total", reason="payload_too_large"): 1.0,
                sample("flipgate_gate_decisions_total", verdict="approve"): 1.0,
                sample("flipgate_gate_decisions_total", verdict="block"): 1.0,
                sample("flipgate_callback_deliveries_total", outcome="delivered"): 1.0,
                sample("flipgate_callback_deliveries_total", outcome="failed"): 1.0,
                sample("flipgate_callback_failed_attempts_total"): 1.0,
                **{sample("flipgate_jobs_total", kind=kind, state=state): float(count)
                   for (kind, state), count in EXPECTED_JOBS.items()}}
    if busy := flow.counted[("GET", "/models", "503")]:  # a burst of served_by_both's
        expected[sample("flipgate_admission_refusals_total", reason="server_busy")] = busy
    assert changes(flow, "counter") == expected


def unrouted(expected: dict) -> dict:
    """The route label of the path no route serves."""
    key = sample("flipgate_http_requests_total", method="GET", route="/no/such/route",
                 status="404")
    return {sample("flipgate_http_requests_total", method="GET", route="unmatched",
                   status="404"): expected.pop(key)}


# the flow's jobs: inference of 1.0 and 1.1, their metrics (the blocked gate) and the line's
# matrix that follows; inference of 1.2, whose model file is gone, and the metrics job that
# waited for it (cancelled)
EXPECTED_JOBS = {("inference", "succeeded"): 2, ("metrics", "succeeded"): 1,
                 ("matrix", "succeeded"): 1, ("inference", "failed"): 1,
                 ("metrics", "cancelled"): 1}


def test_the_histograms_count_each_request_job_and_verdict(flow):
    counts = {(name, labels): value for (name, labels), value in changes(
        flow, "histogram").items() if name.endswith("_count")}
    by_route = Counter()
    for (method, route, _status), count in flow.counted.items():
        by_route[(method, "unmatched" if route == "/no/such/route" else route)] += count
    assert {key: value for key, value in counts.items()
            if key[0] == "flipgate_http_request_duration_seconds_count"} == {
        sample("flipgate_http_request_duration_seconds_count", method=method, route=route):
        float(count) for (method, route), count in by_route.items() if count}
    assert counts[sample("flipgate_time_to_verdict_seconds_count")] == 2.0
    ran = {"inference": 3.0, "metrics": 1.0}  # the cancelled metrics job never started
    for kind, count in ran.items():
        assert counts[sample("flipgate_job_duration_seconds_count", kind=kind)] == count
        assert counts[sample("flipgate_job_queue_wait_seconds_count", kind=kind)] == count


def test_the_gauges_show_an_idle_server_with_its_worker_and_dependencies(flow):
    gauges = {(name, labels): value for (kind, name, labels), value in flow.after.items()
              if kind in ("gauge", "info")}
    assert {labels: value for (name, labels), value in gauges.items()
            if name == "flipgate_dependency_up"} == {
        frozenset({("dependency", name)}): 1.0 for name in ("database", "broker",
                                                              "artifact_store")}
    assert {dict(labels)["queue"]: value for (name, labels), value in gauges.items()
            if name == "flipgate_workers_alive"} == {"gpu": 1.0, "default": 1.0,
                                                     "callbacks": 1.0}
    idle = {(name, labels): value for (name, labels), value in gauges.items()
            if name in ("flipgate_jobs_queued", "flipgate_jobs_running",
                        "flipgate_oldest_queued_job_age_seconds",
                        "flipgate_gate_decisions_pending", "flipgate_callbacks_queued")}
    assert len(idle) == 2 * 5 + 3 and not any(idle.values())  # queued, running: 5 kinds


def test_one_request_id_joins_the_gate_its_jobs_worker_lines_and_its_callback(flow):
    assert flow.echoed_request_id == GATE_REQUEST_ID
    assert flow.gate_job_ids and {flow.job_request_ids[job_id] for job_id in
                                  flow.gate_job_ids} == {GATE_REQUEST_ID}
    lines = log_lines(flow)
    access = [line for line in lines if line.get("route") == "/gate"
              and line.get("request_id") == GATE_REQUEST_ID]
    assert len(access) == 1 and access[0]["process"] == "api"
    worker_lines = [line for line in lines if line["process"] == "worker"
                    and line.get("request_id") == GATE_REQUEST_ID]
    for job_id in flow.gate_job_ids:
        assert {f"job {job_id} started", f"job {job_id} ended"} <= {
            line["message"].rsplit(" in ", 1)[0] for line in worker_lines}
    failed = [headers for path, headers in flow.callbacks if path == "/fail"]
    assert [headers.get("X-Request-ID") for headers in failed] == [GATE_REQUEST_ID]


def test_every_line_is_json_and_no_line_holds_a_secret(flow):
    raw = (flow.folder / "serve.log").read_text()
    assert {line for line in raw.splitlines() if line and not line.startswith("{")} <= {
        "worker: Warm shutdown (MainProcess)"}  # printed by Celery itself, not logged
    lines = log_lines(flow)
    assert {line["process"] for line in lines} >= {"api", "worker", "sweeper"}
    assert len({line["pid"] for line in lines if line["process"] == "api"}) >= 2
    assert len(flow.secrets) == 10
    assert [name for name, secret in flow.secrets.items() if secret in raw] == []


def log_lines(flow: Flow) -> list[dict]:
    """serve.log's JSON lines."""
    return [json.loads(line) for line in (flow.folder / "serve.log").read_text().splitlines()
            if line.startswith("{")]


def test_serve_stops_its_api_processes_and_its_worker_on_sigterm(flow):
    assert flow.exit_code == 0
    assert len(flow.children) >= 3  # two API processes and the worker (and uvicorn's helpers)
    assert not flow.orphans
