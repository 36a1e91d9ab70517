"""flipgate beyond one machine, against a real S3 server (SeaweedFS, tests/s3server.py): two
API processes (`flipgate serve --api-only`) and two `flipgate worker` processes on one
PostgreSQL schema and one Redis broker, each with its own empty data folder (and each worker
its own cache), no folder shared. The whole flow (register, compare, gate, repair) leaves
every artifact in the bucket and none in any process's folder; the same bytes uploaded to
both API processes at once are stored once."""

import hashlib
import io
import os
import re
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from flipgate.processes import free_port
from service.config import Settings
from service.db import settings_session
from service.housekeeping import referenced_artifacts
from service.migrate import upgrade
from tests.e2e.conftest import empty_redis, flipgate_env, flipgate_process, wait_for
from tests.e2e.test_gate_flow import final, ready
from tests.e2e.test_gate_flow import register as register_digits
from tests.e2e.test_gate_flow import repair as elodi_repair
from tests.s3server import S3Server
from tests.service.conftest import postgres_schema

REDIS_URL = os.environ.get("FLIPGATE_TEST_S3_REDIS_URL", "redis://127.0.0.1:6379/13")
TOKEN = "e2e-object-store-admin-token-0123"
ADDRESS = re.compile(r"sha256/([0-9a-f]{2})/([0-9a-f]{62})")
pytestmark = pytest.mark.slow


@dataclass
class Deployment:
    """Two API processes and two workers on one database, broker and bucket prefix."""

    s3: S3Server
    prefix: str
    database_url: str
    apis: list[httpx.Client]
    folders: dict[str, Path]  # each process's own folder: api-1, api-2, worker-1, worker-2

    def addresses(self) -> set[str]:
        """The sha256 of every artifact object under the prefix."""
        return {"".join(match.groups()) for key in self.s3.keys(self.prefix)
                if (match := ADDRESS.search(key))}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, s3) -> Iterator[Deployment]:
    folder = tmp_path_factory.mktemp("deployment")
    prefix = folder.name
    with postgres_schema() as database_url, ExitStack() as stack:
        upgrade(Settings(database_url=database_url))
        env = flipgate_env(FLIPGATE_DATABASE_URL=database_url, FLIPGATE_ADMIN_TOKEN=TOKEN,
                           FLIPGATE_REDIS_URL=empty_redis(REDIS_URL), FLIPGATE_SHARD_SIZE="100",
                           **s3.flipgate_env(prefix))
        folders = {name: folder / name for name in ("api-1", "api-2", "worker-1", "worker-2")}
        apis = []
        for name, own in folders.items():
            own.mkdir()
            own_env = {**env, "FLIPGATE_DATA_DIR": str(own / "data"),
                       "FLIPGATE_CACHE_DIR": str(own / "cache")}
            if name.startswith("worker"):
                stack.enter_context(flipgate_process(["worker"], own_env, own))
                continue
            port = free_port()
            stack.enter_context(flipgate_process(["serve", "--api-only", "--port", str(port)],
                                                 own_env, own))
            apis.append(stack.enter_context(httpx.Client(
                base_url=f"http://127.0.0.1:{port}", timeout=60,
                headers={"Authorization": f"Bearer {TOKEN}"})))
        for client in apis:
            wait_for(lambda client=client: ready(client), f"{client.base_url}/readyz")
        wait_for(lambda: all("ready" in log.read_text() for log in (
            folders["worker-1"] / "worker.log", folders["worker-2"] / "worker.log")),
            "two ready workers")
        yield Deployment(s3, prefix, database_url, apis, folders)


def address(sha256: str) -> str:
    return f"sha256/{sha256[:2]}/{sha256[2:]}"


def stored_files(folder: Path) -> list[Path]:
    """The files under a folder (none when it does not exist)."""
    return [path for path in folder.rglob("*") if path.is_file()]


def test_the_whole_flow_keeps_every_artifact_in_the_bucket(deployment, digits):
    first, second = deployment.apis
    register_digits(first, digits)
    compared = second.post("/compare/digits:1/digits:2", params={"evalset": "eval"})
    assert compared.status_code in (200, 202), compared.text
    assert first.post("/gate", json={"model": "digits", "candidate": "1"}).json()[
        "verdict"] == "approve"
    assert second.post("/models/digits/aliases/production", json={"version": "1"}).is_success
    first.put("/models/digits/policy", json={"max_nfr": 0.06, "evalsets": ["eval"]})
    blocked = final(second, first.post("/gate", json={"model": "digits", "candidate": "2"})
                    .json()["decision_id"])
    assert blocked["verdict"] == "block", blocked["reasons"]
    repaired = elodi_repair(second, blocked["decision_id"])
    assert repaired["verdict"] == "approve", repaired["reasons"]
    report = first.get("/compare/digits:1/digits:2", params={"evalset": "eval"})
    assert report.status_code == 200 and report.json()["n"] == 797
    deployed = second.get("/models/digits/versions/1/artifact")  # what a deploy job fetches
    assert deployed.status_code == 200 and deployed.content == digits["1"].read_bytes()

    with settings_session(Settings(database_url=deployment.database_url)) as session:
        referenced = referenced_artifacts(session=session)
    assert len(referenced) >= 9  # 3 models, 2 data sets, logits of 3 versions, a report
    assert referenced <= deployment.addresses()
    assert deployment.s3.incomplete_uploads(deployment.prefix) == []
    for name in ("api-1", "api-2"):
        assert stored_files(deployment.folders[name] / "data" / "artifacts" / "sha256") == []
    for name in ("worker-1", "worker-2"):  # each read what it needed through its own cache
        assert stored_files(deployment.folders[name] / "cache"), name
        assert stored_files(deployment.folders[name] / "data" / "artifacts" / "sha256") == []


def npy_bytes(rows: int, classes: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(seed).normal(size=(rows, classes)).astype(np.float32))
    return buffer.getvalue()


def test_the_same_bytes_uploaded_to_two_api_processes_at_once_are_stored_once(deployment):
    first, second = deployment.apis
    rows, classes = 20_000, 50  # 4 MB: the two uploads overlap
    labels = np.random.default_rng(0).integers(0, classes, rows)
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((rows, 1), np.float32), y=labels)
    assert first.post("/evalsets", data={"name": "twice"},
                      files={"data": ("twice.npz", buffer.getvalue())}).status_code == 201
    for version in ("1", "2"):
        assert first.post("/models", data={"name": "twice", "version": version,
                                            "num_classes": str(classes)}).status_code == 201
    logits = npy_bytes(rows, classes, seed=1)
    before = set(deployment.s3.keys(deployment.prefix))
    start, answers = threading.Barrier(2), {}

    def upload(client: httpx.Client, version: str) -> None:
        start.wait()
        answers[version] = client.put(
            f"/models/twice/versions/{version}/predictions", params={"evalset": "twice"},
            content=logits, headers={"Content-Type": "application/octet-stream"})

    threads = [threading.Thread(target=upload, args=(client, version))
               for client, version in ((first, "1"), (second, "2"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [answers[version].status_code for version in ("1", "2")] == [201, 201], answers
    stored = [answers[version].json() for version in ("1", "2")]
    assert stored[0]["logits_sha256"] == stored[1]["logits_sha256"] == hashlib.sha256(
        logits).hexdigest()
    assert stored[0]["classes_sha256"] == stored[1]["classes_sha256"]
    new_keys = set(deployment.s3.keys(deployment.prefix)) - before  # no staging object left
    assert new_keys == {f"{deployment.prefix}/{address(stored[0][kind])}"
                        for kind in ("logits_sha256", "classes_sha256")}
    assert deployment.s3.incomplete_uploads(deployment.prefix) == []
