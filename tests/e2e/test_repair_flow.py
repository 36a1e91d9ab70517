"""Repair without retraining, end to end on `flipgate serve` (embedded: SQLite, folder broker,
its own worker) with real MNIST digits: a fine-tuned update (the old model warm-started, as
`flipgate train --init` does, and trained on twice the digits) is blocked for its negative
flips, and the server's interpolation repair, tuned on calibration digits the gate does not
decide on, turns it into an approved version that can be promoted."""

from pathlib import Path

import httpx
import pytest
import torch

from flipgate.datasets import mnist_digits, save_evalset, split
from flipgate.formats.evalsets import EvalSet, load_evalset
from flipgate.inference import OnnxClassifier
from flipgate.metrics import compare_logits
from flipgate.processes import free_port
from flipgate.repair import interpolate_graph
from flipgate.repair.graphs import logits_of
from flipgate.train.config import TrainConfig
from flipgate.train.recipes import train
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for, wait_for_jobs
from tests.e2e.test_gate_flow import final, post, ready

TOKEN = "e2e-repair-admin-token-0123456789"
MAX_NFR = 0.01
CALIBRATION_MAX_NFR = 0.007  # stricter on the calibration digits than the gate is on eval
OLD_DIGITS = 800
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory) -> dict[str, Path]:
    """Of 2,500 training digits: the old mlp learns the first 800, the new one starts from
    its weights and learns the first 1,600, the last 900 calibrate; 2,500 others evaluate."""
    folder = tmp_path_factory.mktemp("fine_tuned")
    training, evaluation = split(mnist_digits(), 2500, seed=0)

    def digits(start: int, stop: int) -> EvalSet:
        return EvalSet(training.x[start:stop], training.y[start:stop])

    files = {"eval": save_evalset(evaluation, folder / "eval.npz"),
             "calibration": save_evalset(digits(2 * OLD_DIGITS, training.n),
                                         folder / "calibration.npz")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small mlp: more threads only contend on a shared CPU
    try:
        files["1"] = train("baseline", "mlp:hidden=128", digits(0, OLD_DIGITS), 10,
                           TrainConfig(epochs=10, seed=0)).save(folder / "old.onnx", (28, 28))
        files["2"] = train("baseline", "mlp:hidden=128", digits(0, 2 * OLD_DIGITS), 10,
                           TrainConfig(epochs=10, seed=1), init=files["1"]).save(
            folder / "new.onnx", (28, 28))
    finally:
        torch.set_num_threads(threads)
    return files


def test_an_interpolation_repair_turns_a_blocked_fine_tuned_update_into_an_approved_one(
        tmp_path, fine_tuned):
    port = free_port()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(tmp_path / "data"), FLIPGATE_ADMIN_TOKEN=TOKEN)
    with (flipgate_process(["serve", "--port", str(port)], env, tmp_path),
          httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        wait_for(lambda: ready(client), "/readyz")
        register(client, fine_tuned)
        blocked = final(client, client.post("/gate", json={"model": "mnist", "candidate": "2"})
                        .json()["decision_id"])
        assert [reason["code"] for reason in blocked["reasons"]] == ["max_nfr"], blocked
        gamed = client.post(f"/gate/decisions/{blocked['decision_id']}/repair",
                            json={"method": "interpolate", "calibration": "eval"})
        assert gamed.status_code == 422
        assert gamed.json()["error"]["code"] == "calibration_is_gated"

        repaired = repair(client, blocked["decision_id"])
        assert repaired["verdict"] == "approve", repaired["reasons"]
        assert repaired["repair_of"] == blocked["decision_id"] and repaired["baseline"] == "1"
        version = client.get("/models/mnist/versions/2-interpolate").json()
        produced = version["produced_by"]
        assert produced["method"] == "interpolate" and produced["repair_of"] == "2"
        assert produced["calibration"] == "calibration" and 0 < produced["alpha"] < 1
        assert produced["limits"] == {"max_nfr": CALIBRATION_MAX_NFR, "max_er_increase": 0.0}
        assert len(produced["curve"]) > 20
        assert_is_the_interpolation(repaired["metrics"]["eval"], produced["alpha"], fine_tuned)
        promoted = client.post("/models/mnist/aliases/production",
                               json={"version": "2-interpolate"})
        assert promoted.is_success, promoted.text


def register(client: httpx.Client, files: dict[str, Path]) -> None:
    """The eval and calibration sets, version 1 approved and promoted, version 2, and a
    policy of NFR ≤ MAX_NFR and no error increase on `eval`."""
    for name in ("eval", "calibration"):
        post(client, "/evalsets", {"name": name}, "data", files[name])
    for version in ("1", "2"):
        post(client, "/models", {"name": "mnist", "version": version}, "artifact", files[version])
    assert client.post("/gate", json={"model": "mnist", "candidate": "1"}).json()[
        "verdict"] == "approve"
    assert client.post("/models/mnist/aliases/production", json={"version": "1"}).is_success
    policy = {"max_nfr": MAX_NFR, "max_er_increase": 0.0, "evalsets": ["eval"]}
    assert client.put("/models/mnist/policy", json=policy).is_success


def repair(client: httpx.Client, decision_id: int) -> dict:
    """Repair by interpolation and return the decision on the repaired version once final."""
    response = client.post(f"/gate/decisions/{decision_id}/repair", json={
        "method": "interpolate", "calibration": "calibration", "max_nfr": CALIBRATION_MAX_NFR})
    assert response.status_code == 202, response.text
    job = wait_for_jobs(client, [response.json()["job"]["id"]])[0]
    assert job["progress"] == 1.0 and job["result"]["repaired_decision_id"] == decision_id
    return final(client, job["result"]["decision_id"])


def assert_is_the_interpolation(measured: dict, alpha: float, files: dict[str, Path]) -> None:
    """The server gated θ(α) of the two files: its numbers are those of the interpolation
    built here, and it breaks fewer samples than the fine-tuned model within the limit."""
    evaluation = load_evalset(files["eval"])
    old, new = (OnnxClassifier(files[version]).predict(evaluation.x) for version in ("1", "2"))
    fixed = logits_of(interpolate_graph(files["1"], files["2"], alpha), evaluation.x)
    expected = compare_logits(old, fixed, evaluation.y)
    assert measured["nfr"] == pytest.approx(expected["nfr"])
    assert measured["er_increase"] == pytest.approx(expected["er_new"] - expected["er_old"])
    untreated = compare_logits(old, new, evaluation.y)["nfr"]
    assert measured["nfr"] <= MAX_NFR < untreated
