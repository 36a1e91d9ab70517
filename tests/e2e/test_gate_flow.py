"""The deploy gate end to end on `flipgate serve` (embedded: SQLite, folder broker, its own
worker) with real models trained on scikit-learn's digits: a pending decision becomes final
when the worker's measurements end and its status reaches a callback server on loopback
(after one failed delivery), a replayed delivery answers with the same decision, promotion
is refused without an approval, and an ELODI repair produces an approved version."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from flipgate.formats.evalsets import load_evalset
from flipgate.inference import OnnxClassifier
from flipgate.metrics import compare_logits
from flipgate.processes import free_port
from flipgate.signing import signature, signature_matches
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for, wait_for_jobs

TOKEN = "e2e-gate-admin-token-0123456789"
MAX_NFR = 0.06
pytestmark = pytest.mark.slow


class StatusReceiver(BaseHTTPRequestHandler):
    """Records each POSTed status; answers 500 to the first one, 200 afterwards."""

    received: ClassVar[list[tuple[dict, str | None, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((json.loads(body), self.headers.get("X-Flipgate-Signature-256"),
                              body))
        self.send_response(500 if len(self.received) == 1 else 200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def receiver():
    """A loopback HTTP server collecting callback deliveries."""
    StatusReceiver.received = []
    server = HTTPServer(("127.0.0.1", 0), StatusReceiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/status", StatusReceiver.received
    server.shutdown()


def register(client: httpx.Client, files: dict[str, Path]) -> None:
    """The data sets, and versions 1 and 2 with their run records as metadata."""
    for endpoint, name in (("/evalsets", "eval"), ("/trainsets", "train")):
        post(client, endpoint, {"name": name}, "data", files[name])
    assert client.put("/models/digits/training-dataset", json={"dataset": "train"}).status_code \
        == 404  # the line does not exist before its first version
    for version in ("1", "2"):
        record = files[version].with_suffix(".json").read_text()
        post(client, "/models", {"name": "digits", "version": version,
                                 "metadata": json.dumps({"record": json.loads(record)})},
             "artifact", files[version])
    assert client.put("/models/digits/training-dataset", json={"dataset": "train"}).is_success


def post(client: httpx.Client, path: str, fields: dict, file_field: str, file: Path) -> None:
    response = client.post(path, data=fields, files={file_field: (file.name, file.read_bytes())})
    assert response.status_code == 201, response.text


def final(client: httpx.Client, decision_id: int) -> dict:
    """The decision once it is no longer pending."""
    return wait_for(lambda: (decision := client.get(f"/gate/decisions/{decision_id}").json())
                    ["verdict"] != "pending" and decision, f"decision {decision_id}", 180)


def test_gate_blocks_calls_back_and_a_repair_is_approved(tmp_path, digits, receiver):
    callback_url, received = receiver
    port = free_port()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(tmp_path / "data"), FLIPGATE_ADMIN_TOKEN=TOKEN,
                       FLIPGATE_CALLBACK_BACKOFF_SECONDS="0.2",
                       FLIPGATE_CALLBACK_ALLOWLIST="127.0.0.1",  # the receiver is on loopback
                       FLIPGATE_PUBLIC_URL=f"http://127.0.0.1:{port}")  # links in callbacks
    with (flipgate_process(["serve", "--port", str(port)], env, tmp_path),
          httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        wait_for(lambda: ready(client), "/readyz")
        register(client, digits)
        assert client.post("/gate", json={"model": "digits", "candidate": "1"}).json()[
            "verdict"] == "approve"
        assert client.post("/models/digits/aliases/production", json={"version": "1"}).is_success
        client.put("/models/digits/policy", json={"max_nfr": MAX_NFR, "evalsets": ["eval"]})
        secret = client.post("/models/digits/webhook-secret").json()["secret"]

        blocked = gate_signed(client, secret, callback_url, delivery="ci-run-1")
        assert blocked["verdict"] == "pending" and blocked["waiting_for"]
        blocked = final(client, blocked["decision_id"])
        assert_blocked_with_measured_nfr(blocked, digits)
        replayed = gate_signed(client, secret, callback_url, delivery="ci-run-1")
        assert without_callback(replayed) == without_callback(blocked)  # delivery may advance
        refused = client.post("/models/digits/aliases/production", json={"version": "2"})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_approved"
        assert_status_delivered(client, blocked, received, secret, "failure")

        repaired = repair(client, blocked["decision_id"])
        assert repaired["verdict"] == "approve", repaired["reasons"]
        assert repaired["repair_of"] == blocked["decision_id"] and repaired["baseline"] == "1"
        assert repaired["metrics"]["eval"]["nfr"] <= MAX_NFR
        version = client.get(f"/models/digits/versions/{repaired['candidate']}").json()
        assert version["produced_by"]["method"] == "elodi"
        assert version["produced_by"]["record"]["options"]["legacy_weight"] == 0.5
        promoted = client.post("/models/digits/aliases/production",
                               json={"version": repaired["candidate"]})
        assert promoted.is_success, promoted.text
        wait_for(lambda: len(received) == 3, "the repaired decision's status")
        assert received[2][0]["state"] == "success"


def without_callback(decision: dict) -> dict:
    return {key: value for key, value in decision.items() if key != "callback"}


def ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def gate_signed(client: httpx.Client, secret: str, callback_url: str, delivery: str) -> dict:
    """POST /gate as a CI system would: no token, an HMAC signature and a delivery id."""
    body = json.dumps({"model": "digits", "candidate": "2", "callback_url": callback_url,
                       "ci": {"provider": "github", "repo": "acme/digits", "sha": "f00d"}})
    response = client.post("/gate", content=body.encode(), headers={
        "Authorization": "", "Content-Type": "application/json",
        "X-Flipgate-Signature-256": signature(secret, body.encode()),
        "X-Flipgate-Delivery": delivery})
    assert response.status_code in (200, 202), response.text
    return response.json()


def assert_blocked_with_measured_nfr(decision: dict, digits: dict[str, Path]) -> None:
    """Blocked for NFR, with the NFR flipgate.metrics finds on the two ONNX models."""
    evaluation = load_evalset(digits["eval"])
    logits = [OnnxClassifier(digits[version]).predict(evaluation.x) for version in ("1", "2")]
    expected = compare_logits(*logits, evaluation.y)["nfr"]
    assert decision["verdict"] == "block"
    assert decision["requested_by"] == "webhook" and decision["ci"]["sha"] == "f00d"
    assert [(reason["code"], reason["blocking"]) for reason in decision["reasons"]] == [
        ("max_nfr", True)]
    assert decision["reasons"][0]["measured"] == pytest.approx(expected) and expected > MAX_NFR


def assert_status_delivered(client: httpx.Client, decision: dict, received: list,
                            secret: str, state: str) -> None:
    """The status reached the receiver, signed, on the second attempt (the first got 500)."""
    wait_for(lambda: len(received) == 2, "the callback to be retried")
    status, header, raw = received[1]
    assert status == {"state": state, "context": "flipgate/digits",
                      "target_url": decision["report_url"], "description": status["description"]}
    assert status["description"].startswith("flipgate blocks digits:2 over 1: on eval: NFR")
    assert signature_matches(secret, raw, header)
    callback = wait_for(lambda: (body := client.get(
        f"/gate/decisions/{decision['decision_id']}").json()["callback"])["state"]
        == "delivered" and body, "the callback to be recorded")
    assert callback["attempts"] == 2 and callback["last_status"] == 200


def repair(client: httpx.Client, decision_id: int) -> dict:
    """Repair with ELODI (10 epochs: the candidate's record says 1) and return the decision
    on the repaired version once final."""
    response = client.post(f"/gate/decisions/{decision_id}/repair",
                           json={"method": "elodi", "config": {"epochs": 10}})
    assert response.status_code == 202, response.text
    job = wait_for_jobs(client, [response.json()["job"]["id"]])[0]
    assert job["progress"] == 1.0 and job["result"]["repaired_decision_id"] == decision_id
    return final(client, job["result"]["decision_id"])
