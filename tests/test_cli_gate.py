"""`flipgate gate` against a real server: the app under uvicorn in a thread of this process,
on a migrated SQLite store; logits are uploaded, and the metrics jobs of the pairs run in this
process with the worker's task, so no worker process is needed."""

import hashlib
import io
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn

from flipgate.gate_client import Credentials, GateClient, ci_context
from flipgate.processes import free_port
from service.auth.service import create_token
from service.celery_app import create_celery_app
from service.config import Settings
from service.db import settings_session
from service.main import create_app
from service.migrate import upgrade
from tests.conftest import linear_onnx
from tests.reasons import rate_figures
from worker import runtime, tasks
from worker.runtime import WorkerContext

ADMIN_TOKEN = "test-admin-token-0123456789"
FEATURES, CLASSES, SAMPLES = 4, 3, 200
START_SECONDS = 20


@dataclass(frozen=True)
class Gate:
    """A running server with the line `digits`: 1.0 (no production yet), 1.1 that flips
    many of 1.0's right answers, 1.2 equal to 1.0 and 1.3 without logits; eval set `eval`
    and the policy max_nfr 0.01."""

    url: str
    token: str
    secret: str
    admin: httpx.Client

    def args(self, *args: str) -> list[str]:
        return ["gate", "--server", self.url, "--model", "digits", "--poll", "0.05", *args]


@contextmanager
def serve(app, port: int) -> Iterator[str]:
    """Run `app` under uvicorn in a daemon thread; yields its URL once it has started."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_SECONDS
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def register(admin: httpx.Client, folder: Path, settings: Settings) -> None:
    """The line's versions, eval set, logits and policy (see Gate)."""
    rng = np.random.default_rng(0)
    labels = np.arange(SAMPLES) % CLASSES
    evalset = folder / "eval.npz"
    np.savez(evalset, x=rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32), y=labels)
    checked(admin.post("/evalsets", data={"name": "eval"},
                       files={"data": ("eval.npz", evalset.read_bytes())}))
    right = np.eye(CLASSES)[labels] * 5
    every_fourth_flipped = np.eye(CLASSES)[(labels + (np.arange(SAMPLES) % 4 == 0)) % CLASSES] * 5
    logits = {"1.0": right, "1.1": every_fourth_flipped, "1.2": right, "1.3": None}
    for version, array in logits.items():
        model = linear_onnx(folder / f"{version}.onnx", rng.normal(size=(FEATURES, CLASSES)),
                            rng.normal(size=CLASSES), ("N", FEATURES))
        checked(admin.post("/models", data={"name": "digits", "version": version},
                           files={"artifact": ("model.onnx", model.read_bytes())}))
        if array is not None:
            checked(admin.post(f"/models/digits/versions/{version}/predictions",
                               data={"evalset": "eval"},
                               files={"logits": ("logits.npy", npy(array))}))
    context = WorkerContext.from_settings(settings, create_celery_app(settings))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime, "context", lambda: context)
        for version in ("1.1", "1.2"):
            tasks.metrics(checked(admin.post(f"/compare/digits:1.0/digits:{version}",
                                             params={"evalset": "eval"}))["job_id"])
    checked(admin.put("/models/digits/policy", json={"max_nfr": 0.01, "evalsets": ["eval"]}))


def checked(response: httpx.Response) -> dict:
    assert response.is_success, response.text
    return response.json()


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> Iterator[Gate]:
    folder = tmp_path_factory.mktemp("gate")
    settings = Settings(data_dir=folder / "data", admin_token=ADMIN_TOKEN)
    upgrade(settings)
    with settings_session(settings) as session:
        token = create_token(session=session, name="ci", scopes=["gate"])[1]
    with (serve(create_app(settings), free_port()) as url,
          httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                       timeout=30) as admin):
        register(admin, folder, settings)
        secret = checked(admin.post("/models/digits/webhook-secret"))["secret"]
        yield Gate(url, token, secret, admin)


@pytest.fixture(autouse=True)
def no_ci_environment(monkeypatch) -> None:
    """Credentials and CI fields come from each test's arguments only."""
    for name in ("FLIPGATE_TOKEN", "FLIPGATE_WEBHOOK_SECRET", "GITHUB_ACTIONS", "GITLAB_CI"):
        monkeypatch.delenv(name, raising=False)


def test_the_first_version_is_approved(gate, run_cli):
    result = run_cli(*gate.args("--candidate", "1.0", "--token", gate.token))
    assert result.code == 0, result.err
    assert result.out.startswith("APPROVE: digits:1.0 against no baseline")
    assert "  [note] the line has no production version" in result.out


def test_an_update_without_new_flips_is_approved_with_its_metrics(gate, run_cli):
    result = run_cli(*gate.args("--candidate", "1.2", "--baseline", "1.0", "--token",
                                gate.token))
    assert result.code == 0, result.err
    assert "eval: NFR 0.00% (0 of 200), churn 0.00%" in result.out
    assert "report: http://127.0.0.1" in result.out


def test_flips_above_the_policy_block_with_the_reason(gate, run_cli):
    result = run_cli(*gate.args("--candidate", "1.1", "--baseline", "1.0", "--token",
                                gate.token))
    assert result.code == 1, result.err
    assert result.out.startswith("BLOCK: digits:1.1 against digits:1.0")
    [reason] = [line for line in result.out.splitlines() if "[blocking]" in line]
    assert reason.startswith("  [blocking] on eval: NFR ")  # every fourth sample flipped
    nfr, (low, high), limit = rate_figures(reason)
    assert (nfr, limit) == (pytest.approx(SAMPLES // 4 / SAMPLES, abs=5e-5), 0.01)
    assert low < nfr < high


def test_json_prints_the_decision_with_the_ci_context(gate, run_cli, monkeypatch):
    monkeypatch.setenv("FLIPGATE_TOKEN", gate.token)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/digits")
    monkeypatch.setenv("GITHUB_SHA", "abc123")
    result = run_cli(*gate.args("--candidate", "1.1", "--baseline", "1.0", "--json",
                                "--ci-ref", "refs/heads/main"))
    assert result.code == 1
    decision = json.loads(result.out)
    assert decision["verdict"] == "block" and decision["requested_by"] == "ci"
    assert decision["ci"] == {"provider": "github", "repo": "acme/digits", "sha": "abc123",
                              "ref": "refs/heads/main"}


def test_a_signed_request_needs_no_token(gate, run_cli):
    result = run_cli(*gate.args("--candidate", "1.1", "--baseline", "1.0", "--secret",
                                gate.secret))
    assert result.code == 1, result.err
    assert "[blocking]" in result.out


def test_a_wrong_secret_is_refused_with_the_servers_code(gate, run_cli):
    result = run_cli(*gate.args("--candidate", "1.1", "--secret", "not-the-secret"))
    assert result.code == 2
    assert result.err.startswith("flipgate gate: error: HTTP 401 invalid_signature: ")


def test_an_unknown_model_is_refused(gate, run_cli):
    result = run_cli("gate", "--server", gate.url, "--model", "nope", "--candidate", "1",
                     "--token", gate.token)
    assert result.code == 2
    assert result.err.startswith("flipgate gate: error: HTTP 404 ")


def test_no_credentials_is_a_usage_error(gate, run_cli):
    result = run_cli(*gate.args("--candidate", "1.0"))
    assert (result.code, result.out) == (2, "")
    assert "give --token" in result.err


@pytest.mark.parametrize("credential", ["--token", "--secret"])
def test_a_pending_decision_times_out_then_is_polled_to_its_verdict(gate, run_cli,
                                                                    credential):
    """1.3 has no logits: the decision waits for jobs no worker runs (exit 3); once they are
    cancelled, the same delivery is polled to its verdict, a block."""
    value = gate.token if credential == "--token" else gate.secret
    args = gate.args("--candidate", "1.3", "--baseline", "1.0", credential, value,
                     "--delivery", f"pending-{credential}")
    timed_out = run_cli(*args, "--timeout", "0")
    assert timed_out.code == 3
    decision_id = int(timed_out.err.rsplit("decision ", 1)[1])
    assert timed_out.err == (f"flipgate gate: error: still pending after 0 s; "
                             f"decision {decision_id}\n")
    pending = checked(gate.admin.get(f"/gate/decisions/{decision_id}"))
    for job_id in pending["waiting_for"]:  # 409: cancelled with the job it waited for
        assert gate.admin.post(f"/jobs/{job_id}/cancel").status_code in (200, 409)
    result = run_cli(*args, "--timeout", "3")
    assert result.code == 1, result.err
    assert f"(decision {decision_id}," in result.out and "[blocking]" in result.out


def test_transport_errors_and_5xx_are_retried_with_the_same_delivery():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers["X-Flipgate-Delivery"],
                     request.headers["X-Flipgate-Signature-256"], request.content))
        if len(seen) == 1:
            raise httpx.ConnectError("refused")
        if len(seen) == 2:
            return httpx.Response(503, text="busy")
        return httpx.Response(200, json={"decision_id": 1, "verdict": "approve"})

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://gate")
    client = GateClient(http, Credentials(secret="s"), backoff=0)
    assert client.post_gate(b'{"model":"m"}', "d-1")["verdict"] == "approve"
    assert len(seen) == 3 and len(set(seen)) == 1


def test_command_line_ci_fields_win_over_gitlabs():
    env = {"GITLAB_CI": "true", "CI_PROJECT_PATH": "g/p", "CI_COMMIT_SHA": "f00",
           "CI_JOB_URL": "https://gitlab/j/1"}
    assert ci_context({"sha": "bar"}, env) == {"provider": "gitlab", "repo": "g/p",
                                               "sha": "bar", "run_url": "https://gitlab/j/1"}
    assert ci_context({}, {}) is None


def test_upload_logits_puts_the_file_as_the_raw_body(gate, run_cli, tmp_path):
    checked(gate.admin.post("/models", data={"name": "digits", "version": "llm"}))
    scores = np.random.default_rng(1).normal(size=(SAMPLES, CLASSES)).astype(np.float32)
    path = tmp_path / "llm.npy"
    np.save(path, scores)
    result = run_cli("upload", "logits", "digits:llm", path, "--evalset", "eval",
                     "--server", gate.url, "--token", ADMIN_TOKEN, "--json")
    assert result.code == 0, result.err
    record = json.loads(result.out)
    assert record["logits_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    wrong = run_cli("upload", "logits", "digits:llm", path, "--evalset", "nope",
                    "--server", gate.url, "--token", ADMIN_TOKEN)
    assert wrong.code == 2 and "dataset_not_found" in wrong.err


def test_upload_model_and_evalset_put_the_files_as_raw_bodies(gate, run_cli, tmp_path):
    rng = np.random.default_rng(2)
    model = linear_onnx(tmp_path / "1.9.onnx", rng.normal(size=(FEATURES, CLASSES)),
                        rng.normal(size=CLASSES), ("N", FEATURES))
    result = run_cli("upload", "model", "digits:1.9", model, "--parent", "digits:1.0",
                     "--metadata", '{"owner": "ci"}', "--server", gate.url, "--token",
                     ADMIN_TOKEN, "--json")
    assert result.code == 0, result.err
    record = json.loads(result.out)
    assert record["artifact_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert record["metadata"] == {"owner": "ci"}
    assert record["parent_id"] == checked(gate.admin.get("/models/digits/versions/1.0"))["id"]
    evalset = tmp_path / "more.npz"
    np.savez(evalset, x=rng.normal(size=(12, FEATURES)).astype(np.float32),
             y=np.arange(12) % CLASSES)
    result = run_cli("upload", "evalset", "more", evalset, "--server", gate.url, "--token",
                     ADMIN_TOKEN)
    assert result.code == 0, result.err
    assert result.out.strip() == "registered eval set more: 12 samples, 3 classes"
    again = run_cli("upload", "evalset", "more", evalset, "--server", gate.url, "--token",
                    ADMIN_TOKEN)
    assert again.code == 2 and "dataset_exists" in again.err
    np.savez(tmp_path / "traffic.npz", x=rng.normal(size=(9, FEATURES)).astype(np.float32))
    traffic = run_cli("upload", "evalset", "traffic", tmp_path / "traffic.npz", "--server",
                      gate.url, "--token", ADMIN_TOKEN)
    assert traffic.code == 0, traffic.err
    assert traffic.out.strip() == "registered traffic set traffic: 9 samples, no labels yet"
