"""The dashboard on the API test app (tests/service/api/conftest.py): `seed` stores a line
with three versions whose logits are uploaded, its matrix computed, every pair's report
measured, and a blocked decision (tests/ui/test_pages.py seeds it once per module and
database, with tests/service/api/conftest.py's shared_store)."""

from dataclasses import dataclass
from itertools import permutations
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from flipgate.metrics import compare_logits
from tests.service.api.conftest import (  # noqa: F401 (fixtures)
    client,
    db,
    measure,
    mint,
    module_store,
    post_evalset,
    post_logits,
    post_model,
    run_task,
    send_evalset,
    send_model,
    settings,
    upload_evalset,
    upload_logits,
    upload_model,
)
from tests.service.conftest import (  # noqa: F401 (fixtures)
    database_url,
    engine,
    no_flipgate_environment,
    npz_file,
    onnx_file,
    write_npz,
    write_onnx,
)
from tests.ui.oidc_provider import expired_oidc_provider, oidc_provider  # noqa: F401 (fixtures)

LINE, EVALSET, SAMPLES, CLASSES = "digits", "eval", 60, 3


@dataclass(frozen=True)
class Seeded:
    """What the seeded store holds: each version's logits, the labels, the blocked decision."""

    logits: dict[str, np.ndarray]
    labels: np.ndarray
    blocked_id: int


def seed(client: TestClient, folder: Path) -> "Seeded":  # noqa: F811
    """Line `digits` with versions 1, 2, 3 (uploaded logits on `eval`, the matrix computed
    and every pair's report measured), 1 approved and in production, and 2 blocked by
    max_nfr."""
    path = write_npz(folder, n=SAMPLES, num_classes=CLASSES)
    assert post_evalset(client, EVALSET, path).status_code == 201
    labels = np.load(path)["y"]
    rng = np.random.default_rng(7)
    logits = {}
    for version, accuracy in (("1", 0.9), ("2", 0.6), ("3", 0.8)):
        model = write_onnx(folder, seed=int(version)).read_bytes()
        assert post_model(client, LINE, version, model).status_code == 201
        logits[version] = noisy_logits(labels, accuracy, rng)
        assert post_logits(client, f"{LINE}:{version}", EVALSET,
                           logits[version]).status_code == 201
    queued = client.post(f"/models/{LINE}/matrix", params={"evalset": EVALSET}).json()
    run_task(client, queued["missing"][0]["job_id"])
    for old, new in permutations(logits, 2):
        measure(client, f"{LINE}:{old}", f"{LINE}:{new}", EVALSET)
    assert client.post("/gate", json={"model": LINE, "candidate": "1"}).json()["verdict"] \
        == "approve"
    assert client.post(f"/models/{LINE}/aliases/production", json={"version": "1"}).is_success
    assert client.put(f"/models/{LINE}/policy",
                      json={"max_nfr": 0.05, "evalsets": [EVALSET]}).is_success
    blocked = client.post("/gate", json={"model": LINE, "candidate": "2"}).json()
    assert blocked["verdict"] == "block", blocked
    return Seeded(logits, labels, blocked["decision_id"])


def noisy_logits(labels: np.ndarray, accuracy: float, rng: np.random.Generator) -> np.ndarray:
    """Logits whose argmax is the label for about `accuracy` of the samples."""
    logits = rng.normal(size=(labels.size, CLASSES)).astype(np.float32)
    right = rng.random(labels.size) < accuracy
    logits[np.arange(labels.size), labels] += np.where(right, 4.0, -4.0)
    return logits


def ensemble_curve(old: np.ndarray, new: np.ndarray, labels: np.ndarray,
                   limit: float) -> tuple[float, list[dict]]:
    """The curve an ensemble repair of old -> new measures (the old model's share w of the
    logits, against the old model) and the smallest w whose NFR meets `limit`."""
    curve = []
    for share in (0.0, 0.25, 0.5, 0.75, 1.0):
        measured = compare_logits(old, share * old + (1 - share) * new, labels)
        curve.append({"share": share, "er": measured["er_new"], "nfr": measured["nfr"],
                      "churn": measured["churn"],
                      "er_increase": measured["er_new"] - measured["er_old"]})
    return next(point["share"] for point in curve if point["nfr"] <= limit), curve


@pytest.fixture
def browser_client(client) -> TestClient:  # noqa: F811
    """A client without the admin bearer token (as a browser is)."""
    client.headers.pop("Authorization")
    return client


@pytest.fixture
def signed_in(browser_client, mint) -> TestClient:  # noqa: F811
    """The browser client holding a session of a read-only token."""
    response = browser_client.post("/ui/signin", data={"token": mint("read")},
                                    follow_redirects=False)
    assert response.status_code == 303, response.text
    return browser_client


RATE = r"([0-9.]+)%"  # a rate as the dashboard writes it: a percentage (12.34%)


def as_rate(percent: str) -> float:
    """The fraction a shown percentage stands for ('12.34' of '12.34%' -> 0.1234)."""
    return float(percent.removesuffix("%")) / 100
