"""A multi-label line for the dashboard's tests (tests/ui/test_multilabel_pages.py over
HTTP, tests/ui/test_multilabel_browser.py in Chromium): composites of real 8×8 digits (two
or three side by side, labelled with the digits they show) and three external versions known
by their uploaded probabilities (N, 10), made from the truth so that each pair flips what
the seed says:

- `1`, right on about 92% of the (sample, label) pairs, approved and in production;
- `2`, `1` with label "3" lost wherever `1` had it right, and label "7" newly claimed on the
  samples without a 7 that `1` got right, every fifth of them: blocked by a policy on label
  "3" and on lost positives;
- `3`, `1` with a few decisions changed both ways.

The set's samples fall in GROUPS: the first third in "north", the rest in "south".

The matrix is counted and the pairs 1 → 2, 1 → 3 and 2 → 1 measured. Jobs are run by the
caller's `run_job` (the worker's tasks, in the test's process)."""

import io
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import numpy as np

from flipgate.datasets import digit_composites, save_evalset, small_digits

LINE, EVALSET, SAMPLES = "tags", "composites", 120
LOST, ALARMED = 3, 7  # the labels version 2 loses and newly claims
POLICY = {"max_label_nfr": {str(LOST): 0.05}, "max_lost_positives": 0.05,
          "evalsets": [EVALSET]}
MEASURED = (("1", "2"), ("1", "3"), ("2", "1"))
GROUPS = np.where(np.arange(SAMPLES) < SAMPLES // 3, "north", "south")


@dataclass(frozen=True)
class MultiLabelLine:
    """What the seed stored: the truth, each version's probabilities and decisions, and the
    API's answers (the reports of MEASURED, the matrix, the blocked decision)."""

    y: np.ndarray
    probabilities: dict[str, np.ndarray]
    reports: dict[tuple[str, str], dict]
    matrix: dict
    blocked: dict

    def decisions(self, version: str) -> np.ndarray:
        return self.probabilities[version] > 0.5


def decisions_of(y: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each version's decisions (see the module)."""
    first = np.where(rng.random(y.shape) < 0.08, ~y, y)
    second = first.copy()
    second[:, LOST] &= ~(first[:, LOST] & y[:, LOST])
    alarmed = np.flatnonzero(~y[:, ALARMED] & ~first[:, ALARMED])[::5]
    second[alarmed, ALARMED] = True
    third = np.where(rng.random(y.shape) < 0.03, ~first, first)
    return {"1": first, "2": second, "3": third}


def as_probabilities(decisions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Probabilities (N, L) above 0.5 exactly where `decisions` holds, of varied confidence."""
    margin = rng.uniform(0.05, 0.45, decisions.shape)
    return np.where(decisions, 0.5 + margin, 0.5 - margin)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def checked(response: httpx.Response) -> dict:
    assert response.is_success, response.text
    return response.json()


def seed_multilabel(client: httpx.Client, folder: Path,
                    run_job: Callable[[int], None]) -> MultiLabelLine:
    """The line, set, versions, matrix, reports and decisions of the module's docstring."""
    held_out = replace(digit_composites(SAMPLES, seed=5, digits=small_digits()), groups=GROUPS)
    path = save_evalset(held_out, folder / "composites.npz")
    checked(client.post("/evalsets", data={"name": EVALSET},
                        files={"data": ("composites.npz", path.read_bytes())}))
    rng = np.random.default_rng(11)
    probabilities = {version: as_probabilities(decided, rng)
                     for version, decided in decisions_of(held_out.y, rng).items()}
    for version, scores in probabilities.items():
        checked(client.post("/models", data={"name": LINE, "version": version,
                                              "multilabel": "true", "num_classes": "10"}))
        checked(client.post(f"/models/{LINE}/versions/{version}/predictions",
                            data={"evalset": EVALSET, "scores": "probabilities"},
                            files={"logits": ("p.npy", npy(scores))}))
    reports = {pair: measured(client, run_job, *pair) for pair in MEASURED}
    queued = checked(client.post(f"/models/{LINE}/matrix", params={"evalset": EVALSET}))
    for job_id in {pair["job_id"] for pair in queued["missing"]}:
        run_job(job_id)
    matrix = checked(client.get(f"/models/{LINE}/matrix", params={"evalset": EVALSET}))
    assert checked(client.post("/gate", json={"model": LINE, "candidate": "1"}))[
        "verdict"] == "approve"
    checked(client.post(f"/models/{LINE}/aliases/production", json={"version": "1"}))
    checked(client.put(f"/models/{LINE}/policy", json=POLICY))
    blocked = checked(client.post("/gate", json={"model": LINE, "candidate": "2"}))
    assert blocked["verdict"] == "block", blocked
    return MultiLabelLine(held_out.y, probabilities, reports, matrix, blocked)


def measured(client: httpx.Client, run_job: Callable[[int], None], old: str, new: str) -> dict:
    """The stored report of LINE:old → LINE:new, its jobs run first."""
    url, params = f"/compare/{LINE}:{old}/{LINE}:{new}", {"evalset": EVALSET}
    for job_id in checked(client.post(url, params=params)).get("job_ids", []):
        run_job(job_id)
    return checked(client.get(url, params=params))
