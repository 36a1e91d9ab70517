"""A request at the cost of its parts (issue 43): GET /models with a stored read token on
`flipgate serve --api-only` against a bare FastAPI app that does the least such a server must
do, both on the same SQLite file, one sequential keep-alive client each, interleaved.

    python benchmarks/request_bench.py [--requests 3000]

The bare app is built here from flipgate's own FastAPI, SQLAlchemy and uvicorn: a synchronous
endpoint that looks the token's sha256 up (live, unexpired), reads the lines of its project
and answers them as JSON. Printed: p50 and p99 of each, and flipgate / bare against the goal
p50 <= 1.5x.
"""

import argparse
import hashlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import api_server, interleaved, models_calls, percentile, ready

from flipgate.processes import free_port, stop_process
from tests.e2e.conftest import wait_for

GOAL = 1.5
TOKEN_SQL = ("SELECT project_id FROM api_tokens WHERE token_hash = :digest "
             "AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > CURRENT_TIMESTAMP)")
LINES_SQL = ("SELECT id, created_at, name, num_classes, class_names, training_dataset_id "
             "FROM model_lines WHERE project_id = :project ORDER BY id")


def bare_app(database_url: str):
    """The least a FastAPI server does for GET /models: authenticate, one query, JSON."""
    import json

    from fastapi import FastAPI, Header, HTTPException
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    app = FastAPI()

    @app.get("/models")
    def models(authorization: str = Header()) -> list[dict]:
        digest = hashlib.sha256(authorization.removeprefix("Bearer ").encode()).hexdigest()
        with engine.connect() as connection:
            project = connection.execute(text(TOKEN_SQL), {"digest": digest}).scalar()
            if project is None:
                raise HTTPException(401)
            rows = connection.execute(text(LINES_SQL), {"project": project}).mappings()
            return [{**row, "created_at": row["created_at"].replace(" ", "T") + "Z",
                     "class_names": json.loads(row["class_names"] or "null")} for row in rows]

    return app


@contextmanager
def bare_server(database: Path, token: str) -> Iterator[httpx.Client]:
    """The bare app under uvicorn in a process of its own, on `database`."""
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "--serve-bare", str(database),
                                str(port)])
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          headers={"Authorization": f"Bearer {token}"}) as client:
            wait_for(lambda: ready_bare(client), "the bare app")
            yield client
    finally:
        stop_process(process)


def ready_bare(client: httpx.Client) -> bool:
    try:
        return client.get("/models").status_code == 200
    except httpx.TransportError:
        return False


def serve_bare(database: str, port: str) -> None:
    import uvicorn

    uvicorn.run(bare_app(f"sqlite:///{database}"), host="127.0.0.1", port=int(port),
                log_level="warning", access_log=False)


def read_token(admin: httpx.Client) -> str:
    """A new read token of the default project, minted through the API."""
    minted = admin.post("/tokens", json={"name": "bench-reader", "scopes": ["read"]})
    minted.raise_for_status()
    return minted.json()["token"]


def main() -> int:
    if sys.argv[1:2] == ["--serve-bare"]:
        serve_bare(*sys.argv[2:4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="per server, after warm-up")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        admin = stack.enter_context(api_server(Path(folder) / "flipgate"))
        token = read_token(admin)
        flipgate = stack.enter_context(httpx.Client(
            base_url=admin.base_url, headers={"Authorization": f"Bearer {token}"}))
        assert ready(flipgate)
        database = Path(folder) / "flipgate" / "data" / "flipgate.db"
        bare = stack.enter_context(bare_server(database, token))
        assert flipgate.get("/models").json() == bare.get("/models").json()
        times = interleaved(models_calls({"flipgate": flipgate, "bare": bare}), args.requests)
    print(f"GET /models with a stored read token, one keep-alive client, {args.requests} "
          "interleaved requests each")
    print(f"{'':<10} {'p50 ms':>8} {'p99 ms':>8}")
    for name, runs in times.items():
        print(f"{name:<10} {percentile(runs, 50) * 1000:>8.3f} {percentile(runs, 99) * 1000:>8.3f}")
    ratio = percentile(times["flipgate"], 50) / percentile(times["bare"], 50)
    print(f"p50 flipgate / bare: {ratio:.3f}x (goal <= {GOAL:.2f}x)")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
