"""The MLflow connector against a real `mlflow server` (with MLflow's authentication: the
connector signs in as an MLflow user of its own) whose webhook calls a real `flipgate serve`
(embedded, with its worker and sweeper): a `challenger` is gated and, approved, becomes
`champion`; a regressed one is blocked; a hand move of `champion` is reverted; MLflow's test
delivery is answered; a bad signature is refused; a registered model tagged multi-label makes
a multi-label line whose challenger is gated per label."""

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import onnx
import pytest
from mlflow import MlflowClient

from flipgate.formats.evalsets import EvalSet
from flipgate.mlflow_gate import MULTILABEL_TAG
from service.integrations.mlflow.service import LINKS_LEFT_OUT
from tests.e2e.conftest import served, wait_for
from tests.integrations.mlflow_world import (
    LOST_LABEL,
    alias_event,
    classifier,
    digits_split,
    log_version,
    mlflow_account,
    mlflow_server,
    multilabel_models,
    nfr,
    nfr_sample,
    save,
    signed,
)

TOKEN = "mlflow-connector-admin-token-0123456789"
SECRET = "mlflow-webhook-secret-for-tests"
VERDICT_SECONDS = 60  # "a good one becomes champion within a minute"
pytestmark = pytest.mark.slow


@dataclass
class Connected:
    """MLflow's `digits`: 1 (a first model), 2 (1 scrambled), 3 (trained on more digits)."""

    webhook_url: str
    mlflow_url: str
    flipgate: httpx.Client
    mlflow: MlflowClient
    webhook_id: str
    evalset: EvalSet
    models: dict[str, onnx.ModelProto]
    log: Path  # flipgate serve's output, its worker's included

    def tag(self, version: str, model: str = "digits") -> str | None:
        return self.mlflow.get_model_version(model, version).tags.get("flipgate.verdict")

    def champion(self, model: str = "digits") -> str | None:
        return self.mlflow.get_registered_model(model).aliases.get("champion")

    def move_and_wait_for_verdict(self, alias: str, version: str,
                                  model: str = "digits") -> tuple[str, float]:
        """Set `alias` on `version` of `model`: its verdict tag and the seconds it took to
        appear."""
        started = time.monotonic()
        self.mlflow.set_registered_model_alias(model, alias, version)
        verdict = wait_for(lambda: self.tag(version, model), f"the verdict tag of {version}",
                           timeout=VERDICT_SECONDS)
        return verdict, time.monotonic() - started

    def line_page(self) -> str:
        """The line's dashboard page, signed in with the admin token."""
        signin = self.flipgate.post("/ui/signin", data={"token": TOKEN})
        assert signin.status_code == 303, signin.text
        page = self.flipgate.get("/ui/lines/digits")
        assert page.status_code == 200, page.text
        return page.text

    def events(self) -> list[dict]:
        response = self.flipgate.get("/models/digits/mlflow-events")
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture(scope="module")
def connected(tmp_path_factory) -> Connected:
    folder = tmp_path_factory.mktemp("mlflow-connector")
    evalset, train = digits_split()
    models = {"1": classifier(train, samples=500),
              "2": classifier(train, samples=500, scramble=1.5),
              "3": classifier(train, samples=len(train[1]))}
    with mlflow_server(folder / "mlflow", basic_auth=True) as mlflow_url:
        account = mlflow_account(mlflow_url, "flipgate", "flipgate-mlflow-password-01", "digits")
        with served(folder, TOKEN, FLIPGATE_MLFLOW_WEBHOOK_SECRET=SECRET,
                    FLIPGATE_MLFLOW_TRACKING_URI=mlflow_url, **account) as (url, client):
            yield connect(folder, mlflow_url, url, client, evalset, models)


def connect(folder: Path, mlflow_url: str, url: str, client: httpx.Client, evalset: EvalSet,
            models: dict[str, onnx.ModelProto]) -> Connected:
    """The webhook registered on MLflow, the versions logged, the eval set on flipgate."""
    tracking = MlflowClient(mlflow_url)
    # before any alias event: each MLflow server process caches its webhook list for 60 s
    webhook = tracking.create_webhook(
        "flipgate", f"{url}/integrations/mlflow/webhook",
        events=["model_version_alias.created"], secret=SECRET)
    for version, model in models.items():
        assert log_version("digits", model) == version
    response = client.post("/evalsets", data={"name": "holdout"}, files={
        "data": ("holdout.npz", save(evalset, folder / "holdout.npz").read_bytes())})
    assert response.status_code == 201, response.text
    return Connected(f"{url}/integrations/mlflow/webhook", mlflow_url, client, tracking,
                     webhook.webhook_id, evalset, models, folder / "serve.log")


def test_mlflow_test_delivery_is_answered_and_changes_nothing(connected):
    result = connected.mlflow.test_webhook(connected.webhook_id)
    assert result.success and result.response_status == 200, result
    assert connected.flipgate.get("/models/example_model/mlflow-events").json() == []


@pytest.mark.parametrize(("signing", "code"), [
    ({"secret": "another-secret"}, "invalid_signature"),
    ({"secret": SECRET, "age_seconds": 3600}, "stale_signature"),
    (None, "missing_signature"),
])
def test_a_bad_signature_is_refused_and_nothing_is_queued(connected, signing, code):
    body = alias_event("digits", "champion", "2")
    headers = {"Content-Type": "application/json"}
    if signing is not None:
        headers = signed(body, secret=signing["secret"],
                         timestamp=int(time.time()) - signing.get("age_seconds", 0))
    before = connected.events()
    response = httpx.post(connected.webhook_url, content=body, headers=headers)
    assert response.status_code == 401 and response.json()["error"]["code"] == code
    assert connected.events() == before


def test_a_challenger_is_gated_and_promoted_or_blocked_and_a_hand_move_is_reverted(connected):
    """One story, in order (a hand move needs the champion that the gated moves set)."""
    a_challenger_is_gated_and_promoted_or_blocked(connected)
    a_hand_move_of_champion_is_reverted(connected)


def a_challenger_is_gated_and_promoted_or_blocked(connected: Connected) -> None:
    verdict, first = connected.move_and_wait_for_verdict("challenger", "1")
    assert verdict == "approve"
    wait_for(lambda: connected.champion() == "1", "champion on the first version")
    response = connected.flipgate.put("/models/digits/policy",
                                      json={"evalsets": ["holdout"], "significance": 0.05})
    assert response.status_code in (200, 201), response.text

    verdict, blocked = connected.move_and_wait_for_verdict("challenger", "2")
    tags = connected.mlflow.get_model_version("digits", "2").tags
    assert verdict == "block"
    assert float(tags["flipgate.nfr"]) == pytest.approx(
        nfr(connected.models["1"], connected.models["2"], connected.evalset), abs=1e-6)
    decision = connected.flipgate.get(f"/gate/decisions/{tags['flipgate.decision']}").json()
    assert (decision["verdict"], decision["candidate"]) == ("block", "2")
    assert connected.champion() == "1"

    verdict, seconds = connected.move_and_wait_for_verdict("challenger", "3")
    assert verdict == "approve"
    wait_for(lambda: connected.champion() == "3", "champion on version 3", timeout=5)
    print(f"\nalias move to verdict tag: {first:.1f} s (first version), {blocked:.1f} s "
          f"(blocked), {seconds:.1f} s (approved; pairs measured by the worker)")
    production = connected.flipgate.get("/models/digits/promotions").json()
    assert [row["requested_by"] for row in production] == ["mlflow connector"] * 2
    # without FLIPGATE_PUBLIC_URL: no relative report link in MLflow, said at start and once
    # in the worker's log however many versions were tagged
    assert "flipgate.report_url" not in tags
    log = connected.log.read_text()
    assert f"flipgate serve: {LINKS_LEFT_OUT}" in log and log.count(LINKS_LEFT_OUT) == 2


def a_hand_move_of_champion_is_reverted(connected: Connected) -> None:
    assert connected.champion() == "3"
    started = time.monotonic()
    connected.mlflow.set_registered_model_alias("digits", "champion", "2")
    wait_for(lambda: connected.champion() == "3", "champion moved back to 3",
             timeout=VERDICT_SECONDS)
    print(f"\nhand move reverted after {time.monotonic() - started:.1f} s")
    assert connected.tag("2") == "unapproved"
    reverted = [event for event in connected.events() if event["action"] == "reverted"]
    assert [(event["version"], event["alias"]) for event in reverted] == [("2", "champion")]
    page = connected.line_page()  # the line's audit log on the dashboard shows the revert
    assert 'id="mlflow-reverts"' in page
    assert "champion moved by hand to unapproved version 2; moved back to 3" in page


def test_a_delivery_is_acted_on_once(connected):
    body = alias_event("digits", "champion", "2")
    headers = signed(body, secret=SECRET, delivery="replayed-delivery")
    first = httpx.post(connected.webhook_url, content=body, headers=headers)
    again = httpx.post(connected.webhook_url, content=body, headers=headers)
    assert first.status_code == 202 and again.json() == {"status": "duplicate"}
    received = [e for e in connected.events() if e["delivery_id"] == "replayed-delivery"]
    assert len(received) == 1


def test_a_multilabel_challenger_is_gated_per_label(connected, tmp_path):
    """A registered model tagged flipgate.multilabel=true: its first `challenger` makes a
    multi-label line (a tag that is neither true nor false fails the job and makes none),
    the second, which loses label 3, is blocked by a limit on label 3 and tagged with
    NFR_sample and that label."""
    from mlflow.server import get_app_client  # the server's app: slow to import, here only

    evalset, models = multilabel_models(tmp_path)
    connected.mlflow.create_registered_model("tags", tags={MULTILABEL_TAG: "yes"})
    get_app_client("basic-auth", tracking_uri=connected.mlflow_url).grant_user_permission(
        "flipgate", "registered_model", "tags", "MANAGE")
    for version, model in models.items():
        assert log_version("tags", model) == version
    client = connected.flipgate
    assert client.post("/evalsets", data={"name": "composites"}, files={
        "data": ("c.npz", save(evalset, tmp_path / "c.npz").read_bytes())}).status_code == 201
    assert job_error(connected, alias_event("tags", "challenger", "1")).startswith(
        "invalid_multilabel_tag: MLflow's registered model 'tags' has flipgate.multilabel='yes'")
    assert client.get("/models/tags").status_code == 404
    connected.mlflow.set_registered_model_tag("tags", MULTILABEL_TAG, "true")
    assert connected.move_and_wait_for_verdict("challenger", "1", "tags")[0] == "approve"
    assert client.get("/models/tags").json()["line"]["multilabel"] is True
    wait_for(lambda: connected.champion("tags") == "1", "champion on tags' first version")
    assert client.put("/models/tags/policy", json={
        "max_label_nfr": {str(LOST_LABEL): 0.01}, "evalsets": ["composites"]}).is_success
    assert connected.move_and_wait_for_verdict("challenger", "2", "tags")[0] == "block"
    tags = connected.mlflow.get_model_version("tags", "2").tags
    assert json.loads(tags["flipgate.blocking_labels"]) == [str(LOST_LABEL)]
    assert float(tags["flipgate.nfr"]) == pytest.approx(nfr_sample(models, evalset), abs=1e-6)
    versions = {v["version"]: v for v in client.get("/models/tags").json()["versions"]}
    assert versions["2"]["metadata"]["mlflow"]["version"] == "2"  # imported by the connector
    assert connected.champion("tags") == "1"


def job_error(connected: Connected, body: bytes) -> str:
    """The error of the job that MLflow's delivery of `body` queues, once it failed."""
    response = httpx.post(connected.webhook_url, content=body,
                          headers=signed(body, secret=SECRET, delivery=f"d-{time.time_ns()}"))
    assert response.status_code == 202, response.text
    url = f"/jobs/{response.json()['job_id']}"

    def ended() -> dict | None:
        job = connected.flipgate.get(url).json()
        return None if job["state"] in ("queued", "running") else job

    job = wait_for(ended, "the delivery's job", timeout=VERDICT_SECONDS)
    assert job["state"] == "failed", job
    return job["error"]
