"""`flipgate serve --workers 2` against one process (issue 43): GET /models from one
sequential keep-alive client, the two servers' requests interleaved in one run.

    python benchmarks/workers_bench.py [--requests 2000] [--workers 2]

Before the shared socket was made as TCP (service/cli.py `listening_socket`), every
keep-alive response of several processes waited for the client's delayed ACK: a p50 near
40 ms. Printed: p50 and p99 of each, and several / one against the goal p50 <= 1.1x.
"""

import argparse
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import api_server, interleaved, models_calls, percentile

GOAL = 1.10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per server, after warm-up")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    several = f"--workers {args.workers}"
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        clients = {name: stack.enter_context(api_server(Path(folder) / f"w{workers}",
                                                        ("--workers", str(workers))))
                   for name, workers in (("one process", 1), (several, args.workers))}
        times = interleaved(models_calls(clients), args.requests)
    print(f"GET /models, one keep-alive client, {args.requests} interleaved requests each")
    print(f"{'':<12} {'p50 ms':>8} {'p99 ms':>8}")
    for name, runs in times.items():
        print(f"{name:<12} {percentile(runs, 50) * 1000:>8.3f} {percentile(runs, 99) * 1000:>8.3f}")
    ratio = percentile(times[several], 50) / percentile(times["one process"], 50)
    print(f"p50 {several} / one process: {ratio:.3f}x (goal <= {GOAL:.2f}x)")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
