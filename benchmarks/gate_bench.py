"""The deploy gate's answer on an already-measured pair vs. a trivial endpoint, under load.

    python benchmarks/gate_bench.py [--clients 50] [--requests 2000] [--database-url URL]
    python benchmarks/gate_bench.py --hold 60 --clients 200 [--client-processes 4]
                                    [--database-url URL]

Starts `flipgate serve --api-only` on a fresh data dir whose SQLite database (or the empty
database at --database-url) it migrates first, registers a line
with two versions, an eval set and uploaded logits of both, and has a `flipgate worker` measure
the pair once (stopped before the load).
Then C concurrent clients on loopback send N requests to GET /healthz and N to POST /gate
(a token with scope gate, no delivery id: every request records a new decision). Prints p50
and p99 latency and requests/s of both, and the ratios gate / healthz.

With --hold S, the C clients instead hold the server for S seconds with a mix of
GET /compare (the stored report) and GET /models/{line} under a `read` token and POST /gate
under a `gate` token, each asking again as soon as it is answered (spread over
--client-processes processes: one asyncio loop saturates a core at about 230 answers/s, and
its own queue then counts in every latency), while a probe in the main process asks
/healthz every quarter second, and for a few seconds after the load stops. Prints the
statuses, timeouts, 503s slower than a second, p50/p99 and throughput (answers/s, 200s/s),
and how /healthz answered during and after.
"""

import argparse
import asyncio
import io
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from flipgate.processes import free_port, stop_process
from service.auth.service import create_token
from service.config import Settings
from service.db import settings_session
from service.migrate import upgrade

ROOT = Path(__file__).resolve().parents[1]
ADMIN_TOKEN = "bench-admin-token-0123456789"
LINE, EVALSET = "bench", "eval"
SAMPLES, FEATURES, CLASSES = 10_000, 16, 10
GATE_REQUEST = {"model": LINE, "candidate": "2", "baseline": "1", "evalsets": [EVALSET]}
START_SECONDS = 60
REQUEST_TIMEOUT_SECONDS = 30  # an answer later than this counts as a timeout
PROBE_EVERY_SECONDS, PROBE_TIMEOUT_SECONDS, PROBES_AFTER = 0.25, 2.0, 8


@dataclass
class Run:
    """The latencies (seconds) of the answers of one load run, its wall time, and how many
    answers had each status (or failed with each transport error)."""

    latencies: np.ndarray
    seconds: float
    statuses: Counter
    server_ms: np.ndarray  # the gate's own time per answer (its Server-Timing header)

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1000

    @property
    def per_second(self) -> float:
        return len(self.latencies) / self.seconds


@dataclass
class Hold:
    """What the clients of a --hold run saw, and what /healthz answered during and after."""

    run: Run
    slow_busy: int  # 503 answers that took longer than a second
    probes_during: list[float | None]  # each probe's latency (s), None if unanswered
    probes_after: list[float | None]

    @property
    def timeouts(self) -> int:
        return sum(count for status, count in self.run.statuses.items()
                   if isinstance(status, str) and "Timeout" in status)

    @property
    def unanswered(self) -> int:
        """Requests that got no answer at all (timeouts and transport errors)."""
        return sum(count for status, count in self.run.statuses.items()
                   if isinstance(status, str))


def linear_onnx(seed: int) -> bytes:
    """A linear ONNX classifier (FEATURES inputs, CLASSES logits)."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["logits"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        [numpy_helper.from_array(rng.normal(size=(FEATURES, CLASSES)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(size=CLASSES).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model.SerializeToString()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def client_tokens(settings: Settings) -> dict[str, str]:
    """Migrate the database and mint one token with scope read and one with scope gate."""
    upgrade(settings)
    with settings_session(settings) as session:
        return {scope: create_token(session=session, name=f"bench-{scope}", scopes=[scope])[1]
                for scope in ("read", "gate")}


@contextmanager
def flipgate(settings: Settings, *args: str) -> Iterator[subprocess.Popen]:
    """`flipgate ARGS` with `settings` (and its broker, when it names Redis), logging to
    ARGS[0].log in the data dir; stopped after."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLIPGATE_")},
           "FLIPGATE_DATA_DIR": str(settings.data_dir),
           "FLIPGATE_DATABASE_URL": settings.database_url,
           "FLIPGATE_ADMIN_TOKEN": ADMIN_TOKEN, "PYTHONPATH": str(ROOT),
           **({"FLIPGATE_REDIS_URL": settings.redis_url} if settings.redis_url else {})}
    with (settings.data_dir / f"{args[0]}.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "flipgate.cli", *args], env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            stop_process(process)


@contextmanager
def server(settings: Settings, port: int, *serve_args: str) -> Iterator[str]:
    """`flipgate serve --api-only` (with `serve_args`) with `settings`; yields its URL once
    /healthz answers."""
    url = f"http://127.0.0.1:{port}"
    with flipgate(settings, "serve", "--api-only", "--port", str(port),
                  *serve_args) as process:
        wait_until_up(url, process, settings.data_dir / "serve.log")
        yield url


def wait_until_up(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/healthz").is_success:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise SystemExit(f"the server did not start (exit code {process.poll()}):\n"
                     f"{log.read_text(errors='replace')[-3000:]}")


def checked(response: httpx.Response) -> dict:
    if response.is_error:
        raise SystemExit(f"{response.request.method} {response.request.url}: "
                         f"{response.status_code} {response.text}")
    return response.json()


def measured_pair(url: str, token: str, settings: Settings) -> dict:
    """Register the line, the eval set and both versions' logits, have a worker measure the
    pair (stopped before the load); the gate's final answer."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, CLASSES, SAMPLES)
    evalset = io.BytesIO()
    np.savez(evalset, x=rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32), y=labels)
    with httpx.Client(base_url=url, timeout=60,
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
        checked(admin.post("/evalsets", data={"name": EVALSET},
                           files={"data": ("eval.npz", evalset.getvalue())}))
        for seed, version in enumerate(("1", "2")):
            checked(admin.post("/models", data={"name": LINE, "version": version},
                               files={"artifact": ("model.onnx", linear_onnx(seed))}))
            logits = np.eye(CLASSES)[labels] * 1.5 + rng.normal(size=(SAMPLES, CLASSES))
            checked(admin.post(f"/models/{LINE}/versions/{version}/predictions",
                               data={"evalset": EVALSET},
                               files={"logits": ("logits.npy", npy(logits))}))
    decision = ask_gate(url, token)
    if decision["verdict"] == "pending":  # its metrics job is queued
        with flipgate(settings, "worker"):
            deadline = time.monotonic() + START_SECONDS
            while decision["verdict"] == "pending" and time.monotonic() < deadline:
                time.sleep(0.5)
                decision = ask_gate(url, token)
    if decision["verdict"] == "pending":
        raise SystemExit(f"the gate is still pending on the pair: {decision}")
    return decision


def ask_gate(url: str, token: str) -> dict:
    return checked(httpx.post(f"{url}/gate", json=GATE_REQUEST, timeout=60,
                              headers={"Authorization": f"Bearer {token}"}))


async def load(url: str, method: str, path: str, *, clients: int, requests: int,
               **options) -> Run:
    """`requests` calls of `method path` shared by `clients` concurrent connections."""
    latencies, statuses, server_ms = [], Counter(), []
    remaining = iter(range(requests))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:

        async def one_client() -> None:
            for _ in remaining:  # the shared iterator hands each request to one client
                start = time.perf_counter()
                try:
                    response = await http.request(method, path, **options)
                except httpx.TransportError as error:  # e.g. closed after a 500
                    statuses[type(error).__name__] += 1
                    continue
                latencies.append(time.perf_counter() - start)
                statuses[response.status_code] += 1
                if timing := response.headers.get("Server-Timing"):
                    server_ms.append(float(timing.split("dur=")[1]))

        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        return Run(np.array(latencies), time.perf_counter() - start, statuses,
                   np.array(server_ms))


def mixed_requests(tokens: dict[str, str]) -> list[tuple[str, str, dict]]:
    """The requests of a --hold run: two reads under the read token, the gate under the gate
    token."""
    read = {"headers": {"Authorization": f"Bearer {tokens['read']}"}}
    return [("GET", f"/compare/{LINE}:1/{LINE}:2", {**read, "params": {"evalset": EVALSET}}),
            ("POST", "/gate", {"json": GATE_REQUEST,
                               "headers": {"Authorization": f"Bearer {tokens['gate']}"}}),
            ("GET", f"/models/{LINE}", read)]


def hold(url: str, requests: list[tuple[str, str, dict]], *, clients: int, seconds: float,
         processes: int) -> Hold:
    """`clients` connections, spread over `processes` client processes, that send `requests`
    in turn for `seconds`, each asking again as soon as it is answered, while this process
    probes /healthz; then /healthz a few times more."""
    shares = [clients // processes + (index < clients % processes) for index in range(processes)]
    offsets = np.cumsum([0, *shares[:-1]])
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        start = time.perf_counter()
        parts = [pool.submit(hold_share, url, requests, share, int(offset), seconds)
                 for share, offset in zip(shares, offsets, strict=True)]
        during = asyncio.run(probe_until(url, parts))
        results = [part.result() for part in parts]
        elapsed = time.perf_counter() - start
    after = asyncio.run(probes_after(url))
    latencies = np.concatenate([np.array(part[0]) for part in results])
    statuses = sum((part[1] for part in results), Counter())
    run = Run(latencies, elapsed, statuses, np.array([]))
    return Hold(run, sum(part[2] for part in results), during, after)


def hold_share(url: str, requests: list[tuple[str, str, dict]], clients: int, offset: int,
               seconds: float) -> tuple[list[float], Counter, int]:
    """In a client process: its clients' latencies, statuses and 503s slower than 1 s."""
    return asyncio.run(hold_clients(url, requests, clients, offset, seconds))


async def hold_clients(url: str, requests: list[tuple[str, str, dict]], clients: int,
                       offset: int, seconds: float) -> tuple[list[float], Counter, int]:
    """`clients` connections asking in turn until `seconds` have passed."""
    latencies, statuses, slow_busy = [], Counter(), 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, limits=limits,
                                 timeout=REQUEST_TIMEOUT_SECONDS) as http:

        async def one_client(turn: int) -> None:
            nonlocal slow_busy
            while time.monotonic() < deadline:
                method, path, options = requests[turn % len(requests)]
                turn += 1
                start = time.perf_counter()
                try:
                    response = await http.request(method, path, **options)
                except httpx.TransportError as error:
                    statuses[type(error).__name__] += 1
                    continue
                latencies.append(time.perf_counter() - start)
                statuses[response.status_code] += 1
                slow_busy += response.status_code == 503 and latencies[-1] > 1

        await asyncio.gather(*(one_client(offset + index) for index in range(clients)))
    return latencies, statuses, slow_busy


async def probe(url: str) -> float | None:
    """The latency of one GET /healthz on a fresh connection, or None without a 200."""
    start = time.perf_counter()
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_SECONDS) as http:
            response = await http.get(f"{url}/healthz")
    except httpx.TransportError:
        return None
    return time.perf_counter() - start if response.status_code == 200 else None


async def probe_until(url: str, parts: list[Future]) -> list[float | None]:
    """Probe /healthz every PROBE_EVERY_SECONDS until the client processes are done."""
    results = []
    while not all(part.done() for part in parts):
        results.append(await probe(url))
        await asyncio.sleep(PROBE_EVERY_SECONDS)
    return results


async def probes_after(url: str) -> list[float | None]:
    """PROBES_AFTER probes of /healthz, one after the other."""
    return [await probe(url) for _ in range(PROBES_AFTER)]


def probe_line(name: str, latencies: list[float | None]) -> str:
    answered = [latency for latency in latencies if latency is not None]
    slowest = f", slowest {max(answered) * 1000:.0f} ms" if answered else ""
    return f"/healthz {name}: {len(answered)} of {len(latencies)} answered 200{slowest}"


def hold_report(result: Hold, clients: int, seconds: float) -> list[str]:
    """The lines a --hold run prints."""
    run = result.run
    ok = run.statuses.get(200, 0) + run.statuses.get(202, 0)
    return [line(f"{clients} clients", run),
            f"{seconds:g} s held: {run.per_second:.0f} answers/s, {ok / run.seconds:.0f} "
            f"served (200/202)/s; {result.timeouts} timeouts, {result.unanswered} unanswered, "
            f"{result.slow_busy} 503s slower than 1 s",
            probe_line("during the load", result.probes_during),
            probe_line("after the load", result.probes_after)]


def line(name: str, run: Run) -> str:
    statuses = ", ".join(f"{count}× {status}" for status, count in run.statuses.most_common())
    return (f"{name:<13}: p50 {run.percentile_ms(50):7.1f} ms  p99 {run.percentile_ms(99):7.1f}"
            f" ms  {run.per_second:7.0f} req/s  ({statuses})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--database-url", default="",
                        help="an empty database to use instead of SQLite in the data dir")
    parser.add_argument("--hold", type=float, metavar="SECONDS",
                        help="hold the server with the read/gate mix this long instead")
    parser.add_argument("--client-processes", type=int, default=4,
                        help="with --hold: spread the clients over this many processes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as folder:
        settings = Settings(data_dir=Path(folder), database_url=args.database_url)
        tokens = client_tokens(settings)
        token = tokens["gate"]
        with server(settings, free_port()) as url:
            decision = measured_pair(url, token, settings)
            if args.hold:
                result = hold(url, mixed_requests(tokens), clients=args.clients,
                              seconds=args.hold, processes=args.client_processes)
                print(f"{settings.safe_database_url.split(':')[0]}; gate verdict on the "
                      f"measured pair: {decision['verdict']}")
                print(f"{args.client_processes} client process(es)")
                print("\n".join(hold_report(result, args.clients, args.hold)))
                return
            gate = {"json": GATE_REQUEST, "headers": {"Authorization": f"Bearer {token}"}}
            runs = {}
            for name, method, path, options in (("GET /healthz", "GET", "/healthz", {}),
                                                ("POST /gate", "POST", "/gate", gate)):
                asyncio.run(load(url, method, path, clients=args.clients,
                                 requests=args.clients * 2, **options))  # warm-up
                runs[name] = asyncio.run(load(url, method, path, clients=args.clients,
                                              requests=args.requests, **options))
    trivial, gated = runs["GET /healthz"], runs["POST /gate"]
    print(f"{args.requests} requests per endpoint from {args.clients} concurrent clients on "
          f"loopback; {settings.safe_database_url.split(':')[0]}; gate verdict on the measured "
          f"pair: {decision['verdict']}")
    print(line("GET /healthz", trivial))
    print(line("POST /gate", gated))
    print(f"gate / healthz: p50 {gated.percentile_ms(50) / trivial.percentile_ms(50):.1f}×, "
          f"p99 {gated.percentile_ms(99) / trivial.percentile_ms(99):.1f}×, "
          f"throughput {gated.per_second / trivial.per_second:.2f}×")
    if len(gated.server_ms):
        print(f"the gate's own time in the server (Server-Timing): p50 "
              f"{np.percentile(gated.server_ms, 50):.1f} ms, p99 "
              f"{np.percentile(gated.server_ms, 99):.1f} ms")


if __name__ == "__main__":
    main()
