"""What the request benchmarks share: a `flipgate serve --api-only` on its own SQLite store
with a line of three versions, and GET /models timed end to end."""

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flipgate.processes import free_port
from tests.conftest import linear_onnx
from tests.e2e.conftest import flipgate_env, flipgate_process, wait_for

TOKEN = "bench-admin-token-0123456789"


@contextmanager
def api_server(folder: Path, serve_args: tuple[str, ...] = (),
               **variables: str) -> Iterator[httpx.Client]:
    """`flipgate serve --api-only` (with `serve_args` and the environment `variables`) on its
    own SQLite store in `folder`, with the line `digits` of three versions, so that GET
    /models answers from a real query: a keep-alive client."""
    folder.mkdir()
    port = free_port()
    env = flipgate_env(FLIPGATE_DATA_DIR=str(folder / "data"), FLIPGATE_ADMIN_TOKEN=TOKEN,
                       FLIPGATE_LOG_FORMAT="json", **variables)
    with (flipgate_process(["serve", "--api-only", "--port", str(port), *serve_args], env,
                           folder),
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


def get_models(client: httpx.Client) -> None:
    """One GET /models, its answer checked."""
    client.get("/models").raise_for_status()


def models_calls(clients: dict[str, httpx.Client]) -> dict[str, Callable[[], None]]:
    """A GET /models of each client, for `interleaved`."""
    return {name: partial(get_models, client) for name, client in clients.items()}


def timed(call: Callable[[], Any]) -> float:
    """Seconds `call` took, end to end."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def percentile(times: list[float], q: int) -> float:
    return statistics.quantiles(times, n=100, method="inclusive")[q - 1]


def interleaved(calls: dict[str, Callable[[], Any]], requests: int,
                warm_up: int = 200) -> dict[str, list[float]]:
    """Each call's times over `requests` rounds, the order alternating every round, after
    `warm_up` untimed rounds (connections, caches, the first requests' imports)."""
    for _ in range(warm_up):
        for call in calls.values():
            call()
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(requests):
        for name in names if round_ % 2 == 0 else reversed(names):
            times[name].append(timed(calls[name]))
    return times


def listening_pid(port: int) -> int:
    """The id of the process that listens on the loopback TCP `port` (from /proc)."""
    inodes = {fields[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if (fields := line.split())[3] == "0A" and int(fields[1].split(":")[1], 16) == port}
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return int(fd.parts[2])
    raise LookupError(f"no process listens on port {port}")


def cpu_seconds(pid: int) -> float:
    """The user and system CPU seconds process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
