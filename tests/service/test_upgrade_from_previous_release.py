"""Upgrading from the previous release (commit PREVIOUS, revision 0016) to projects (0017):
that release's own code, extracted from git and run in a subprocess, migrates an empty
database (a SQLite file, a PostgreSQL schema), mints tokens with its `flipgate token create`
and fills the store through its server and worker (tests/service/previous_release.py); then
`flipgate migrate` of this tree upgrades it, and this tree's app must answer every read as the
old server did, with every old token acting in the project `default` with the scopes it had.
The downgrade to 0016 gives the previous release a store it reads as before."""

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic import command
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from flipgate.signing import HEADER, signature
from service.auth.models import ApiToken
from service.auth.service import create_token
from service.config import Settings
from service.db import create_db_engine, session_scope
from service.migrate import (
    alembic_config,
    current_revision,
    head_revision,
    migrating,
    upgrade,
)
from service.projects.models import DEFAULT_PROJECT, Project
from service.projects.service import create_project
from tests.service.api.conftest import ADMIN_TOKEN, bearer, error_code, rolled_back_client
from tests.service.conftest import BACKENDS, FEATURES, empty_database, write_npz, write_onnx

PREVIOUS = "3be1750"  # the last commit before projects
PREVIOUS_REVISION = "0016_traffic_sets"
LINE = "digits"
REPO = Path(__file__).resolve().parents[2]
FILLER = Path(__file__).with_name("previous_release.py")
SECRET_KEY = "upgrade-server-key-0123456789abcdef"
SAMPLES, TRAFFIC, CLASSES = 120, 60, 3

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory) -> Path:
    """The previous release's tree, extracted once per session with `git archive`."""
    tree = tmp_path_factory.mktemp("previous-release")
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS],
                                 capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.fail(f"cannot extract the previous release {PREVIOUS} with git archive (the "
                    f"upgrade test needs the repository's history; clone without --depth): "
                    f"{getattr(error, 'stderr', b'').decode() or error}", pytrace=False)
    with tarfile.open(fileobj=io.BytesIO(archive)) as extracted:
        extracted.extractall(tree, filter="data")
    return tree


def write_inputs(folder: Path) -> None:
    """The files the filler uploads: data sets, two ONNX versions and logits in which 1.1
    flips every fourth of 1.0's right answers on eval."""
    labels = np.arange(SAMPLES) % CLASSES
    shutil.move(write_npz(folder, SAMPLES, CLASSES, seed=1), folder / "eval.npz")
    shutil.move(write_npz(folder, 40, CLASSES, seed=2), folder / "holdout.npz")
    shutil.move(write_npz(folder, 50, CLASSES, seed=3), folder / "train.npz")
    rng = np.random.default_rng(4)
    np.savez(folder / "traffic.npz", x=rng.normal(size=(TRAFFIC, FEATURES)).astype(np.float32))
    np.savez(folder / "labels.npz", index=np.arange(0, TRAFFIC, 2),
             y=np.arange(0, TRAFFIC, 2) % CLASSES)
    for version, seed in (("1.0", 0), ("1.1", 1)):
        shutil.move(write_onnx(folder, CLASSES, seed), folder / f"{version}.onnx")
    right = np.eye(CLASSES)[labels] * 5
    flipped = np.eye(CLASSES)[(labels + (np.arange(SAMPLES) % 4 == 0)) % CLASSES] * 5
    traffic = rng.normal(size=(TRAFFIC, CLASSES))
    for name, logits in {"1.0-eval": right, "1.1-eval": flipped, "1.2-eval": right,
                         "1.0-traffic": traffic,
                         "1.2-traffic": traffic + rng.normal(size=traffic.shape)}.items():
        np.save(folder / f"{name}.npy", logits.astype(np.float32))


def run_previous(tree: Path, command: str, folder: Path, database_url: str) -> dict:
    """Run the filler with the previous release's code on `database_url`; what it wrote."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("FLIPGATE_", "PYTHON"))}
    env |= {"PYTHONPATH": str(tree), "FLIPGATE_DATABASE_URL": database_url,
            "FLIPGATE_DATA_DIR": str(folder / "data"), "FLIPGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "FLIPGATE_SECRET_KEY": SECRET_KEY}
    done = subprocess.run([sys.executable, "-P", str(FILLER), command, str(folder)], env=env,
                          cwd=tree, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the previous release's {command} failed:\n{done.stderr}"
    return json.loads((folder / {"fill": "filled.json", "read": "read.json"}[command])
                      .read_text())


@pytest.fixture(scope="module", params=BACKENDS)
def filled(request, previous_release, tmp_path_factory) -> Iterator[tuple[Settings, dict]]:
    """A database the previous release migrated and filled, not yet upgraded: this tree's
    settings on it and what the previous release's server answered."""
    folder = tmp_path_factory.mktemp(f"filled-{request.param}")
    write_inputs(folder)
    with empty_database(request.param, tmp_path_factory) as url:
        before = run_previous(previous_release, "fill", folder, url)
        yield Settings(database_url=url, data_dir=folder / "data", admin_token=ADMIN_TOKEN,
                       secret_key=SECRET_KEY), before | {"folder": folder}


@pytest.fixture(scope="module")
def upgraded(filled) -> Iterator[tuple[Engine, Settings, dict]]:
    """The filled database after this tree's `flipgate migrate`: an engine on it, the
    settings and what the previous release answered."""
    settings, before = filled
    engine = create_db_engine(settings)
    with engine.connect() as connection:
        assert current_revision(connection) == PREVIOUS_REVISION
    assert upgrade(settings) == head_revision()
    yield engine, settings, before
    engine.dispose()


@pytest.fixture
def client(upgraded) -> Iterator[TestClient]:
    """This tree's app on the upgraded store, its writes rolled back after the test."""
    engine, settings, _ = upgraded
    with rolled_back_client(engine, settings) as client:
        yield client


@pytest.fixture
def before(upgraded) -> dict:
    """What the previous release's fill wrote (previous_release.fill), and its folder."""
    return upgraded[2]


def answers(client: TestClient, before: dict) -> list:
    """This tree's [status, body] of the previous release's reads (see previous_release)."""
    found = []
    for token, url in before["reads"]:
        response = client.get(url, headers=bearer(before["tokens"][token]))
        is_json = response.headers.get("content-type", "").startswith("application/json")
        found.append([response.status_code, response.json() if is_json
                      else hashlib.sha256(response.content).hexdigest()])
    return found


# The keys this release adds (multi-label lines, 0020) to a line, a matrix, a policy's rules, a
# version and a data set, each known by a key of its own, with the values an upgraded row has
ADDED_KEYS = {"training_dataset_id": {"multilabel": False},
              "missing": {"multilabel": False},  # a line's matrix
              "max_nfr_vs_history": {"max_label_nfr": None, "max_lost_positives": None},
              "scores_kind": {"thresholds": None},
              "sample_shape": {"multilabel": False, "label_names": None}}


def as_this_release_writes(value: Any) -> Any:
    """The previous release's answer `value` as this release writes it: its dashboard links
    carrying the project `default` (a link opens in its project from anywhere), and the keys
    this release adds at the values an upgraded row has."""
    if isinstance(value, list):
        return [as_this_release_writes(item) for item in value]
    if not isinstance(value, dict):
        return value
    added = {key: item for marker, keys in ADDED_KEYS.items() if marker in value
             for key, item in keys.items()}
    return added | {key: f"{item}?project=default" if key == "report_url" and str(
        item).startswith("/ui/") else as_this_release_writes(item) for key, item in value.items()}


def test_every_read_answers_as_the_previous_release_did(client, before):
    for read, old, new in zip(before["reads"], as_this_release_writes(before["answers"]),
                              answers(client, before), strict=True):
        assert new == old, read


def test_every_old_token_is_bound_to_default_with_the_scopes_it_had(upgraded):
    engine, _, before = upgraded
    with Session(engine) as session:
        default = session.scalars(select(Project)).one()
        tokens = session.scalars(select(ApiToken)).all()
    assert default.name == DEFAULT_PROJECT
    assert {token.name: (token.project_id, token.scopes) for token in tokens} == {
        name: (default.id, scopes) for name, scopes in before["scopes"].items()}


def test_the_old_admin_token_is_defaults_admin_and_the_bootstrap_one_the_servers(client,
                                                                                 before):
    owner = bearer(before["tokens"]["owner"])
    assert client.post("/projects", json={"name": "team-b"}).status_code == 201  # bootstrap
    assert [project["name"] for project in client.get("/projects").json()] == [
        DEFAULT_PROJECT, "team-b"]
    assert [(project["name"], project["scopes"]) for project in
            client.get("/projects", headers=owner).json()] == [
        (DEFAULT_PROJECT, ["admin", "gate", "read", "write"])]
    assert client.get(f"/projects/{DEFAULT_PROJECT}/members", headers=owner).status_code == 200
    assert error_code(client.get("/projects/team-b/members", headers=owner),
                      404) == "project_not_found"
    assert error_code(client.post("/projects", json={"name": "team-c"}, headers=owner),
                      403) == "missing_scope"


def test_every_old_token_acts_with_its_scopes_in_default(client, before):
    token = {name: bearer(value) for name, value in before["tokens"].items()}
    new_version = {"name": LINE, "version": "2.0"}
    assert error_code(client.post("/models", data=new_version, headers=token["reader"]),
                      403) == "missing_scope"
    assert client.get("/models?project=default", headers=token["reader"]).json() == (
        as_this_release_writes(before["answers"][0][1]))
    for writer in ("writer", "expiring"):
        response = client.post("/models", data={"name": LINE, "version": writer},
                               headers=token[writer])
        assert response.status_code == 201, response.text
    gate = client.post("/gate", json={"model": LINE, "candidate": "1.2", "baseline": "1.0"},
                       headers=token["gatekeeper"])
    assert gate.status_code == 200 and gate.json()["verdict"] == "approve", gate.text
    assert client.put(f"/models/{LINE}/policy", json={"max_nfr": 0.5},
                      headers=token["owner"]).status_code == 200
    moved = client.post(f"/models/{LINE}/aliases/production",
                        json={"version": "1.1", "force": True}, headers=token["owner"])
    assert moved.status_code == 200, moved.text
    assert client.get("/metrics", headers=token["scraper"]).status_code == 200


@pytest.mark.parametrize(("name", "code"), [("revoked", "invalid_token"),
                                            ("expired", "token_expired")])
def test_a_revoked_or_expired_token_stays_refused(client, before, name, code):
    assert error_code(client.get("/models", headers=bearer(before["tokens"][name])),
                      401) == code


def test_a_retried_delivery_answers_its_first_decision(client, before):
    sent = before["sent"]["approve"]
    retried = client.post("/gate", content=json.dumps(sent["request"]).encode(), headers={
        **bearer(before["tokens"][sent["token"]]), "Content-Type": "application/json",
        "X-Flipgate-Delivery": sent["delivery"]})
    assert retried.status_code == 200, retried.text
    assert retried.json()["decision_id"] == before["decisions"][0], retried.text


@pytest.mark.parametrize("delivery", ["old-block", "new-delivery"])
def test_the_old_webhook_secret_still_signs_gate_requests(client, before, delivery):
    body = json.dumps(before["sent"]["block"]["request"]).encode()
    signed = client.post("/gate", content=body, headers={
        "Authorization": "", "Content-Type": "application/json",
        "X-Flipgate-Delivery": delivery,
        HEADER: signature(before["sent"]["secret"]["secret"], body)})
    assert signed.status_code == 200, signed.text
    assert signed.json()["verdict"] == "block"
    assert (signed.json()["decision_id"] == before["decisions"][1]) == (delivery == "old-block")


def test_a_new_project_holds_the_same_names_beside_default(client, before):
    team_b = project_beside_default(client, "writer")
    assert send_line(client, before, team_b).status_code == 201
    assert send_evalset(client, before, team_b).status_code == 201
    reader = bearer(before["tokens"]["reader"])
    theirs, ours = (client.get("/models", headers=headers).json() for headers in (team_b, reader))
    assert [line["name"] for line in theirs] == [LINE] and ours == as_this_release_writes(
        before["answers"][0][1])
    assert theirs[0]["id"] != ours[0]["id"]
    assert error_code(client.get("/models?project=team-b", headers=reader),
                      404) == "project_not_found"


def project_beside_default(client: TestClient, token: str) -> dict[str, str]:
    """The project team-b, in the client's transaction; the headers of its admin token
    named `token`."""
    with session_scope(client.app.state.sessions) as session:
        create_project(session=session, name="team-b")
        return bearer(create_token(session=session, name=token, scopes=["admin"],
                                   project="team-b")[1])


def send_line(client: TestClient, before: dict, headers: dict[str, str]) -> Response:
    """POST /models: the line `digits` and its version 1.0, with `headers`."""
    return client.post("/models", data={"name": LINE, "version": "1.0"}, headers=headers,
                       files={"artifact": ("model.onnx",
                                           (before["folder"] / "1.0.onnx").read_bytes())})


def send_evalset(client: TestClient, before: dict, headers: dict[str, str]) -> Response:
    """POST /evalsets: the eval set `eval`, with `headers`."""
    return client.post("/evalsets", data={"name": "eval"}, headers=headers,
                       files={"data": ("eval.npz", (before["folder"] / "eval.npz").read_bytes())})


def downgrade(engine: Engine, settings: Settings) -> None:
    """Migrate the database of `settings` down to the previous release's revision."""
    with migrating(engine) as connection:
        config = alembic_config(connection)
        config.attributes["settings"] = settings
        command.downgrade(config, PREVIOUS_REVISION)


def test_the_downgrade_gives_the_previous_release_its_store_back(upgraded, previous_release):
    """0017 -> 0016 on the upgraded store (one project): the previous release answers every
    read as it did before the upgrade; upgraded again afterwards."""
    engine, settings, before = upgraded
    try:
        downgrade(engine, settings)
        after = run_previous(previous_release, "read", before["folder"], settings.database_url)
        assert after["answers"] == before["answers"]
    finally:
        assert upgrade(settings) == head_revision()


@pytest.mark.parametrize(("shared", "refusal"), [
    ("line", "model_lines: 'digits'"), ("evalset", "datasets: 'eval'"),
    ("token", "api_tokens: 'writer'")])
def test_the_downgrade_refuses_a_name_two_projects_hold(client, before, shared, refusal):
    """... and changes nothing (run on the client's connection, rolled back afterwards)."""
    headers = project_beside_default(client, "writer" if shared == "token" else "team-b")
    if shared != "token":
        sent = {"line": send_line, "evalset": send_evalset}[shared](client, before, headers)
        assert sent.status_code == 201, sent.text
    connection = client.app.state.connection
    if connection.dialect.name == "sqlite":  # as in `migrating`, where they are off: 0019's
        # downgrade rebuilds model_versions, which other tables point at, before 0017 refuses
        connection.exec_driver_sql("PRAGMA defer_foreign_keys = ON")
    with (pytest.raises(RuntimeError, match=f"held by several projects: {refusal}$"),
          connection.begin_nested()):  # as `migrating`'s transaction: the later steps undone
        command.downgrade(alembic_config(connection), PREVIOUS_REVISION)
    assert current_revision(connection) == head_revision()
    assert answers(client, before) == as_this_release_writes(before["answers"])
