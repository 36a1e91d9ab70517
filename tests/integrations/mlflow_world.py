"""A real `mlflow server` (SQLite backend in a temp folder, proxied artifacts) and ONNX
classifiers on scikit-learn's digits, logged to it with mlflow.onnx.log_model."""

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier

from flipgate.datasets import digit_composites, save_evalset, small_digits, split
from flipgate.formats.evalsets import EvalSet
from flipgate.processes import free_port, stop_process
from tests.e2e.conftest import wait_for

# a fixed key: without one, a restarted MLflow server silently disables every webhook
WEBHOOK_ENCRYPTION_KEY = "0X0VN8BmvGQ3TdyWrhV9sZWfp7ugwbWZmk_1pGE9ESs="
MLFLOW_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
              "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
              "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
              "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": WEBHOOK_ENCRYPTION_KEY}
ADMIN = ("admin", "mlflow-admin-password-0123")
LOST_LABEL = 3  # the label the second multi-label version never says
DECLARED = [0.4] + [0.5] * 9  # the thresholds its ONNX metadata declares
# `--app-name basic-auth` (needs mlflow[auth]): its settings (a checked password is cached for
# a minute: else each request hashes it again, ~0.1 s here), the admin's password on a new
# user store, and the fixed key its CSRF protection refuses to start without
AUTH_CONFIG = f"""[mlflow]
default_permission = READ
database_uri = sqlite:///basic_auth.db
admin_username = {ADMIN[0]}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = 60
"""
AUTH_ENV = {"MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1],
            "MLFLOW_FLASK_SERVER_SECRET_KEY": "flipgate-tests-flask-secret-key"}


@contextmanager
def mlflow_server(folder: Path, *, basic_auth: bool = False) -> Iterator[str]:
    """`mlflow server` on a free loopback port with one worker, once healthy: its URL, made
    this process's tracking and registry URI (`flipgate mlflow gate`, run in-process by the
    tests, sets both; a module's server must not inherit the previous module's). With
    `basic_auth`, MLflow's authentication is on (its user store in `folder`) and this process
    signs in as its admin until the server stops."""
    import mlflow

    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [str(Path(sys.executable).with_name("mlflow")), "server",
               "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
               "--artifacts-destination", str(folder / "artifacts"),
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
               *(["--app-name", "basic-auth"] if basic_auth else [])]
    env = {**os.environ, **MLFLOW_ENV}
    if basic_auth:
        (folder / "basic_auth.ini").write_text(AUTH_CONFIG)
        env.update(AUTH_ENV, MLFLOW_AUTH_CONFIG_PATH=str(folder / "basic_auth.ini"))
    url = f"http://127.0.0.1:{port}"
    with ((folder / "mlflow.log").open("wb") as log, pytest.MonkeyPatch.context() as patch):
        process = subprocess.Popen(command, env=env, cwd=folder, stdout=log,
                                   stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: healthy(url, process), "mlflow server /health", timeout=90)
            mlflow.set_tracking_uri(url)
            mlflow.set_registry_uri(url)
            if basic_auth:
                signed_in_as(patch, *ADMIN)
            yield url
        finally:
            stop_process(process)


def signed_in_as(patch: pytest.MonkeyPatch, username: str, password: str) -> None:
    """MLflow's clients in this process send `username`'s credentials from now on (MLflow
    reads them from the environment on each request)."""
    patch.setenv("MLFLOW_TRACKING_USERNAME", username)
    patch.setenv("MLFLOW_TRACKING_PASSWORD", password)


def mlflow_account(url: str, username: str, password: str, model: str) -> dict[str, str]:
    """A new MLflow user (made by the admin) who may manage the new registered model `model`:
    the environment that signs a process in as that user."""
    from mlflow import MlflowClient
    from mlflow.server import get_app_client

    auth = get_app_client("basic-auth", tracking_uri=url)
    auth.create_user(username, password)
    MlflowClient(url).create_registered_model(model)
    auth.grant_user_permission(username, "registered_model", model, "MANAGE")
    return {"MLFLOW_TRACKING_USERNAME": username, "MLFLOW_TRACKING_PASSWORD": password}


def healthy(url: str, process: subprocess.Popen) -> bool:
    assert process.poll() is None, "mlflow server exited"
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def digits_split() -> tuple[EvalSet, tuple[np.ndarray, np.ndarray]]:
    """The last 400 digits as the eval set; the rest to train on."""
    features, labels = load_digits(return_X_y=True)
    features = (features / 16).astype(np.float32)
    return (EvalSet(x=features[-400:], y=labels[-400:]), (features[:-400], labels[:-400]))


def classifier(train: tuple[np.ndarray, np.ndarray], *, samples: int,
               scramble: float = 0.0, seed: int = 0) -> onnx.ModelProto:
    """A logistic regression on the first `samples` training digits as an ONNX linear layer
    (weights big enough to be saved as external data), its weights mixed with noise of
    `scramble` times their scale."""
    features, labels = train
    fitted = LogisticRegression(max_iter=500).fit(features[:samples], labels[:samples])
    weight = fitted.coef_ + scramble * np.abs(fitted.coef_).mean() * \
        np.random.default_rng(seed).normal(size=fitted.coef_.shape)
    layer = torch.nn.Linear(features.shape[1], weight.shape[0])
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
        layer.bias.copy_(torch.from_numpy(fitted.intercept_))
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"flipgate-mlflow-{os.getpid()}.onnx"
    torch.onnx.export(layer, (torch.zeros(2, features.shape[1]),), str(path),
                      input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}}, dynamo=False)
    model = onnx.load(str(path))
    path.unlink()
    return model


def multilabel_models(folder: Path) -> tuple[EvalSet, dict[str, onnx.ModelProto]]:
    """Held-out composites of real digits (a multi-label set of ten labels) and two ONNX
    models of them ending in a sigmoid: `1`, one logistic regression per label; `2`, the
    same with label 3 never said (its bias pushed down) and thresholds in its metadata."""
    train_digits, eval_digits = split(small_digits(), 1000, seed=0)
    train, held_out = (digit_composites(n, seed=seed, digits=part) for n, seed, part in (
        (300, 1, train_digits), (150, 2, eval_digits)))
    x = train.x.reshape(train.n, -1)
    fitted = OneVsRestClassifier(LogisticRegression(max_iter=300)).fit(x, train.y)
    weight = np.concatenate([estimator.coef_ for estimator in fitted.estimators_])
    bias = np.concatenate([estimator.intercept_ for estimator in fitted.estimators_])
    models = {}
    for version, lost in (("1", None), ("2", LOST_LABEL)):
        layer = torch.nn.Linear(x.shape[1], weight.shape[0])
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(weight))
            layer.bias.copy_(torch.from_numpy(bias))
            if lost is not None:
                layer.bias[lost] = -50.0
        path = folder / f"tags-{version}.onnx"
        torch.onnx.export(torch.nn.Sequential(layer, torch.nn.Sigmoid()),
                          (torch.zeros(2, x.shape[1]),), str(path), input_names=["x"],
                          output_names=["scores"], dynamic_axes={"x": {0: "N"}}, dynamo=False)
        models[version] = onnx.load(str(path))
    onnx.helper.set_model_props(models["2"], {"thresholds": json.dumps(DECLARED)})
    flat = EvalSet(held_out.x.reshape(held_out.n, -1), held_out.y, classes=held_out.classes)
    return flat, models


def nfr_sample(models: dict[str, onnx.ModelProto], evalset: EvalSet) -> float:
    """NFR_sample of multilabel_models' 1 -> 2 on `evalset`, from the models' own outputs
    (ONNX Runtime on the CPU) at their thresholds: the share of samples with a label that 1
    decided right and 2 decides wrong (some of label LOST_LABEL's, at least)."""
    old, new = (onnxruntime.InferenceSession(models[version].SerializeToString(),
                                             providers=["CPUExecutionProvider"]).run(
        None, {"x": evalset.x})[0] > limit for version, limit in (("1", 0.5),
                                                                  ("2", np.array(DECLARED))))
    flipped = (old == evalset.y) & (new != evalset.y)
    assert flipped[:, LOST_LABEL].any()
    return float(flipped.any(axis=1).mean())


def log_version(name: str, model: onnx.ModelProto) -> str:
    """Log `model` in a new run and register it under `name`: the new version's number.
    (mlflow.onnx.log_model moves the weights of the proto it is given to external data, so
    it gets a copy.)"""
    import mlflow

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    with mlflow.start_run():
        info = mlflow.onnx.log_model(copy, name="model", registered_model_name=name)
    return str(info.registered_model_version)


def nfr(old: onnx.ModelProto, new: onnx.ModelProto, evalset: EvalSet) -> float:
    """NFR of old -> new on `evalset`, from the models' own outputs."""
    old_right, new_right = (predicted(model, evalset) == evalset.y for model in (old, new))
    return float(np.mean(old_right & ~new_right))


def predicted(model: onnx.ModelProto, evalset: EvalSet) -> np.ndarray:
    """The classes `model` predicts on `evalset`, by ONNX Runtime on the CPU."""
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {"x": evalset.x})[0].argmax(axis=1)


def save(evalset: EvalSet, path: Path) -> Path:
    return save_evalset(evalset, path)


def signed(body: bytes, *, secret: str, delivery: str = "d-1",
           timestamp: int | None = None) -> dict[str, str]:
    """MLflow's webhook headers for `body`."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{delivery}.{timestamp}.".encode() + body,
                      hashlib.sha256).digest()
    return {"Content-Type": "application/json", "X-MLflow-Delivery-Id": delivery,
            "X-MLflow-Timestamp": str(timestamp),
            "X-MLflow-Signature": "v1," + base64.b64encode(digest).decode()}


def alias_event(model: str, alias: str, version: str) -> bytes:
    """MLflow's body for an alias set on a version."""
    return json.dumps({"entity": "model_version_alias", "action": "created",
                       "data": {"name": model, "alias": alias, "version": version}}).encode()
