"""Where one request's time goes (issue 43): the server CPU that GET /models costs flipgate
and the bare FastAPI app of request_bench.py, and the share of each step of the path.

    python benchmarks/request_steps.py [--requests 3000]

CPU is read from /proc before and after each server's requests (one sequential keep-alive
client; it varies less with a busy machine than latency does). The steps come from py-spy
(`pip install py-spy`; skipped without it), sampling the thread that holds the GIL: each
sample is charged to the innermost frame that names a step, so the figures are estimates.
"""

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from request_bench import bare_server, read_token
from serving import api_server, cpu_seconds, get_models, listening_pid

SAMPLES_PER_SECOND = 250
STEPS = [  # (step, a frame of it), matched from the innermost frame out
    ("authentication", r"Admission\.(look_up|admits)|token_checker"),
    ("project binding", r"require\.<locals>\.check|authorize|act_in"),
    ("audit hook", r"record_change"),
    ("session and commit", r"get_session|_commit|_end_session|enqueue_after_commit"),
    ("request guard", r"check_request_scalars"),
    ("the endpoint's query", r"list_lines \(service|models \(.*request_bench"),
    ("response validation", r"serialize_response|_rendered \(service"),
    ("access log line", r"Logger\.(info|_log)"),
    ("request figures", r"observe_request|count \(service/observability"),
    ("pool-thread hops", r"run_sync|run_in_threadpool|WorkerThread\.run|_worker \(concurrent"),
    ("HTTP parsing (h11)", r"H11Protocol|\(h11/|RequestResponseCycle\.send"),
    ("dependency solving", r"solve_dependencies"),
    ("routing", r"_IncludedRouter\._match|Router\.__call__ \(starlette"),
    ("middleware (admission, limits, ids)", r"Observed\.__call__|Admission\.__call__|"
                                            r"RequestBodyLimit|DashboardGZip"),
]


def steps_of(samples: Path) -> Counter[str]:
    """Samples per step in py-spy's raw output (`stack count` per line)."""
    steps: Counter[str] = Counter()
    for line in samples.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = reversed(stack.split(";"))
        step = next((name for frame in frames for name, pattern in STEPS
                     if re.search(pattern, frame)), "event loop, other")
        steps[step] += int(count)
    return steps


def measured(client: httpx.Client, requests: int, samples: Path | None) -> float:
    """CPU seconds a request costs the server of `client` (sampled into `samples`)."""
    pid = listening_pid(client.base_url.port)
    for _ in range(200):
        get_models(client)
    spy = None if samples is None else subprocess.Popen(
        ["py-spy", "record", "-p", str(pid), "-o", str(samples), "-f", "raw", "--gil",
         "-r", str(SAMPLES_PER_SECOND)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = cpu_seconds(pid)
    for _ in range(requests):
        get_models(client)
    used = (cpu_seconds(pid) - before) / requests
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait()
    return used


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    sampling = shutil.which("py-spy") is not None
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        admin = stack.enter_context(api_server(Path(folder) / "flipgate"))
        token = read_token(admin)
        clients = {"flipgate": stack.enter_context(httpx.Client(
                       base_url=admin.base_url, headers={"Authorization": f"Bearer {token}"})),
                   "bare": stack.enter_context(bare_server(
                       Path(folder) / "flipgate" / "data" / "flipgate.db", token))}
        samples = {name: Path(folder) / f"{name}.txt" if sampling else None for name in clients}
        cpu = {name: measured(client, args.requests, samples[name])
               for name, client in clients.items()}
        steps = {name: steps_of(path) for name, path in samples.items() if path is not None}
    print(f"server CPU per GET /models ({args.requests} requests): flipgate "
          f"{cpu['flipgate'] * 1e6:.0f} us, bare {cpu['bare'] * 1e6:.0f} us, "
          f"{cpu['flipgate'] / cpu['bare']:.2f}x")
    if not steps:
        print("(py-spy is not installed: no steps)")
        return 0
    print(f"{'step':<38} {'flipgate us':>12} {'bare us':>9}")
    for step, _ in [*STEPS, ("event loop, other", "")]:
        figures = [cpu[name] * 1e6 * steps[name][step] / max(sum(steps[name].values()), 1)
                   for name in ("flipgate", "bare")]
        print(f"{step:<38} {figures[0]:>12.0f} {figures[1]:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
