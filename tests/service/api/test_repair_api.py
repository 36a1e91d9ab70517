"""Repairs on the ONNX files over HTTP: interpolation and the ensemble fallback of a blocked
candidate, tuned on a calibration eval set the gate does not decide on.

The line `digits` holds two linear classifiers of one graph (versions 1 and 2) and a
two-layer one (version 3); hand-made logits on `ev` block 1 → 2 and 1 → 3 (10 negative
flips in 100 samples against a policy of NFR ≤ 0.05). The jobs run in this process on the
real database, artifact store and ONNX Runtime.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from sqlalchemy import func, select

from service.gate import repair_requests
from service.jobs.models import Job
from service.registry.models import ModelVersion
from tests.conftest import save_graph
from tests.service.api.conftest import (
    error_code,
    measure,
    post_evalset,
    post_logits,
    post_model,
    shared_store,
)
from tests.service.api.test_gate_api import CLASSES, N, gate, logits_wrong_on
from tests.service.conftest import FEATURES, write_npz, write_onnx
from worker import training


def two_layer_onnx(path, seed: int):
    """A classifier of another graph than the linear ones: relu(x @ w1) @ w2 + b."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["rw"]),
         helper.make_node("Add", ["rw", "b"], ["logits"])], "two_layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        [numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
         for name, shape in (("w1", (FEATURES, 8)), ("w2", (8, CLASSES)), ("b", (CLASSES,)))])
    return save_graph(graph, path)


def seed_line(client, folder) -> None:
    """Versions 1 (production), 2 and 3 of `digits`, logits on `ev`, eval sets `cal` and
    `ev_copy` (the same data as `ev`), and a policy of NFR ≤ 0.05 on `ev`."""
    post_evalset(client, "ev", write_npz(folder, n=N, num_classes=CLASSES))
    post_evalset(client, "ev_copy", write_npz(folder, n=N, num_classes=CLASSES))
    post_evalset(client, "cal", write_npz(folder, n=200, num_classes=CLASSES, seed=7))
    files = {"1": write_onnx(folder, CLASSES, seed=1), "2": write_onnx(folder, CLASSES, seed=2),
             "3": two_layer_onnx(folder / "two_layer.onnx", seed=3)}
    for version, wrong in (("1", range(0, 10)), ("2", range(5, 20)), ("3", range(5, 20))):
        assert post_model(client, "digits", version, files[version].read_bytes()).is_success
        assert post_logits(client, f"digits:{version}", "ev",
                           logits_wrong_on(wrong)).status_code == 201
    assert gate(client, candidate="1").json()["verdict"] == "approve"
    assert client.post("/models/digits/aliases/production", json={"version": "1"}).is_success
    client.put("/models/digits/policy", json={"max_nfr": 0.05, "evalsets": ["ev"]})


client, settings = shared_store(line=seed_line)  # every test here uses `line`


@pytest.fixture
def line(client):
    """The client, on the store that seed_line seeded."""
    return client


def blocked(client, candidate: str) -> int:
    """The id of the decision blocking `candidate` (its metrics measured first)."""
    measure(client, "digits:1", f"digits:{candidate}", "ev")
    decision = gate(client, candidate=candidate).json()
    assert decision["verdict"] == "block", decision
    return decision["decision_id"]


def stored_rows(db) -> tuple[int, int]:
    """How many jobs and versions the store holds."""
    with db() as session:
        return (session.scalar(select(func.count()).select_from(Job)),
                session.scalar(select(func.count()).select_from(ModelVersion)))


@pytest.mark.parametrize(("candidate", "body", "status", "code"), [
    ("2", {"method": "interpolate"}, 422, "calibration_required"),
    ("2", {"method": "interpolate", "calibration": "ev"}, 422, "calibration_is_gated"),
    ("2", {"method": "ensemble", "calibration": "ev_copy"}, 422, "calibration_is_gated"),
    ("2", {"method": "interpolate", "calibration": "nope"}, 404, "dataset_not_found"),
    ("2", {"method": "interpolate", "calibration": "train"}, 422, "not_an_evalset"),
    ("3", {"method": "interpolate", "calibration": "cal"}, 422, "structure_mismatch"),
    ("2", {"method": "interpolate", "calibration": "cal", "max_nfr": 1.5}, 422,
     "invalid_request"),
    ("2", {"method": "interpolate", "calibration": "cal", "max_nfr": -0.1}, 422,
     "invalid_request"),
    ("2", {"method": "ensemble", "calibration": "cal", "max_er_increase": "0"}, 422,
     "invalid_request"),
    ("2", {"method": "ensemble", "calibration": "cal", "max_er_increase": 2}, 422,
     "invalid_request"),
    ("2", {"method": "interpolate", "calibration": "cal", "options": {"alpha": 0.5}}, 422,
     "invalid_options"),
    ("2", {"method": "ensemble", "calibration": "cal", "options": {"probabilities": "yes"}},
     422, "invalid_options"),
    ("2", {"method": "interpolate", "calibration": "cal", "arch": "mlp"}, 422,
     "not_applicable"),
    ("2", {"method": "elodi", "calibration": "cal"}, 422, "not_applicable"),
    ("2", {"method": "interpolate", "calibration": "cal", "version": "1"}, 409,
     "version_exists"),
])
def test_bad_repairs_on_onnx_are_refused_and_store_nothing(line, db, npz_file, candidate, body,
                                                            status, code):
    line.post("/trainsets", data={"name": "train"},
              files={"data": ("t.npz", npz_file(n=60, num_classes=CLASSES).read_bytes())})
    decision_id = blocked(line, candidate)
    before = stored_rows(db)
    response = line.post(f"/gate/decisions/{decision_id}/repair", json=body)
    assert error_code(response, status) == code
    assert stored_rows(db) == before
    assert line.get(f"/gate/decisions/{decision_id}").json()["verdict"] == "block"


def test_a_structure_mismatch_names_the_versions_not_the_stored_files(line):
    response = line.post(f"/gate/decisions/{blocked(line, '3')}/repair",
                         json={"method": "interpolate", "calibration": "cal"})
    message = response.json()["error"]["message"]
    assert "digits:1 and digits:3 cannot be interpolated" in message
    assert str(line.app.state.store.root) not in message


def test_limits_default_to_the_policy_and_requests_override_them(line):
    line.put("/models/digits/policy", json={"max_nfr": 0.05, "min_er_decrease": 0.01,
                                            "evalsets": ["ev"]})
    url = f"/gate/decisions/{blocked(line, '2')}/repair"
    job = line.post(url, json={"method": "interpolate", "calibration": "cal"}).json()["job"]
    assert job["kind"] == "train" and job["state"] == "queued"
    assert job["params"]["limits"] == {"max_nfr": 0.05, "max_er_increase": -0.01}
    assert job["params"]["calibration"] == "cal" and job["params"]["version"] == "2-interpolate"
    override = line.post(url, json={"method": "ensemble", "calibration": "cal", "max_nfr": 0.2,
                                    "max_er_increase": 0.03, "options": {"probabilities": True}})
    params = override.json()["job"]["params"]
    assert params["limits"] == {"max_nfr": 0.2, "max_er_increase": 0.03}
    assert params["options"] == {"probabilities": True} and params["version"] == "2-ensemble"


@pytest.mark.parametrize("method", ["interpolate", "ensemble"])
def test_the_job_registers_the_repair_with_its_curve_and_gates_it_again(line, worker, method):
    decision_id = blocked(line, "2")
    job = line.post(f"/gate/decisions/{decision_id}/repair",
                    json={"method": method, "calibration": "cal", "max_nfr": 0.0}).json()["job"]
    training.train(job["id"])
    done = line.get(f"/jobs/{job['id']}").json()
    assert done["state"] == "succeeded" and done["progress"] == 1.0, done
    version = line.get(f"/models/digits/versions/2-{method}").json()
    produced = version["produced_by"]
    share = "alpha" if method == "interpolate" else "weight"
    assert produced["job_id"] == job["id"] and produced["method"] == method
    assert produced["repair_of"] == "2" and produced["decision_id"] == decision_id
    assert produced["calibration"] == "cal"
    assert produced["limits"] == {"max_nfr": 0.0, "max_er_increase": 0.0}
    assert [point["share"] for point in produced["curve"]] == sorted(
        point["share"] for point in produced["curve"])
    chosen = [point for point in produced["curve"] if point["share"] == produced[share]]
    assert chosen[0]["nfr"] == 0.0 and chosen[0]["er_increase"] <= 0.0
    assert all(point["nfr"] > 0 or point["er_increase"] > 0 for point in produced["curve"]
               if point["share"] < produced[share])  # the smallest share that meets them
    assert version["parent_id"] == line.get("/models/digits/versions/1").json()["id"]
    again = line.get(f"/gate/decisions/{done['result']['decision_id']}").json()
    assert again["repair_of"] == decision_id and again["candidate"] == f"2-{method}"
    assert again["baseline"] == "1" and again["evalsets"] == ["ev"]


def test_the_repaired_version_and_its_decision_are_the_jobs_events(line, worker):
    """Actor the repair job (auth `job`), under the id of the request that asked for it."""
    decision_id = blocked(line, "2")
    job = line.post(f"/gate/decisions/{decision_id}/repair", headers={"X-Request-ID": "fix-2"},
                    json={"method": "ensemble", "calibration": "cal", "max_nfr": 0.0}
                    ).json()["job"]
    training.train(job["id"])
    result = line.get(f"/jobs/{job['id']}").json()["result"]
    found = line.get("/audit-events", params={"actor": f"job {job['id']}"}).json()["events"]
    assert [(event["action"], event["resource"], event["auth"], event["project"],
             event["request_id"]) for event in found] == [
        ("gate", f"/gate/decisions/{result['decision_id']}", "job", "default", "fix-2"),
        ("register_version", "/models/digits/versions/2-ensemble", "job", "default", "fix-2")]
    assert found[1]["details"] == {"job_id": job["id"], "kind": "train", "repair_of": "2"}


def test_a_mismatch_found_by_the_job_fails_it_and_keeps_the_decision(line, worker,
                                                                     monkeypatch):
    monkeypatch.setattr(repair_requests, "STRUCTURE_CHECK_MAX_BYTES", 0)  # too large to check
    decision_id = blocked(line, "3")
    job = line.post(f"/gate/decisions/{decision_id}/repair",
                    json={"method": "interpolate", "calibration": "cal"}).json()["job"]
    training.train(job["id"])
    failed = line.get(f"/jobs/{job['id']}").json()
    assert failed["state"] == "failed"
    assert failed["error"].startswith("structure_mismatch: digits:1 and digits:3 cannot be "
                                      "interpolated")
    assert line.get("/models/digits/versions/3-interpolate").status_code == 404
    assert line.get(f"/gate/decisions/{decision_id}").json()["verdict"] == "block"
    assert all(decision["repair_of"] is None
               for decision in line.get("/models/digits/decisions").json())
