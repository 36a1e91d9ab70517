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
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import api_server, interleaved, models_calls, percentile

GOALS = {"p50": 1.05, "p99": 1.10}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000, help="per server, after warm-up")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        clients = {name: stack.enter_context(
                       api_server(Path(folder) / name, FLIPGATE_METRICS=str(metrics).lower()))
                   for name, metrics in (("with", True), ("without", False))}
        times = interleaved(models_calls(clients), args.requests)
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
