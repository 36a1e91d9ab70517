"""`flipgate mlflow gate`: gate a version of MLflow's model registry on a flipgate server.

MLflow is an optional extra (`pip install 'flipgate[mlflow]'`): it is imported only inside the
functions that talk to MLflow, so flipgate works without it. The server's MLflow connector
(service/integrations/mlflow) reuses the functions that read a version from MLflow.
"""

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from flipgate import gate_client
from flipgate.commands import (
    TOKEN_ENV,
    add_server_flags,
    add_wait_flags,
    check_wait_flags,
    server_credentials,
)
from flipgate.errors import InputError

MODEL_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))")
VERDICT_TAG, DECISION_TAG, NFR_TAG, REPORT_TAG, LABELS_TAG = (
    "flipgate.verdict", "flipgate.decision", "flipgate.nfr", "flipgate.report_url",
    "flipgate.blocking_labels")
MULTILABEL_TAG = "flipgate.multilabel"  # on a registered model: its line is multi-label
PRODUCTION = "production"


@dataclass(frozen=True)
class MlflowVersion:
    """One version of a registered model in MLflow."""

    name: str
    version: str
    run_id: str | None

    def metadata(self) -> dict:
        """What flipgate stores with the version it registers from this one."""
        return {"mlflow": {"model": self.name, "version": self.version, "run_id": self.run_id}}


def mlflow_client(tracking_uri: str | None):
    """An MlflowClient for `tracking_uri` (default $MLFLOW_TRACKING_URI). The URI is also made
    the process's tracking and registry URI: MLflow resolves the `models:/` URIs it downloads
    from with those, whatever the client or download_artifacts is given."""
    try:
        import mlflow
    except ImportError as error:
        raise InputError("mlflow_not_installed", "MLflow is not installed: install flipgate "
                           "with its MLflow extra, pip install 'flipgate[mlflow]'") from error
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_registry_uri(tracking_uri)
    return mlflow.MlflowClient(tracking_uri=tracking_uri)


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """(name, alias, version) of `models:/NAME@ALIAS` or `models:/NAME/VERSION`."""
    match = MODEL_URI.fullmatch(uri)
    if not match:
        raise InputError("invalid_model_uri", f"{uri!r} is not models:/NAME@ALIAS or "
                           "models:/NAME/VERSION")
    return match["name"], match["alias"], match["version"]


def resolve(client, uri: str) -> MlflowVersion:
    """The MLflow version `uri` names now (an alias is read once, here)."""
    from mlflow.exceptions import MlflowException

    name, alias, version = parse_model_uri(uri)
    try:
        found = (client.get_model_version_by_alias(name, alias) if alias
                 else client.get_model_version(name, version))
    except MlflowException as error:
        raise InputError("mlflow_version_not_found", f"MLflow has no {uri}: "
                           f"{error.message}") from error
    return MlflowVersion(found.name, str(found.version), found.run_id)


def declared_multilabel(client, name: str) -> bool | None:
    """What the registered model's `flipgate.multilabel` tag says its line is: "true" or
    "false" (any case); None without the tag."""
    value = client.get_registered_model(name).tags.get(MULTILABEL_TAG)
    if value is None:
        return None
    if value.strip().lower() not in ("true", "false"):
        raise InputError("invalid_multilabel_tag", f"MLflow's registered model {name!r} has "
                           f"{MULTILABEL_TAG}={value!r}; it must be true or false")
    return value.strip().lower() == "true"


def onnx_bytes(version: MlflowVersion, tracking_uri: str | None) -> bytes:
    """The version's ONNX model (its `onnx` flavour) serialised whole, with any weights kept
    as external data beside model.onnx inlined."""
    import onnx
    from mlflow.artifacts import download_artifacts
    from mlflow.models import Model

    with tempfile.TemporaryDirectory(prefix="flipgate-mlflow-") as folder:
        local = Path(download_artifacts(
            artifact_uri=f"models:/{version.name}/{version.version}", dst_path=folder,
            tracking_uri=tracking_uri))
        flavour = Model.load(local).flavors.get("onnx")
        if not flavour:
            raise InputError("not_onnx", f"MLflow model {version.name} version "
                               f"{version.version} has no onnx flavour (log it with "
                               "mlflow.onnx.log_model)")
        return onnx.load(local / flavour["data"]).SerializeToString()


def set_verdict_tags(client, version: MlflowVersion, decision: dict) -> None:
    """Write the decision on the MLflow version as flipgate.* tags, the verdict last (whoever
    sees it sees the others); the NFR is the worst over the decision's eval sets (NFR_sample
    on a multi-label line, whose decision also names the labels its reasons block on). The
    report link is left out unless it is absolute: a relative one means nothing in MLflow's
    UI."""
    tags = {DECISION_TAG: str(decision["decision_id"])}
    if decision.get("baseline"):
        nfrs = [metrics["nfr"] for metrics in decision.get("metrics", {}).values()
                if metrics and metrics.get("nfr") is not None]
        tags[NFR_TAG] = f"{max(nfrs):.6g}" if nfrs else "n/a"
        if is_absolute(report := decision.get("report_url") or ""):
            tags[REPORT_TAG] = report
    if any(metrics and metrics.get("multilabel")
           for metrics in decision.get("metrics", {}).values()):
        tags[LABELS_TAG] = json.dumps(blocking_labels(decision))
    tags[VERDICT_TAG] = decision["verdict"]
    for key, value in tags.items():
        client.set_model_version_tag(version.name, version.version, key, value)


def blocking_labels(decision: dict) -> list[str]:
    """The labels a multi-label decision's blocking reasons name, sorted (none: [])."""
    return sorted({reason["label"] for reason in decision.get("reasons", [])
                   if reason.get("blocking") and reason.get("label") is not None})


def is_absolute(link: str) -> bool:
    """Whether `link` is an http(s) address that opens from anywhere."""
    return link.startswith(("https://", "http://"))


class FlipgateRegistry:
    """The registry endpoints of a flipgate server, through the gate client's retries."""

    def __init__(self, client: gate_client.GateClient) -> None:
        self.client = client

    def register(self, line: str, version: str, model: bytes, metadata: dict,
                 multilabel: bool = False) -> str:
        """Register `model` as line:version (with `multilabel`, of a multi-label line: a new
        line becomes one, another kind of line refuses it); a version already there with the
        same bytes is reused, one with other bytes refused."""
        kind = {"multilabel": "true"} if multilabel else {}
        try:
            self.client.post_form("/models", {"name": line, "version": version,
                                              "metadata": json.dumps(metadata), **kind},
                                  {"artifact": ("model.onnx", model)})
        except InputError as error:
            if error.code != "version_exists":
                raise
            self.check_same_bytes(line, version, model)
        return version

    def check_same_bytes(self, line: str, version: str, model: bytes) -> None:
        """Refuse when line:version holds other bytes than `model`."""
        stored = self.client.get_json(f"/models/{quote(line, safe='')}/versions/"
                                      f"{quote(version, safe='')}")
        if stored["artifact_sha256"] != hashlib.sha256(model).hexdigest():
            raise InputError("version_conflict", f"flipgate's {line}:{version} holds another "
                               "model than this MLflow version; give another --line")

    def promote(self, line: str, version: str) -> None:
        """Move the line's production alias to `version` (needs its approving decision)."""
        self.client.post_json(f"/models/{quote(line, safe='')}/aliases/{PRODUCTION}",
                              {"version": version})


def register_from_mlflow(client, registry: FlipgateRegistry, uri: str, line: str | None,
                         tracking_uri: str | None,
                         multilabel: bool = False) -> tuple[MlflowVersion, str]:
    """The MLflow version `uri` names, registered on flipgate (in a multi-label line with
    `multilabel` or when its registered model's `flipgate.multilabel` tag says true); and the
    line it went to."""
    version = resolve(client, uri)
    line = line or version.name
    multilabel = multilabel or bool(declared_multilabel(client, version.name))
    registry.register(line, version.version, onnx_bytes(version, tracking_uri),
                      version.metadata(), multilabel)
    return version, line


def run_mlflow_gate(args: argparse.Namespace) -> int:
    """Gate an MLflow version: exit 0 approve, 1 block, 2 refused or unreachable, 3 pending."""
    tracking_uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    credentials = server_credentials(args)
    if not credentials.token:
        raise InputError("missing_credentials", f"give --token (or {TOKEN_ENV})")
    check_wait_flags(args)
    for uri in filter(None, (args.model_uri, args.baseline)):
        parse_model_uri(uri)  # a usage error before MLflow is touched
    client = mlflow_client(tracking_uri)
    with gate_client.http_client(args.server, gate_client.REQUEST_TIMEOUT_SECONDS) as http:
        gate = gate_client.GateClient(http, credentials)
        registry = FlipgateRegistry(gate)
        candidate, line = register_from_mlflow(client, registry, args.model_uri, args.line,
                                               tracking_uri, args.multilabel)
        baseline = (register_from_mlflow(client, registry, args.baseline, line, tracking_uri,
                                         args.multilabel)[0] if args.baseline else None)
        request = {"model": line, "candidate": candidate.version,
                   "baseline": baseline and baseline.version, "evalsets": args.evalset,
                   "ci": gate_client.ci_context({}, os.environ)}
        try:
            decision = gate_client.decide(gate, request, str(uuid.uuid4()),
                                          timeout=args.timeout, poll=args.poll,
                                          on_pending=gate_client.status_printer(sys.stderr))
        except gate_client.GateTimeout as timeout:
            print(f"flipgate mlflow gate: error: {timeout}", file=sys.stderr)
            return 3
        set_verdict_tags(client, candidate, decision)
        if args.promote and decision["verdict"] == "approve":
            registry.promote(line, candidate.version)
            client.set_registered_model_alias(candidate.name, args.promote, candidate.version)
    print(json.dumps(decision) if args.json else "\n".join(gate_client.describe(decision)))
    return gate_client.exit_code(decision)


def add_mlflow_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate mlflow` subcommand and its `gate`."""
    mlflow = commands.add_parser("mlflow", help="gate versions of an MLflow model registry")
    actions = mlflow.add_subparsers(dest="action", required=True, parser_class=type(mlflow))
    gate = actions.add_parser(
        "gate", help="register an MLflow version on a flipgate server and gate it",
        description="Registers MODEL_URI's ONNX model as a version of a flipgate line, asks "
                    "the deploy gate, tags the MLflow version with the verdict and, with "
                    "--promote, moves production and the MLflow alias on an approval. Exit "
                    "codes: 0 approve, 1 block, 2 usage error/refused/unreachable, 3 still "
                    "pending after --timeout. Needs pip install 'flipgate[mlflow]'.")
    gate.add_argument("model_uri", metavar="MODEL_URI",
                      help="models:/NAME@ALIAS or models:/NAME/VERSION")
    add_server_flags(gate, token_needs="scopes write and gate")
    gate.add_argument("--line", help="flipgate's model line (default: the registered model's "
                      "name)")
    gate.add_argument("--evalset", action="append", default=[], metavar="NAME",
                      help="eval set to decide on (repeatable; default: the policy's)")
    gate.add_argument("--baseline", metavar="MODEL_URI",
                      help="gate against this MLflow version (default: flipgate's production)")
    gate.add_argument("--multilabel", action="store_true",
                      help="the model decides each of its labels apart: a new line is made "
                           "multi-label (a single-label line refuses the version)")
    gate.add_argument("--promote", metavar="ALIAS",
                      help="on approval, move production and set this MLflow alias")
    gate.add_argument("--tracking-uri", metavar="URI", help="default: $MLFLOW_TRACKING_URI")
    add_wait_flags(gate)
    gate.set_defaults(run=run_mlflow_gate)
