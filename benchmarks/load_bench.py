"""A thousand clients (issue 43): keep-alive clients that hold `flipgate serve --api-only
--workers N` on PostgreSQL and Redis with the requests of a company's CI, one process against
two, side by side.

    python benchmarks/load_bench.py [--clients 1000] [--seconds 60] [--workers 1 2]
                                    [--client-processes 4] [--database-url URL]
                                    [--redis-url URL] [--honor-retry-after]

The database is a schema of its own in --database-url (created, migrated, and dropped at the
end), reached through connections named by their application_name so that they can be
counted. gate_bench's measured pair is seeded once, with a `flipgate worker` beside the
server (stopped before the load). Then, for each --workers N, the server is started anew and
held for --seconds by --clients aiohttp sessions of one connection each, spread over
--client-processes processes, each asking again as soon as it is answered: half GET
/compare of the pair and a quarter GET /models (a `read` token), a quarter POST /gate on the
measured pair (a `gate` token: a CI job run again); with --honor-retry-after a client answered
503 waits the Retry-After it was given before it asks again, as a well-behaved client does
(without it, it asks again at once: the harshest load). Printed per N: the answers by status,
the 503s (how many carried Retry-After, p50/p99 of their latency: goal <= 100 ms), timeouts
and transport errors, p50/p99 of the 200s (goal p99 <= 1 s), and the throughput; then what
is left held with the server still up and idle: the schema's connections in pg_stat_activity
by state (at most N x the pool's size, none in a transaction), open jobs, and whether
sequential requests on new connections are all admitted.
"""

import argparse
import asyncio
import multiprocessing
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import numpy as np
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_bench import EVALSET, GATE_REQUEST, LINE, client_tokens, measured_pair, server

from flipgate.processes import free_port
from service.config import Settings
from service.db import POOL_SIZE, settings_session
from service.jobs.models import Job
from service.jobs.service import OPEN_STATES

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/12"
REQUEST_TIMEOUT_SECONDS = 30  # an answer later than this counts as a timeout
BUSY_GOAL_MS, P99_GOAL_MS = 100, 1000
ADMITTED_CHECKS = 40  # sequential requests on new connections after the load


@dataclass
class Tally:
    """What the clients of one process saw."""

    statuses: Counter = field(default_factory=Counter)
    ok_seconds: list[float] = field(default_factory=list)  # latency of each 200
    busy_seconds: list[float] = field(default_factory=list)  # latency of each 503
    busy_with_retry_after: int = 0
    timeouts: int = 0
    errors: Counter = field(default_factory=Counter)

    def add(self, other: "Tally") -> "Tally":
        self.statuses += other.statuses
        self.ok_seconds += other.ok_seconds
        self.busy_seconds += other.busy_seconds
        self.busy_with_retry_after += other.busy_with_retry_after
        self.timeouts += other.timeouts
        self.errors += other.errors
        return self


@contextmanager
def postgres_schema(base_url: str) -> Iterator[tuple[str, str]]:
    """A new schema in the database at `base_url`, dropped afterwards: a URL whose
    connections use it under an application_name of their own, and that name."""
    name = f"load_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base_url)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{name}"'))
    try:
        yield make_url(base_url).update_query_dict(
            {"options": f"-csearch_path={name}", "application_name": name}
        ).render_as_string(hide_password=False), name
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()


def ci_requests(tokens: dict[str, str]) -> list[tuple[str, str, dict]]:
    """One client's turn of four: GET /compare twice, POST /gate once, GET /models once."""
    read = {"Authorization": f"Bearer {tokens['read']}"}
    compare = ("GET", f"/compare/{LINE}:1/{LINE}:2", {"params": {"evalset": EVALSET},
                                                       "headers": read})
    return [compare, ("POST", "/gate", {"json": GATE_REQUEST, "headers": {
        "Authorization": f"Bearer {tokens['gate']}"}}), compare,
        ("GET", "/models", {"headers": read})]


def hold(url: str, requests: list[tuple[str, str, dict]], *, clients: int, seconds: float,
         processes: int, backing_off: bool) -> tuple[Tally, float]:
    """`clients` keep-alive clients spread over `processes` processes, asking in turn for
    `seconds`: what they saw together, and the wall time."""
    shares = [clients // processes + (index < clients % processes) for index in range(processes)]
    offsets = np.cumsum([0, *shares[:-1]])
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        started = time.perf_counter()
        parts = [pool.submit(hold_share, url, requests, share, int(offset), seconds, backing_off)
                 for share, offset in zip(shares, offsets, strict=True)]
        tally = Tally()
        for part in parts:
            tally.add(part.result())
    return tally, time.perf_counter() - started


def hold_share(url: str, requests: list[tuple[str, str, dict]], clients: int, offset: int,
               seconds: float, backing_off: bool) -> Tally:
    """In a client process: what its clients saw."""
    return asyncio.run(hold_clients(url, requests, clients, offset, seconds, backing_off))


async def hold_clients(url: str, requests: list[tuple[str, str, dict]], clients: int,
                       offset: int, seconds: float, backing_off: bool) -> Tally:
    tally, deadline = Tally(), time.monotonic() + seconds
    await asyncio.gather(*(one_client(url, requests, offset + index, deadline, tally,
                                      backing_off) for index in range(clients)))
    return tally


async def one_client(url: str, requests: list[tuple[str, str, dict]], turn: int,
                     deadline: float, tally: Tally, backing_off: bool) -> None:
    """One session of one connection, kept alive (reopened only when the server closes it),
    asking in turn until `deadline` (after a 503, with `backing_off`, once its Retry-After
    has passed)."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=1),
                                     timeout=timeout) as http:
        while time.monotonic() < deadline:
            method, path, options = requests[turn % len(requests)]
            turn += 1
            started = time.perf_counter()
            try:
                async with http.request(method, path, **options) as response:
                    await response.read()
            except TimeoutError:
                tally.timeouts += 1
                continue
            except aiohttp.ClientError as error:
                tally.errors[type(error).__name__] += 1
                continue
            latency = time.perf_counter() - started
            tally.statuses[response.status] += 1
            if response.status == 200:
                tally.ok_seconds.append(latency)
            elif response.status == 503:
                tally.busy_seconds.append(latency)
                tally.busy_with_retry_after += "Retry-After" in response.headers
                if backing_off and "Retry-After" in response.headers:
                    await asyncio.sleep(min(float(response.headers["Retry-After"]),
                                            max(deadline - time.monotonic(), 0)))


def held_afterwards(settings: Settings, url: str, token: str, *, base_url: str,
                    application: str, workers: int) -> list[str]:
    """What is left held with the server up and idle: connections, jobs, admission."""
    engine = create_engine(base_url)
    with engine.connect() as connection:
        states = dict(connection.execute(text(
            "SELECT coalesce(state, '?'), count(*) FROM pg_stat_activity "
            "WHERE application_name = :name GROUP BY 1"), {"name": application}).all())
    engine.dispose()
    with settings_session(settings) as session:
        open_jobs = session.scalar(select(func.count()).select_from(Job).where(
            Job.state.in_(OPEN_STATES)))
    admitted = Counter()
    for _ in range(ADMITTED_CHECKS):  # a new connection each: any process may take it
        admitted[httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {token}"},
                           timeout=REQUEST_TIMEOUT_SECONDS).status_code] += 1
    connections = sum(states.values())
    in_transaction = sum(count for state, count in states.items() if state != "idle")
    return [f"  afterwards: {connections} connections ({fmt(states)}; pool "
            f"{workers} x {POOL_SIZE} = {workers * POOL_SIZE}), {in_transaction} not idle; "
            f"{open_jobs} open jobs; {ADMITTED_CHECKS} sequential GET /models on new "
            f"connections: {fmt(admitted)}"]


def report(workers: int, clients: int, tally: Tally, seconds: float) -> list[str]:
    ok, busy = np.array(tally.ok_seconds) * 1000, np.array(tally.busy_seconds) * 1000
    answers = sum(tally.statuses.values())
    lines = [f"--workers {workers}: {clients} clients, {seconds:.0f} s",
             f"  answers by status: {fmt(tally.statuses)}; {tally.timeouts} timeouts; "
             f"errors: {fmt(tally.errors) or 0}",
             f"  throughput: {answers / seconds:.0f} answers/s, {len(ok) / seconds:.0f} 200s/s"]
    if len(ok):
        lines.append(f"  200s: p50 {np.percentile(ok, 50):.0f} ms, p99 "
                     f"{np.percentile(ok, 99):.0f} ms (goal p99 <= {P99_GOAL_MS} ms)")
    if len(busy):
        lines.append(f"  503s: {len(busy)}, {tally.busy_with_retry_after} with Retry-After; "
                     f"p50 {np.percentile(busy, 50):.0f} ms, p99 {np.percentile(busy, 99):.0f}"
                     f" ms (goal <= {BUSY_GOAL_MS} ms)")
    return lines


def fmt(counts: Counter | dict) -> str:
    return ", ".join(f"{count}x {key}" for key, count in sorted(counts.items(), key=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--database-url", default=POSTGRES_URL)
    parser.add_argument("--redis-url", default=REDIS_URL)
    parser.add_argument("--honor-retry-after", action="store_true",
                        help="a client answered 503 waits its Retry-After before asking again")
    args = parser.parse_args()
    lines = []
    with (tempfile.TemporaryDirectory(prefix="load-bench-") as folder,
          postgres_schema(args.database_url) as (database_url, application)):
        settings = Settings(data_dir=Path(folder), database_url=database_url,
                            redis_url=args.redis_url)
        tokens = client_tokens(settings)
        with server(settings, free_port()) as url:
            verdict = measured_pair(url, tokens["gate"], settings)["verdict"]
        lines.append(f"PostgreSQL and Redis; the gate's verdict on the measured pair: {verdict}; "
                     f"{args.client_processes} client processes; clients "
                     f"{'wait' if args.honor_retry_after else 'do not wait'} for Retry-After")
        for workers in args.workers:
            with server(settings, free_port(), "--workers", str(workers)) as url:
                tally, seconds = hold(url, ci_requests(tokens), clients=args.clients,
                                      seconds=args.seconds, processes=args.client_processes,
                                      backing_off=args.honor_retry_after)
                lines += report(workers, args.clients, tally, seconds)
                lines += held_afterwards(settings, url, tokens["read"], base_url=args.database_url,
                                         application=application, workers=workers)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
