"""The server at its users' scale, end to end on `flipgate serve` (embedded): two versions'
logits on an eval set of 200,000 samples x 1,000 classes (800 MB of float32 each) are uploaded
through the API, the candidate is gated, and the verdict and the numbers match
flipgate.metrics computed here, while the API process and the worker's processes stay within
a memory bound far below one logits file.

The bounds: every process of the server reads the logits memory-mapped, a chunk at a time, and
hands the pages back (flipgate.metrics.chunks.release), so its peak resident memory grows by a
few chunks plus a few bytes per sample (the predicted classes, the kept per-sample values of
the report: about 30 bytes x 200,000 = 6 MB), not by the 800 MB of one logits file. Each
process's peak (VmHWM in /proc: the high-water mark of resident memory, file pages included)
must stay under 800 MB, the size of one logits file: the interpreter and its imports (numpy,
ONNX Runtime, SQLAlchemy) take about 350 MB, so a process that held one logits file whole
(np.load without mmap, np.concatenate, a softmax over all samples, or mapped pages never
handed back) would pass 1.1 GB and fail.
"""

import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from flipgate.metrics import compare_logits
from flipgate.processes import free_port
from tests.conftest import linear_onnx
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for, wait_for_jobs

TOKEN = "e2e-scale-admin-token-0123456789"
SAMPLES, CLASSES = 200_000, 1_000
CHUNK = 10_000
PEAK_BOUND_MB = 800  # one logits file
pytestmark = pytest.mark.slow


def write_logits(path: Path, labels: np.ndarray, accuracy: float, seed: int) -> Path:
    """float32 (N, CLASSES) logits written as .npy a chunk at a time: noise, with the true
    class raised on a random `accuracy` share of the samples (an independent error pattern)."""
    rng = np.random.default_rng(seed)
    header = {"descr": "<f4", "fortran_order": False, "shape": (labels.size, CLASSES)}
    with path.open("wb") as file:
        np.lib.format.write_array_header_2_0(file, header)
        for start in range(0, labels.size, CHUNK):
            rows = labels[start : start + CHUNK]
            chunk = rng.standard_normal((rows.size, CLASSES), dtype=np.float32)
            right = rng.random(rows.size) < accuracy
            chunk[np.flatnonzero(right), rows[right]] += 6.0
            file.write(chunk.tobytes())
    return path


@pytest.fixture
def scale_files(tmp_path) -> dict[str, Path]:
    """The eval set (x of shape (N, 1): the logits are uploaded, not inferred), two linear
    models of CLASSES classes and the logits of each."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, CLASSES, SAMPLES)
    files = {"eval": tmp_path / "eval.npz"}
    np.savez(files["eval"], x=np.zeros((SAMPLES, 1), np.float32), y=labels)
    for index, accuracy in ((1, 0.80), (2, 0.78)):
        files[f"model{index}"] = linear_onnx(tmp_path / f"v{index}.onnx",
                                             rng.normal(size=(1, CLASSES)),
                                             rng.normal(size=CLASSES), ("N", 1))
        files[f"logits{index}"] = write_logits(tmp_path / f"v{index}.npy", labels, accuracy,
                                               seed=index)
    return files


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM) in MB."""
    return _status_kb(pid, "VmHWM") / 1024


def rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmRSS") / 1024


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(f"{field}:"))


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the worker and its pool's processes)."""
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        direct = [int(child) for child in children.read().split()]
    return [found for child in direct for found in (child, *descendants(child))]


def ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def upload(client: httpx.Client, path: str, fields: dict, field: str, file: Path) -> float:
    """POST a file streamed from disk; the seconds it took."""
    started = time.perf_counter()
    with file.open("rb") as readable:
        response = client.post(path, data=fields, files={field: (file.name, readable)})
    assert response.status_code == 201, response.text
    return time.perf_counter() - started


def put_raw(client: httpx.Client, path: str, params: dict, file: Path) -> float:
    """PUT a file streamed from disk as the raw body (the fast path); the seconds it took."""
    started = time.perf_counter()
    with file.open("rb") as readable:
        response = client.put(path, params=params, content=readable,
                              headers={"Content-Type": "application/octet-stream"})
    assert response.status_code == 201, response.text
    return time.perf_counter() - started


def register(client: httpx.Client, files: dict[str, Path]) -> dict[str, float]:
    """The eval set, versions 1 and 2 and their logits (version 1's by a multipart POST,
    version 2's as the raw body of a PUT); the seconds each upload took."""
    upload(client, "/evalsets", {"name": "eval"}, "data", files["eval"])
    for version in ("1", "2"):
        upload(client, "/models", {"name": "digits", "version": version}, "artifact",
               files[f"model{version}"])
    return {"upload v1 (POST)": upload(client, "/models/digits/versions/1/predictions",
                                       {"evalset": "eval"}, "logits", files["logits1"]),
            "upload v2 (PUT)": put_raw(client, "/models/digits/versions/2/predictions",
                                       {"evalset": "eval"}, files["logits2"])}


def gate(client: httpx.Client) -> dict:
    """Gate version 2 over production (version 1) and wait for the decision to be final."""
    response = client.post("/gate", json={"model": "digits", "candidate": "2"})
    assert response.status_code in (200, 202), response.text
    decision = response.json()
    wait_for_jobs(client, decision.get("waiting_for") or [])
    return wait_for(lambda: (final := client.get(
        f"/gate/decisions/{decision['decision_id']}").json())["verdict"] != "pending" and final,
        "the decision", timeout=300)


def test_gating_200k_by_1000_logits_keeps_the_server_memory_bounded(tmp_path, scale_files):
    port = free_port()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(tmp_path / "data"), FLIPGATE_ADMIN_TOKEN=TOKEN,
                       FLIPGATE_MAX_UPLOAD_MB="1024")  # 800 MB of logits per upload
    with (flipgate_process(["serve", "--port", str(port)], env, tmp_path) as server,
          httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        wait_for(lambda: ready(client), "/readyz")
        ready_rss = rss_mb(server.pid)
        timings = register(client, scale_files)
        assert client.post("/gate", json={"model": "digits", "candidate": "1"}).json()[
            "verdict"] == "approve"
        assert client.post("/models/digits/aliases/production", json={"version": "1"}).is_success
        assert client.put("/models/digits/policy", json={
            "max_nfr": 0.1, "evalsets": ["eval"]}).is_success
        started = time.perf_counter()
        decision = gate(client)
        timings["gate (metrics job)"] = time.perf_counter() - started
        report = client.get("/compare/digits:1/digits:2", params={"evalset": "eval"}).json()
        html = client.get("/compare/digits:1/digits:2",
                          params={"evalset": "eval", "format": "html"})
        peaks = {"api": peak_rss_mb(server.pid),
                 "worker": max(peak_rss_mb(pid) for pid in descendants(server.pid))}
    print(f"\nscale e2e: peak RSS (MB) {peaks} (API when ready: {ready_rss:.0f}), "
          f"seconds {timings}")
    labels = np.load(scale_files["eval"])["y"]
    expected = compare_logits(*(np.load(scale_files[f"logits{version}"], mmap_mode="r")
                                for version in ("1", "2")), labels)
    assert decision["verdict"] == "block"
    assert [reason["code"] for reason in decision["reasons"]] == ["max_nfr"]
    assert decision["reasons"][0]["measured"] == pytest.approx(expected["nfr"])
    for key in ("negative_flips", "positive_flips", "both_wrong", "flipped_indices"):
        assert report[key] == expected[key], key
    for key in ("nfr", "pfr", "churn", "er_old", "er_new", "schurn", "mcnemar_p"):
        assert report[key] == pytest.approx(expected[key]), key
    assert html.status_code == 200 and html.text.count("<svg") >= 4
    assert max(peaks.values()) < PEAK_BOUND_MB, peaks
