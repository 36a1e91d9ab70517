"""The time a user waits for a verdict, against its floor (issue 23).

    python benchmarks/verdict_bench.py [--samples 200000] [--classes 1000] [--dir DIR]

Two versions' float32 logits of N × C (scale_bench's files) are gated through a real
`flipgate serve` (embedded: SQLite and the folder broker, its own worker), as a CI job
would: the eval set (labels, and one feature per sample) and two external versions are
registered, both logits uploaded, then POST /gate is polled to its verdict. The uploads are
timed both ways: multipart POST (the browser's and the old clients' path) and the raw PUT
(`flipgate upload logits`); the gate after them (a small line goes through first, so that
neither path pays the worker's first job).
Floor: reading and hashing both files once and `compare_logits` on them memory-mapped, in
this process. Printed: each time, and time to verdict / floor for each upload path; then
the start time of `flipgate --help` and `flipgate compare --help` (fresh interpreters).
Files are written first, so they are in the page cache for every path alike.
"""

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
from scale_bench import write_pair  # the script's folder is on sys.path

from flipgate.metrics import compare_logits
from flipgate.processes import free_port, stop_process

TOKEN = "verdict-bench-admin-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def floor(old: Path, new: Path, labels: Path) -> float:
    """Hash both files once, then the pair report on them memory-mapped."""
    def work() -> None:
        for path in (old, new):
            digest = hashlib.sha256()
            with path.open("rb") as file:
                while chunk := file.read(1 << 20):
                    digest.update(chunk)
        compare_logits(np.load(old, mmap_mode="r"), np.load(new, mmap_mode="r"),
                       np.load(labels))
    return timed(work)


def serve(folder: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {"FLIPGATE_DATA_DIR": str(folder / "data"), "FLIPGATE_ADMIN_TOKEN": TOKEN,
           "FLIPGATE_MAX_UPLOAD_MB": "4096", "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen([sys.executable, "-m", "flipgate.cli", "serve", "--port",
                                str(port)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("flipgate serve did not start")


def register(http: httpx.Client, folder: Path, labels: Path, classes: int, line: str) -> None:
    """The eval set (one feature per sample) and two external versions of `line`."""
    y = np.load(labels)
    evalset = folder / f"{line}.npz"
    np.savez(evalset, x=np.zeros((y.size, 1), np.float32), y=y)
    with evalset.open("rb") as file:
        http.post("/evalsets", data={"name": line}, files={"data": file}).raise_for_status()
    for version in ("1", "2"):
        http.post("/models", data={"name": line, "version": version,
                                   "num_classes": str(classes)}).raise_for_status()


def post_upload(http: httpx.Client, line: str, version: str, path: Path) -> None:
    with path.open("rb") as file:
        http.post(f"/models/{line}/versions/{version}/predictions", data={"evalset": line},
                  files={"logits": ("logits.npy", file)}).raise_for_status()


def put_upload(http: httpx.Client, line: str, version: str, path: Path) -> None:
    with path.open("rb") as file:
        http.put(f"/models/{line}/versions/{version}/predictions", params={"evalset": line},
                 content=file, headers={"Content-Type": "application/octet-stream"}
                 ).raise_for_status()


def gate(http: httpx.Client, line: str) -> str:
    decision = http.post("/gate", json={"model": line, "candidate": "2", "baseline": "1"}).json()
    while decision["verdict"] == "pending":
        time.sleep(0.05)
        decision = http.get(f"/gate/decisions/{decision['decision_id']}").json()
    return decision["verdict"]


def through_server(http: httpx.Client, folder: Path, paths: tuple[Path, Path, Path],
                   classes: int, line: str, upload: Callable) -> tuple[float, float]:
    """(uploads, gate) seconds for one line whose logits go up by `upload`."""
    register(http, folder, paths[2], classes, line)
    uploads = timed(lambda: [upload(http, line, version, path)
                             for version, path in (("1", paths[0]), ("2", paths[1]))])
    return uploads, timed(lambda: gate(http, line))


def start_time(*args: str) -> float:
    return timed(lambda: subprocess.run([sys.executable, "-m", "flipgate.cli", *args],
                                        capture_output=True, check=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--dir", type=Path, help="where the files go (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        folder = Path(name)
        paths = write_pair(folder, args.samples, args.classes)
        bottom = floor(*paths)
        print(f"{args.samples:,} x {args.classes:,} float32 logits, "
              f"{paths[0].stat().st_size / 2**20:.0f} MiB a version")
        print(f"floor (hash both + compare_logits): {bottom:.2f} s")
        process, url = serve(folder)
        try:
            with httpx.Client(base_url=url, headers=AUTH, timeout=600) as http:
                warm_up = folder / "warm-up"
                warm_up.mkdir()
                through_server(http, warm_up, write_pair(warm_up, 1000, args.classes),
                               args.classes, "warm-up", put_upload)  # the worker's first job
                for label, upload in (("multipart POST", post_upload), ("raw PUT", put_upload)):
                    uploads, decided = through_server(http, folder, paths, args.classes,
                                                      label.split()[-1].lower(), upload)
                    print(f"{label:15s}: uploads {uploads:.2f} s + gate {decided:.2f} s = "
                          f"{uploads + decided:.2f} s, {(uploads + decided) / bottom:.1f}x "
                          "the floor")
        finally:
            stop_process(process, grace_seconds=30)
    for args_ in (["--help"], ["compare", "--help"]):
        print(f"flipgate {' '.join(args_)}: {min(start_time(*args_) for _ in range(3)):.2f} s "
              "(best of 3)")


if __name__ == "__main__":
    main()
