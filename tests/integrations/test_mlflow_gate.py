"""`flipgate mlflow gate` against a real `mlflow server` (with MLflow's authentication, as the
docs/mlflow.md's enforcement recipe has it) and a real `flipgate serve` (embedded, with its worker):
versions logged with mlflow.onnx.log_model (weights as external data) are registered on
flipgate, gated, tagged, and promoted only on an approval; a multi-label model is gated per
label and tagged with the labels it is blocked on."""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import onnx
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from flipgate.cli import main
from flipgate.formats.evalsets import EvalSet
from tests.e2e.conftest import served
from tests.integrations.mlflow_world import (
    DECLARED,
    LOST_LABEL,
    classifier,
    digits_split,
    log_version,
    mlflow_server,
    multilabel_models,
    nfr,
    nfr_sample,
    save,
    signed_in_as,
)

TOKEN = "mlflow-gate-admin-token-0123456789"
FLIPGATE_ACCOUNT = ("flipgate", "flipgate-mlflow-password-01")  # MLflow users of the recipe
SCIENTIST = ("alice", "alice-mlflow-password-0123")
pytestmark = pytest.mark.slow


Capture = pytest.CaptureFixture[str]


@dataclass
class World:
    """Both servers, the eval set `holdout`, and the MLflow model `digits`: version 1 (a
    first model), 2 (1 scrambled: regressed) and 3 (trained on more digits)."""

    mlflow_url: str
    flipgate_url: str
    flipgate: httpx.Client
    mlflow: MlflowClient
    evalset: EvalSet
    models: dict[str, onnx.ModelProto]

    def gate(self, uri: str, *args: str) -> int:
        return main(["mlflow", "gate", uri, "--server", self.flipgate_url, "--token", TOKEN,
                     "--tracking-uri", self.mlflow_url, "--evalset", "holdout", "--poll", "0.2",
                     "--timeout", "120", *args])

    def tags(self, version: str, model: str = "digits") -> dict[str, str]:
        return self.mlflow.get_model_version(model, version).tags

    def production(self) -> str | None:
        line = self.flipgate.get("/models/digits").json()
        ids = {v["id"]: v["version"] for v in line["versions"]}
        return next((ids[a["version_id"]] for a in line["aliases"] if a["name"] == "production"),
                    None)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    folder = tmp_path_factory.mktemp("mlflow-gate")
    evalset, train = digits_split()
    models = {"1": classifier(train, samples=500), "2": classifier(train, samples=500,
                                                                   scramble=1.5),
              "3": classifier(train, samples=len(train[1]))}
    with mlflow_server(folder / "mlflow", basic_auth=True) as mlflow_url, \
            served(folder, TOKEN) as (url, client):
        for version, model in models.items():
            assert log_version("digits", model) == version
        response = client.post("/evalsets", data={"name": "holdout"}, files={
            "data": ("holdout.npz", save(evalset, folder / "holdout.npz").read_bytes())})
        assert response.status_code == 201, response.text
        yield World(mlflow_url, url, client, MlflowClient(mlflow_url), evalset, models)


def test_a_line_gated_through_mlflow_step_by_step(world, tmp_path, capsys):
    """One story, in order: each step starts from the champion and tags the steps before it
    left (the first version approved, a regressed challenger blocked, a better version
    champion, then the cases around it)."""
    first_version_is_approved_promoted_and_tagged(world, capsys)
    regressed_challenger_is_blocked_and_champion_stays(world, capsys)
    better_version_becomes_champion(world, capsys)
    a_verdict_still_pending_at_the_timeout_is_exit_3_and_tags_nothing(world, capsys)
    a_baseline_version_is_gated_against_in_the_given_line(world, capsys)
    other_bytes_under_the_same_version_are_refused(world, tmp_path, capsys)


def first_version_is_approved_promoted_and_tagged(world: World, capsys: Capture) -> None:
    assert world.gate("models:/digits/1", "--promote", "champion", "--json") == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["verdict"] == "approve" and decision["baseline"] is None
    assert world.tags("1") == {"flipgate.verdict": "approve",
                               "flipgate.decision": str(decision["decision_id"])}
    assert world.production() == "1"
    assert world.mlflow.get_model_version_by_alias("digits", "champion").version == "1"
    stored = world.flipgate.get("/models/digits/versions/1").json()
    assert stored["metadata"]["mlflow"] == {
        "model": "digits", "version": "1",
        "run_id": world.mlflow.get_model_version("digits", "1").run_id}


def regressed_challenger_is_blocked_and_champion_stays(world: World, capsys: Capture) -> None:
    world.mlflow.set_registered_model_alias("digits", "challenger", "2")
    assert world.gate("models:/digits@challenger", "--promote", "champion", "--json") == 1
    decision = json.loads(capsys.readouterr().out)
    tags = world.tags("2")
    assert tags["flipgate.verdict"] == "block"
    assert tags["flipgate.decision"] == str(decision["decision_id"])
    assert float(tags["flipgate.nfr"]) == pytest.approx(
        nfr(world.models["1"], world.models["2"], world.evalset), abs=1e-6)
    assert tags["flipgate.report_url"] == decision["report_url"]
    assert decision["report_url"].startswith(f"{world.flipgate_url}/ui/decisions/")  # joined
    assert world.mlflow.get_model_version_by_alias("digits", "champion").version == "1"
    assert world.production() == "1"
    # asking again reuses the registered version (same bytes) and answers the same verdict
    assert world.gate("models:/digits/2") == 1


def better_version_becomes_champion(world: World, capsys: Capture) -> None:
    assert world.gate("models:/digits/3", "--promote", "champion") == 0
    assert "APPROVE" in capsys.readouterr().out
    assert world.tags("3")["flipgate.verdict"] == "approve"
    assert float(world.tags("3")["flipgate.nfr"]) == pytest.approx(
        nfr(world.models["1"], world.models["3"], world.evalset), abs=1e-6)
    assert world.mlflow.get_model_version_by_alias("digits", "champion").version == "3"
    assert world.production() == "3"


def a_verdict_still_pending_at_the_timeout_is_exit_3_and_tags_nothing(world: World,
                                                                     capsys: Capture) -> None:
    before = world.tags("3")
    assert world.gate("models:/digits/3", "--baseline", "models:/digits/1", "--line",
                      "digits-pending", "--promote", "champion", "--timeout", "0") == 3
    assert "pending" in capsys.readouterr().err
    assert world.tags("3") == before
    assert world.flipgate.get("/models/digits-pending").json()["aliases"] == []


def a_baseline_version_is_gated_against_in_the_given_line(world: World, capsys: Capture) -> None:
    assert world.gate("models:/digits/2", "--baseline", "models:/digits/3",
                      "--line", "digits-pairs", "--promote", "champion", "--json") == 1
    decision = json.loads(capsys.readouterr().out)
    assert (decision["model"], decision["candidate"], decision["baseline"]) == (
        "digits-pairs", "2", "3")
    assert float(world.tags("2")["flipgate.nfr"]) == pytest.approx(
        nfr(world.models["3"], world.models["2"], world.evalset), abs=1e-6)
    line = world.flipgate.get("/models/digits-pairs").json()
    assert sorted(v["version"] for v in line["versions"]) == ["2", "3"]
    assert line["aliases"] == []
    assert world.mlflow.get_model_version_by_alias("digits", "champion").version == "3"


def other_bytes_under_the_same_version_are_refused(world: World, tmp_path: Path,
                                                   capsys: Capture) -> None:
    other = tmp_path / "other.onnx"
    onnx.save(world.models["2"], str(other))
    response = world.flipgate.post("/models", data={"name": "digits", "version": "4"},
                                   files={"artifact": ("model.onnx", other.read_bytes())})
    assert response.status_code == 201, response.text
    assert log_version("digits", world.models["3"]) == "4"
    assert world.gate("models:/digits/4", "--promote", "champion") == 2
    assert "another model than this MLflow version" in capsys.readouterr().err
    assert "flipgate.verdict" not in world.tags("4")
    assert world.production() == "3"


def test_a_multilabel_model_is_gated_per_label_and_tagged(world, tmp_path, capsys):
    """A multi-label line made by its first MLflow version (its registered model tagged
    `flipgate.multilabel=true`; a tag of another value refuses before anything is registered;
    the second gated with `--multilabel`, which an existing multi-label line takes): the second,
    which loses label 3, is gated as a multi-label version (the thresholds its metadata
    declares carried), blocked by a limit on label 3, and tagged with NFR_sample and the
    label it blocks on."""
    evalset, models = multilabel_models(tmp_path)
    for version, model in models.items():
        assert log_version("tags", model) == version
    response = world.flipgate.post("/evalsets", data={"name": "composites"}, files={
        "data": ("composites.npz", save(evalset, tmp_path / "composites.npz").read_bytes())})
    assert response.status_code == 201 and response.json()["multilabel"], response.text

    def gate(version: str, *flags: str) -> int:
        return main(["mlflow", "gate", f"models:/tags/{version}", "--server",
                     world.flipgate_url, "--token", TOKEN, "--tracking-uri", world.mlflow_url,
                     "--evalset", "composites", *flags, "--promote", "champion",
                     "--poll", "0.2", "--timeout", "120", "--json"])

    world.mlflow.set_registered_model_tag("tags", "flipgate.multilabel", "yes")
    assert gate("1") == 2 and "flipgate.multilabel='yes'" in capsys.readouterr().err
    assert world.flipgate.get("/models/tags").status_code == 404
    world.mlflow.set_registered_model_tag("tags", "flipgate.multilabel", "true")
    assert gate("1") == 0
    capsys.readouterr()
    assert world.flipgate.get("/models/tags").json()["line"]["multilabel"] is True
    assert world.flipgate.put("/models/tags/policy", json={
        "max_label_nfr": {str(LOST_LABEL): 0.01}, "evalsets": ["composites"]}).is_success
    assert gate("2", "--multilabel") == 1
    decision = json.loads(capsys.readouterr().out)
    assert {(reason["code"], reason["label"]) for reason in decision["reasons"]} == {
        ("max_label_nfr", str(LOST_LABEL))}
    tags = world.tags("2", model="tags")
    assert tags["flipgate.verdict"] == "block"
    assert json.loads(tags["flipgate.blocking_labels"]) == [str(LOST_LABEL)]
    assert float(tags["flipgate.nfr"]) == pytest.approx(nfr_sample(models, evalset), abs=1e-6)
    assert "flipgate.blocking_labels" not in world.tags("1", model="tags")  # nothing measured
    report = world.flipgate.get("/compare/tags:1/tags:2", params={"evalset": "composites"})
    assert report.json()["new"]["thresholds"] == DECLARED
    assert world.mlflow.get_model_version_by_alias("tags", "champion").version == "1"


def test_without_mlflow_the_command_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert main(["mlflow", "gate", "models:/digits/1", "--server", "http://127.0.0.1:9",
                 "--token", TOKEN]) == 2
    assert "pip install 'flipgate[mlflow]'" in capsys.readouterr().err


def test_a_malformed_model_uri_is_a_usage_error(capsys):
    assert main(["mlflow", "gate", "runs:/abc/model", "--server", "http://127.0.0.1:9",
                 "--token", TOKEN, "--tracking-uri", "http://127.0.0.1:9"]) == 2
    assert "models:/NAME@ALIAS" in capsys.readouterr().err


def test_enforcement_recipe_only_flipgates_account_writes_production(world, monkeypatch):
    """docs/mlflow.md's recipe under MLflow's authentication: a data scientist logs candidates to
    `digits-candidates` and cannot write `digits-production`; flipgate's account gates a
    candidate and copies the approved one there."""
    from mlflow.server import get_app_client  # the server's app: 1.3 s to import, here only

    auth = get_app_client("basic-auth", tracking_uri=world.mlflow_url)
    for username, password in (FLIPGATE_ACCOUNT, SCIENTIST):
        auth.create_user(username, password)
    for model in ("digits-candidates", "digits-production"):
        world.mlflow.create_registered_model(model)
    auth.grant_user_permission("flipgate", "registered_model", "digits-production", "MANAGE")
    for username in ("flipgate", "alice"):
        auth.grant_user_permission(username, "registered_model", "digits-candidates", "EDIT")
    experiment = world.mlflow.create_experiment("alice")
    auth.grant_user_permission("alice", "experiment", experiment, "EDIT")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", experiment)

    signed_in_as(monkeypatch, *SCIENTIST)
    assert [log_version("digits-candidates", world.models[v]) for v in ("1", "2")] == ["1", "2"]
    signed_in_as(monkeypatch, *FLIPGATE_ACCOUNT)
    assert world.gate("models:/digits-candidates/1", "--promote", "approved") == 0
    copy = world.mlflow.copy_model_version("models:/digits-candidates/1", "digits-production")
    world.mlflow.set_registered_model_alias("digits-production", "champion", copy.version)

    signed_in_as(monkeypatch, *SCIENTIST)
    with pytest.raises(MlflowException, match="403"):  # MLflow words it INTERNAL_ERROR
        world.mlflow.copy_model_version("models:/digits-candidates/2", "digits-production")
    for change in (lambda: world.mlflow.set_registered_model_alias("digits-production",
                                                                   "champion", "1"),
                   lambda: world.mlflow.delete_registered_model_alias("digits-production",
                                                                      "champion")):
        with pytest.raises(MlflowException) as denied:
            change()
        assert denied.value.error_code == "PERMISSION_DENIED"
    assert world.tags("1", model="digits-candidates")["flipgate.verdict"] == "approve"
    production = world.mlflow.get_registered_model("digits-production")
    assert production.aliases == {"champion": "1"}
    assert [v.version for v in world.mlflow.search_model_versions(
        "name='digits-production'")] == ["1"]
    assert world.mlflow.get_model_version_download_uri("digits-production", "1") == \
        world.mlflow.get_model_version_download_uri("digits-candidates", "1")
