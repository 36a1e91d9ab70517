"""What the request figures cost a request (issue 37): GET /models on two `flipgate serve
--api-only` servers, one with the metrics (FLIPGATE_METRICS=true, prometheus-client's
multiprocess mode as `serve` sets it up) and one without (FLIPGATE_METRICS=false), requests
interleaved in one run, the order alternating every round.

    python benchmarks/metrics_overhead_bench.py [--requests 5000]

Both servers log their access lines alike (the request id and the line are not the metrics'
cost); the line has three versions, so the answer is a real query. Printed: p50 and p99 of
each, and with / without against the goals p50 <= 1.05x and p99 <= 1.10x.
"""

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flipgate.processes import free_port
from tests.conftest import linear_onnx
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for

TOKEN = "bench-admin-token-0123456789"
GOALS = {"p50": 1.05, "p99": 1.10}


@contextmanager
def server(folder: Path, metrics: bool) -> Iterator[httpx.Client]:
    """A `flipgate serve --api-only` on its own SQLite store, with or without metrics."""
    folder.mkdir()
    port = free_port()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(folder / "data"), FLIPGATE_ADMIN_TOKEN=TOKEN,
                       FLIPGATE_METRICS=str(metrics).lower(), FLIPGATE_LOG_FORMAT="json")
    with (flipgate_process(["serve", "--api-only", "--port", str(port)], env, folder),
          httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        wait_for(lambda: ready(client), "the server")
        rng = np.random.default_rng(0)
        for version in ("1", "2", "3"):
            model = linear_onnx(folder / f"{version}.onnx", rng.normal(size=(4, 3)),
                                rng.normal(size=3), ("N", 4))
            client.post("/models", data={"name": "digits", "version": version},
                        files={"artifact": ("m.onnx", model.read_bytes())}).raise_for_status()
        yield client


def ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def timed_get(client: httpx.Client) -> float:
    """Seconds one GET /models took, end to end."""
    started = time.perf_counter()
    client.get("/models").raise_for_status()
    return time.perf_counter() - started


def percentile(times: list[float], q: float) -> float:
    return statistics.quantiles(times, n=100, method="inclusive")[q - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000, help="per server, after warm-up")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        clients = {name: stack.enter_context(server(Path(folder) / name, metrics))
                   for name, metrics in (("with", True), ("without", False))}
        for _ in range(200):  # warm-up: connections, caches, the first requests' imports
            for client in clients.values():
                timed_get(client)
        times: dict[str, list[float]] = {name: [] for name in clients}
        for round_ in range(args.requests):
            order = ("with", "without") if round_ % 2 == 0 else ("without", "with")
            for name in order:
                times[name].append(timed_get(clients[name]))
    figures = {name: {"p50": percentile(runs, 50), "p99": percentile(runs, 99)}
               for name, runs in times.items()}
    print(f"GET /models, {args.requests} interleaved requests per server")
    print(f"{'':<10} {'p50 ms':>8} {'p99 ms':>8}")
    for name, figure in figures.items():
        print(f"{name:<10} {figure['p50'] * 1000:>8.3f} {figure['p99'] * 1000:>8.3f}")
    within = True
    for key, goal in GOALS.items():
        ratio = figures["with"][key] / figures["without"][key]
        within &= ratio <= goal
        print(f"{key} with / without: {ratio:.3f}x (goal <= {goal:.2f}x)")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
