"""Traces (the `otel` extra): a gate's request, its database statements, its broker sends and
the jobs it queued form one trace, the jobs' spans children of the request's, and a second
request that reuses the open jobs links to them. The app and the worker's tasks run in one
fresh interpreter (tracing is process-wide) with an in-memory span exporter."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("opentelemetry.instrumentation.fastapi")
pytestmark = pytest.mark.slow  # a fresh interpreter imports the app and the worker's tasks

SCRIPT = """
    import json, sys
    from pathlib import Path
    import numpy as np
    from fastapi.testclient import TestClient
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from service.config import Settings
    from service.main import create_app
    from service.migrate import upgrade
    from service.observability import tracing
    from tests.conftest import linear_onnx
    from worker import runtime, tasks

    folder, token = Path(sys.argv[1]), "trace-admin-token-0123456789"
    settings = Settings(database_url=f"sqlite:///{folder / 'db.sqlite'}",
                        data_dir=folder / "data", admin_token=token,
                        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9/unused")
    exporter = InMemorySpanExporter()
    tracing.start("api", exporter)  # create_app finds tracing on and adds its requests
    upgrade(settings)
    app = create_app(settings)
    rng = np.random.default_rng(0)
    client = TestClient(app, headers={"Authorization": f"Bearer {token}"})
    for version in ("1", "2"):
        model = linear_onnx(folder / f"{version}.onnx", rng.normal(size=(4, 3)),
                            rng.normal(size=3), ("N", 4))
        assert client.post("/models", data={"name": "digits", "version": version}, files={
            "artifact": ("m.onnx", model.read_bytes())}).status_code == 201
    np.savez(folder / "eval.npz", x=rng.normal(size=(200, 4)).astype(np.float32),
             y=rng.integers(0, 3, 200))
    assert client.post("/evalsets", data={"name": "eval"}, files={
        "data": ("e.npz", (folder / "eval.npz").read_bytes())}).status_code == 201
    assert client.post("/gate", json={"model": "digits", "candidate": "1"}).json()[
        "verdict"] == "approve"
    assert client.post("/models/digits/aliases/production", json={"version": "1"}).is_success
    assert client.put("/models/digits/policy", json={"max_nfr": 0.5, "evalsets": ["eval"]}
                      ).is_success
    gate = client.post("/gate", json={"model": "digits", "candidate": "2"}).json()
    again = client.post("/compare/digits:1/digits:2", params={"evalset": "eval"}).json()
    context = runtime.WorkerContext(app.state.sessions, app.state.store, app.state.celery,
                                    settings)
    runtime.context = lambda: context
    for job_id in gate["waiting_for"]:
        kind = client.get(f"/jobs/{job_id}").json()["kind"]
        getattr(tasks, kind)(job_id)
    decision = client.get(f"/gate/decisions/{gate['decision_id']}").json()
    trace.get_tracer_provider().force_flush()
    spans = [{"name": span.name, "trace": f"{span.context.trace_id:032x}",
              "id": f"{span.context.span_id:016x}",
              "parent": span.parent and f"{span.parent.span_id:016x}",
              "links": [f"{link.context.span_id:016x}" for link in span.links],
              "attributes": {key: value for key, value in span.attributes.items()
                             if key.startswith("flipgate.")}}
             for span in exporter.get_finished_spans()]
    print(json.dumps({"gate": gate, "again": again, "verdict": decision["verdict"],
                      "spans": spans}))
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("traced")
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(folder)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def request_span(spans: list[dict], name: str) -> dict:
    """The server span of the last request named `name` (method and route template); spans
    are exported as they end."""
    return [span for span in spans if span["name"] == name and span["parent"] is None][-1]


def test_the_gates_jobs_continue_its_trace(traced):
    spans = traced["spans"]
    gate = request_span(spans, "POST /gate")
    assert traced["verdict"] in ("approve", "block")
    jobs = {span["attributes"]["flipgate.job.id"]: span for span in spans
            if span["name"].startswith("job ")}
    assert sorted(jobs) == sorted(traced["gate"]["waiting_for"])
    assert {(span["trace"], span["parent"]) for span in jobs.values()} == {
        (gate["trace"], gate["id"])}
    in_trace = {span["name"] for span in spans if span["trace"] == gate["trace"]}
    assert any(name.lower().startswith("insert") for name in in_trace), in_trace  # the DB
    assert any("flipgate.inference" in name for name in in_trace), in_trace  # the broker


def test_a_request_that_reuses_open_jobs_links_to_their_trace(traced):
    spans = traced["spans"]
    gate = request_span(spans, "POST /gate")
    again = request_span(spans, "POST /compare/{old}/{new}")
    assert again["trace"] != gate["trace"]
    assert set(traced["again"]["job_ids"]) <= set(traced["gate"]["waiting_for"])
    assert gate["id"] in again["links"]
