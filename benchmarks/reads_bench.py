"""The reads a CI job and the dashboard make, against their floor (issue 43): GET
/compare/{old}/{new}?evalset= of a measured pair, GET /gate/decisions/{id}, and POST /gate on
a pair already measured (a CI job run again), each on `flipgate serve --api-only` against a
bare FastAPI app that runs the SQL the endpoint needs directly through SQLAlchemy, on the same
SQLite file, one sequential keep-alive client each, interleaved.

    python benchmarks/reads_bench.py [--requests 1000]

The pair is gate_bench's: a line of two versions with uploaded logits on an eval set, measured
once by a `flipgate worker` (stopped before the timing). The floor of each read, written here:
the token's look-up, the rows the answer is made of (for POST /gate: the line, both versions,
the policy, the eval set and the pair's metrics, then the decision and its audit event
inserted and committed), and the answer's JSON; it is also timed in this process, without
HTTP. Printed: p50 and p99 of each, and flipgate / floor against the goal p50 <= 2x.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_bench import (
    EVALSET,
    GATE_REQUEST,
    LINE,
    client_tokens,
    flipgate,
    measured_pair,
    wait_until_up,
)
from request_bench import TOKEN_SQL
from serving import interleaved, percentile

from flipgate.processes import free_port, stop_process
from service.config import Settings
from tests.e2e.conftest import wait_for

GOAL = 2.0
OLD, NEW = f"{LINE}:1", f"{LINE}:2"
DATASET_SQL = "SELECT id FROM datasets WHERE project_id = :project AND name = :name"
VERSION_SQL = ("SELECT v.id FROM model_versions v JOIN model_lines l ON l.id = v.line_id "
               "WHERE l.project_id = :project AND l.name = :line AND v.version = :version")
REPORT_SQL = ("SELECT report FROM pair_metrics WHERE dataset_id = :dataset AND old_version_id "
              "= :old AND new_version_id = :new ORDER BY label_revision DESC LIMIT 1")
SOURCES_SQL = ("SELECT version_id, coalesce(provider, source) FROM predictions "
               "WHERE dataset_id = :dataset AND version_id IN (:old, :new)")
DECISION_SQL = ("SELECT d.*, l.name AS line FROM gate_decisions d JOIN model_lines l "
                "ON l.id = d.line_id WHERE d.id = :id AND d.project_id = :project")
VERSIONS_SQL = "SELECT id, version FROM model_versions WHERE id IN (:candidate, :baseline)"
LINE_SQL = "SELECT id FROM model_lines WHERE project_id = :project AND name = :name"
POLICY_SQL = ("SELECT version, rules FROM gate_policies WHERE line_id = :line "
              "ORDER BY version DESC LIMIT 1")
METRICS_SQL = ("SELECT nfr, pfr, churn, negative_flips, positive_flips, n FROM pair_metrics "
               "WHERE dataset_id = :dataset AND old_version_id = :old AND new_version_id = :new "
               "ORDER BY label_revision DESC LIMIT 1")
INSERT_DECISION_SQL = (
    "INSERT INTO gate_decisions (project_id, created_at, line_id, candidate_id, baseline_id, "
    "verdict, reasons, metrics, evalsets, policy_version, policy, requested_by, request_sha256, "
    "base_url, decided_at) VALUES (:project, CURRENT_TIMESTAMP, :line, :candidate, :baseline, "
    "'approve', '[]', :metrics, :evalsets, NULL, '{}', 'bench-gate', :digest, '', "
    "CURRENT_TIMESTAMP)")
INSERT_AUDIT_SQL = (
    "INSERT INTO audit_events (created_at, actor, auth, project_id, action, resource, outcome, "
    "details) VALUES (CURRENT_TIMESTAMP, 'bench-gate', 'token', :project, 'gate', '/gate', "
    "'ok', :details)")


def project_of(connection: Any, authorization: str) -> int:
    digest = hashlib.sha256(authorization.removeprefix("Bearer ").encode()).hexdigest()
    project = connection.execute(text(TOKEN_SQL), {"digest": digest}).scalar()
    if project is None:
        raise PermissionError(authorization)
    return project


def version_id(connection: Any, project: int, reference: str) -> int:
    line, version = reference.split(":")
    return connection.execute(text(VERSION_SQL), {"project": project, "line": line,
                                                  "version": version}).scalar_one()


def compare_floor(connection: Any, authorization: str) -> bytes:
    """GET /compare/OLD/NEW?evalset=EVALSET: the stored report with both sides' sources."""
    project = project_of(connection, authorization)
    dataset = connection.execute(text(DATASET_SQL), {"project": project,
                                                     "name": EVALSET}).scalar_one()
    pair = {"dataset": dataset, "old": version_id(connection, project, OLD),
            "new": version_id(connection, project, NEW)}
    report = connection.execute(text(REPORT_SQL), pair).scalar_one()
    providers = dict(connection.execute(text(SOURCES_SQL), pair).all())
    sources = {side: {"source": name, "provider": providers[pair[side]]}
               for side, name in (("old", OLD), ("new", NEW))}
    return json.dumps({**json.loads(report), **sources}).encode()


def decision_floor(connection: Any, authorization: str, decision_id: int) -> bytes:
    """GET /gate/decisions/{id}: the decision's row with its line's and versions' names."""
    project = project_of(connection, authorization)
    row = connection.execute(text(DECISION_SQL), {"id": decision_id,
                                                  "project": project}).mappings().one()
    names = dict(connection.execute(text(VERSIONS_SQL), {"candidate": row["candidate_id"],
                                                          "baseline": row["baseline_id"]}).all())
    return json.dumps({
        "decision_id": row["id"], "verdict": row["verdict"], "model": row["line"],
        "candidate": names[row["candidate_id"]], "baseline": names[row["baseline_id"]],
        **{key: json.loads(row[key]) for key in ("reasons", "metrics", "evalsets", "policy")},
        **{key: row[key] for key in ("policy_version", "requested_by", "created_at",
                                     "decided_at")}}).encode()


def gate_floor(connection: Any, authorization: str, body: bytes) -> bytes:
    """POST /gate on a measured pair: the rows it decides on, the decision and its audit
    event inserted and committed."""
    request = json.loads(body)
    project = project_of(connection, authorization)
    line = connection.execute(text(LINE_SQL), {"project": project,
                                               "name": request["model"]}).scalar_one()
    candidate, baseline = (version_id(connection, project, f"{request['model']}:{name}")
                           for name in (request["candidate"], request["baseline"]))
    connection.execute(text(POLICY_SQL), {"line": line}).one_or_none()
    dataset = connection.execute(text(DATASET_SQL), {"project": project,
                                                     "name": request["evalsets"][0]}).scalar_one()
    metrics = {request["evalsets"][0]: dict(connection.execute(text(METRICS_SQL), {
        "dataset": dataset, "old": baseline, "new": candidate}).mappings().one())}
    decision = connection.execute(text(INSERT_DECISION_SQL), {
        "project": project, "line": line, "candidate": candidate, "baseline": baseline,
        "metrics": json.dumps(metrics), "evalsets": json.dumps(request["evalsets"]),
        "digest": hashlib.sha256(body).hexdigest()}).lastrowid
    connection.execute(text(INSERT_AUDIT_SQL), {"project": project, "details": json.dumps(
        {"decision_id": decision, "verdict": "approve"})})
    connection.commit()
    return json.dumps({"decision_id": decision, "verdict": "approve", "model": request["model"],
                       "candidate": request["candidate"], "baseline": request["baseline"],
                       "metrics": metrics, "evalsets": request["evalsets"]}).encode()


def floor_app(database_url: str):
    """The floor of the three reads as a FastAPI app: the SQL above, and its JSON."""
    from fastapi import FastAPI, Header, Request, Response

    engine = create_engine(database_url)
    app = FastAPI()

    @app.get("/compare/{old}/{new}")
    def compare(old: str, new: str, evalset: str, authorization: str = Header()) -> Response:
        with engine.connect() as connection:
            return Response(compare_floor(connection, authorization),
                            media_type="application/json")

    @app.get("/gate/decisions/{decision_id}")
    def decision(decision_id: int, authorization: str = Header()) -> Response:
        with engine.connect() as connection:
            return Response(decision_floor(connection, authorization, decision_id),
                            media_type="application/json")

    @app.post("/gate")
    async def gate(request: Request, authorization: str = Header()) -> Response:
        body = await request.body()
        with engine.connect() as connection:
            return Response(gate_floor(connection, authorization, body),
                            media_type="application/json")

    return app


def serve_floor(database: str, port: str) -> None:
    import uvicorn

    uvicorn.run(floor_app(f"sqlite:///{database}"), host="127.0.0.1", port=int(port),
                log_level="warning", access_log=False)


@contextmanager
def flipgate_server(settings: Settings) -> Iterator[tuple[str, int]]:
    """`flipgate serve --api-only` with `settings` (one process): its URL and process id."""
    url = f"http://127.0.0.1:{free_port()}"
    with flipgate(settings, "serve", "--api-only", "--port", url.rsplit(":", 1)[1]) as process:
        wait_until_up(url, process, settings.data_dir / "serve.log")
        yield url, process.pid


@contextmanager
def floor_server(database: Path) -> Iterator[tuple[str, int]]:
    """The floor app under uvicorn in a process of its own, on `database`: its URL and
    process id."""
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "--serve-floor", str(database),
                                str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(url), "the floor app")
        yield url, process.pid
    finally:
        stop_process(process)


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/docs").status_code == 200
    except httpx.TransportError:
        return False


def reads(tokens: dict[str, str], decision_id: int) -> dict[str, tuple[str, str, dict]]:
    """The three requests: (method, path, httpx options)."""
    read = {"Authorization": f"Bearer {tokens['read']}"}
    return {
        "GET /compare": ("GET", f"/compare/{OLD}/{NEW}",
                         {"params": {"evalset": EVALSET}, "headers": read}),
        "GET /gate/decisions/{id}": ("GET", f"/gate/decisions/{decision_id}",
                                     {"headers": read}),
        "POST /gate (measured)": ("POST", "/gate", {
            "content": json.dumps(GATE_REQUEST).encode(),
            "headers": {"Authorization": f"Bearer {tokens['gate']}",
                        "Content-Type": "application/json"}}),
    }


def in_process(database: Path, requests: dict[str, tuple[str, str, dict]],
               decision_id: int) -> dict[str, Callable[[], bytes]]:
    """The floors of the reads called in this process, on a connection of their own."""
    connection = create_engine(f"sqlite:///{database}").connect()
    headers = {name: options["headers"]["Authorization"]
               for name, (_, _, options) in requests.items()}
    return {"GET /compare": lambda: compare_floor(connection, headers["GET /compare"]),
            "GET /gate/decisions/{id}": lambda: decision_floor(
                connection, headers["GET /gate/decisions/{id}"], decision_id),
            "POST /gate (measured)": lambda: gate_floor(
                connection, headers["POST /gate (measured)"],
                requests["POST /gate (measured)"][2]["content"])}


def http_call(client: httpx.Client, method: str, path: str, options: dict) -> Callable[[], Any]:
    def call() -> None:
        client.request(method, path, **options).raise_for_status()
    return call


WARM_UP = 100  # untimed rounds before the timed ones


def same_answers(ours: httpx.Client, floor: httpx.Client,
                 requests: dict[str, tuple[str, str, dict]]) -> None:
    """The floor answers the report flipgate answers, and the decision's numbers."""
    method, path, options = requests["GET /compare"]
    assert (ours.request(method, path, **options).json()
            == floor.request(method, path, **options).json())
    method, path, options = requests["GET /gate/decisions/{id}"]
    answered, least = (client.request(method, path, **options).json()["metrics"][EVALSET]
                       for client in (ours, floor))
    assert answered.items() >= least.items()


def main() -> int:
    if sys.argv[1:2] == ["--serve-floor"]:
        serve_floor(*sys.argv[2:4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="per read, after warm-up")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reads-bench-") as folder, ExitStack() as stack:
        settings = Settings(data_dir=Path(folder))
        tokens = client_tokens(settings)
        url, server_pid = stack.enter_context(flipgate_server(settings))
        decision = measured_pair(url, tokens["gate"], settings)
        requests = reads(tokens, decision["decision_id"])
        database = Path(folder) / "flipgate.db"
        floor_url, floor_pid = stack.enter_context(floor_server(database))
        ours = stack.enter_context(httpx.Client(base_url=url, timeout=30))
        floor = stack.enter_context(httpx.Client(base_url=floor_url, timeout=30))
        same_answers(ours, floor, requests)
        local = in_process(database, requests, decision["decision_id"])
        results, cpu = {}, {}
        for name, (method, path, options) in requests.items():
            before = cpu_seconds(server_pid), cpu_seconds(floor_pid)
            results[name] = interleaved({
                "flipgate": http_call(ours, method, path, options),
                "floor": http_call(floor, method, path, options),
                "sql": local[name]}, args.requests, WARM_UP)
            cpu[name] = [(cpu_seconds(pid) - start) / (args.requests + WARM_UP)
                         for pid, start in zip((server_pid, floor_pid), before, strict=True)]
    print(f"one sequential keep-alive client, {args.requests} interleaved requests each; "
          "floor: the same SQL through SQLAlchemy in a bare FastAPI app; sql: that SQL alone, "
          "in this process; cpu: the server process's CPU time per request")
    print(f"{'':<24} {'flipgate p50/p99 ms':>19} {'floor p50/p99 ms':>17} {'sql p50':>8} "
          f"{'p50 ratio':>9} {'cpu ms':>13} {'cpu ratio':>9}")
    worst = 0.0
    for name, times in results.items():
        ratio = percentile(times["flipgate"], 50) / percentile(times["floor"], 50)
        worst = max(worst, ratio)
        ours_cpu, floor_cpu = cpu[name]
        print(f"{name:<24} {ms(times['flipgate']):>19} {ms(times['floor']):>17} "
              f"{percentile(times['sql'], 50) * 1000:>8.3f} {ratio:>8.2f}x "
              f"{ours_cpu * 1000:>6.2f}/{floor_cpu * 1000:<6.2f} {ours_cpu / floor_cpu:>8.2f}x")
    print(f"worst p50 flipgate / floor: {worst:.2f}x (goal <= {GOAL:.1f}x)")
    return 0 if worst <= GOAL else 1


def ms(times: list[float]) -> str:
    return f"{percentile(times, 50) * 1000:.3f} / {percentile(times, 99) * 1000:.3f}"


if __name__ == "__main__":
    sys.exit(main())
