"""`flipgate serve` in embedded mode (SQLite, folder broker, its own worker) over HTTP."""

import httpx
import numpy as np
import pytest

from flipgate.formats.evalsets import load_evalset
from flipgate.inference import OnnxClassifier
from flipgate.metrics import compare_logits, pairwise_matrices
from flipgate.processes import free_port
from tests.e2e.conftest import (
    child_pids,
    flipgate_env,
    flipgate_process,
    outliving,
    register,
    wait_for,
    wait_for_jobs,
)

TOKEN = "e2e-admin-token-0123456789"
pytestmark = pytest.mark.slow


def ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def queue_compare(client: httpx.Client, old: str, new: str) -> list[int]:
    """The inference jobs and the metrics job (last) that POST /compare queued."""
    response = client.post(f"/compare/{old}/{new}", params={"evalset": "eval"})
    assert response.status_code == 202, response.text
    return response.json()["job_ids"]


def matrix_when_measured(client: httpx.Client) -> dict:
    """The matrix once the matrix jobs that the stored logits queued have counted every pair
    (a POST answers 200 when nothing is missing, else 202 with the job to wait for)."""
    def complete() -> dict | None:
        answer = client.post("/models/digits/matrix", params={"evalset": "eval"})
        assert answer.status_code in (200, 202), answer.text
        return answer.json() if answer.status_code == 200 else None
    return wait_for(complete, "the matrix")


def test_serve_runs_inference_and_answers_compare_and_matrix(tmp_path, models, evalset):
    port = free_port()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(tmp_path / "data"), FLIPGATE_ADMIN_TOKEN=TOKEN)
    with (flipgate_process(["serve", "--port", str(port)], env, tmp_path) as server,
          httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        wait_for(lambda: ready(client), "/readyz")
        register(client, models, evalset)
        first = queue_compare(client, "digits:1.0", "digits:1.1")
        second = queue_compare(client, "digits:1.1", "digits:1.2")
        assert len({*first[:-1], *second[:-1]}) == 3  # one inference job per version
        wait_for_jobs(client, sorted({*first, *second}))
        report = client.get("/compare/digits:1.0/digits:1.1", params={"evalset": "eval"})
        matrix = matrix_when_measured(client)
        worker = child_pids(server.pid)
        assert worker, "serve started no worker"
    assert server.returncode == 0
    assert not outliving(worker)
    data = load_evalset(evalset)
    logits = [OnnxClassifier(path).predict(data.x) for path in models]
    expected = compare_logits(logits[0], logits[1], data.y)
    assert report.status_code == 200
    assert {key: report.json()[key] for key in ("nfr", "pfr", "churn", "er_old", "er_new")} == \
        pytest.approx({key: expected[key] for key in ("nfr", "pfr", "churn", "er_old", "er_new")})
    expected_matrices = pairwise_matrices(np.stack([z.argmax(1) for z in logits]), data.y)
    assert matrix["versions"] == ["1.0", "1.1", "1.2"]
    for name in ("nfr", "pfr", "churn"):
        np.testing.assert_allclose(np.array(matrix[name], dtype=float), expected_matrices[name])
