"""Run by tests/service/test_upgrade_from_previous_release.py as a script, with the PREVIOUS
release's code first on sys.path (never this tree's) and its FLIPGATE_* settings in the
environment: `fill FOLDER` migrates the empty database with that release's `flipgate
migrate`, mints its tokens with its `flipgate token create`, fills it through its server (and
its worker's tasks, run in this process) from the files in FOLDER, then writes the tokens,
the webhook secret, what it sent, the reads to repeat and what its API answered to them, as
JSON, into FOLDER/filled.json; `read FOLDER` asks those reads again (after a round trip
through the new schema) and writes the answers into FOLDER/read.json.

Only the previous release's packages may be imported here: this file is not part of it."""

import argparse
import contextlib
import hashlib
import importlib
import io
import json
import sys
import threading
import time
import tomllib
import unittest.mock
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import uvicorn
from sqlalchemy import update

from flipgate import cli as flipgate_cli
from flipgate.cli import main as flipgate
from flipgate.processes import free_port
from flipgate.signing import HEADER, signature
from service.auth.models import ApiToken
from service.config import get_settings
from service.db import settings_session, utcnow
from service.main import create_app
from worker import tasks

LINE = "digits"
# name -> (scopes, `flipgate token create` options)
TOKENS = {"reader": ("read", []), "writer": ("read,write", []), "gatekeeper": ("gate", []),
          "owner": ("admin", []), "scraper": ("metrics", []),
          "expiring": ("read,write", ["--expires-in", "30"]),
          "expired": ("read", ["--expires-in", "1"]), "revoked": ("read,gate", [])}
OUTPUT = {"fill": "filled.json", "read": "read.json"}
TASKS = {"inference": tasks.inference, "metrics": tasks.metrics, "matrix": tasks.matrix}


def previous_commands(commands: argparse._SubParsersAction) -> int:
    """Add the subcommands the previous release's pyproject.toml contributes: the installed
    metadata is this tree's, whose entry points name functions the previous code lacks."""
    with open("pyproject.toml", "rb") as declared:  # the previous release's (the cwd)
        targets = tomllib.load(declared)["project"]["entry-points"]["flipgate.commands"]
    for target in targets.values():
        module, _, function = target.partition(":")
        getattr(importlib.import_module(module), function)(commands)
    return len(targets)


def cli(*args: str) -> str:
    """Run the previous release's `flipgate` (with its own subcommands) in this process; its
    standard output."""
    out = io.StringIO()
    with (contextlib.redirect_stdout(out),
          unittest.mock.patch.object(flipgate_cli, "add_contributed_commands",
                                     previous_commands)):
        code = flipgate(list(args))
    assert code == 0, f"flipgate {' '.join(args)} exited {code}"
    return out.getvalue()


def mint_tokens() -> dict[str, str]:
    """The tokens, minted and revoked with the previous release's CLI; `expired` expires."""
    minted = {name: cli("token", "create", "--name", name, "--scopes", scopes,
                        *options).strip()
              for name, (scopes, options) in TOKENS.items()}
    cli("token", "revoke", "revoked")
    with settings_session(get_settings()) as session:
        session.execute(update(ApiToken).where(ApiToken.name == "expired")
                        .values(expires_at=utcnow() - timedelta(days=1)))
    return minted


@contextlib.contextmanager
def server(admin_token: str) -> Iterator[httpx.Client]:
    """The previous release's server under uvicorn in a thread; a client that sends the
    bootstrap admin token unless a request names another."""
    port = free_port()
    app = create_app(get_settings())
    runner = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not runner.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          headers={"Authorization": f"Bearer {admin_token}"}) as client:
            yield client
    finally:
        runner.should_exit = True
        thread.join()


class Filler:
    """Fills the database through the server with the tokens of each role, running the jobs
    it queues as the worker would; keeps the ids of what it made."""

    def __init__(self, client: httpx.Client, tokens: dict[str, str], folder: Path) -> None:
        self.client, self.tokens, self.folder = client, tokens, folder
        self.jobs: list[int] = []
        self.decisions: list[int] = []
        self.sent: dict[str, dict] = {}

    def call(self, method: str, url: str, token: str, **kwargs) -> dict:
        """The JSON answer of a successful request sent with the token named `token`."""
        headers = {"Authorization": f"Bearer {self.tokens[token]}", **kwargs.pop("headers", {})}
        response = self.client.request(method, url, headers=headers, **kwargs)
        assert response.is_success, f"{method} {url}: {response.status_code} {response.text}"
        return response.json()

    def drain(self) -> None:
        """Run every job queued since the last drain, oldest first (as the worker would: a
        job waits for older ones only)."""
        while (found := self.client.get(f"/jobs/{len(self.jobs) + 1}")).status_code == 200:
            job = found.json()
            self.jobs.append(job["id"])
            if job["state"] == "queued":
                TASKS[job["kind"]](job["id"])

    def upload(self, url: str, field: str, filename: str, **data: str) -> dict:
        return self.call("POST", url, "writer", data=data, files={
            field: (filename, (self.folder / filename).read_bytes())})

    def fill(self) -> None:
        """Data sets, the line, its reports, policy, decisions, promotions and secret."""
        self.upload("/evalsets", "data", "eval.npz", name="eval")
        self.upload("/evalsets", "data", "holdout.npz", name="holdout")
        self.upload("/evalsets", "data", "traffic.npz", name="traffic")
        self.upload("/trainsets", "data", "train.npz", name="train")
        self.versions()
        self.call("PUT", f"/models/{LINE}/training-dataset", "writer", json={"dataset": "train"})
        self.call("PUT", f"/models/{LINE}/classes", "writer",
                  json={"class_names": ["zero", "one", "two"]})
        for evalset in ("eval", "holdout"):
            self.call("POST", f"/compare/{LINE}:1.0/{LINE}:1.1", "writer",
                      params={"evalset": evalset})
        self.call("POST", f"/compare/{LINE}:1.0/{LINE}:1.2", "writer",
                  params={"evalset": "traffic"})
        self.drain()
        self.upload("/evalsets/traffic/labels", "labels", "labels.npz")
        self.call("POST", f"/models/{LINE}/matrix", "writer", params={"evalset": "eval"})
        self.drain()
        self.call("PUT", f"/models/{LINE}/policy", "owner",
                  json={"max_nfr": 0.01, "evalsets": ["eval"]})
        self.decide()

    def versions(self) -> None:
        """1.0 and 1.1 (ONNX) and 1.2 (external), with logits on eval and traffic."""
        for version in ("1.0", "1.1"):
            self.upload("/models", "artifact", f"{version}.onnx", name=LINE, version=version)
        self.call("POST", "/models", "writer", data={"name": LINE, "version": "1.2"})
        for version, evalset in [("1.0", "eval"), ("1.1", "eval"), ("1.2", "eval"),
                                 ("1.0", "traffic"), ("1.2", "traffic")]:
            self.upload(f"/models/{LINE}/versions/{version}/predictions", "logits",
                        f"{version}-{evalset}.npy", evalset=evalset)

    def decide(self) -> None:
        """1.0 forced to production, 1.2 approved and promoted, 1.1 blocked by a signed
        request, `staging` moved to 1.1."""
        self.call("POST", f"/models/{LINE}/aliases/production", "owner",
                  json={"version": "1.0", "force": True})
        self.gate("approve", {"model": LINE, "candidate": "1.2", "ci": {"sha": "abc123"}},
                  token="gatekeeper")
        self.call("POST", f"/models/{LINE}/aliases/production", "writer",
                  json={"version": "1.2"})
        self.call("POST", f"/models/{LINE}/aliases/staging", "writer", json={"version": "1.1"})
        self.sent["secret"] = self.call("POST", f"/models/{LINE}/webhook-secret", "owner")
        self.gate("block", {"model": LINE, "candidate": "1.1", "baseline": "1.0"})

    def gate(self, name: str, request: dict, token: str | None = None) -> None:
        """POST /gate as `token`, or signed with the webhook secret; then run its jobs."""
        body = json.dumps(request).encode()
        headers = {"Content-Type": "application/json", "X-Flipgate-Delivery": f"old-{name}"}
        if token is None:
            headers |= {HEADER: signature(self.sent["secret"]["secret"], body)}
            signed = self.client.build_request("POST", "/gate", content=body, headers=headers)
            del signed.headers["Authorization"]
            response = self.client.send(signed)
            assert response.is_success, response.text
            answer = response.json()
        else:
            answer = self.call("POST", "/gate", token, content=body, headers=headers)
        self.drain()
        self.decisions.append(answer["decision_id"])
        self.sent[name] = {"request": request, "token": token, "delivery": f"old-{name}"}

    def reads(self) -> list[list[str]]:
        """[token, url] of every read whose answer the upgrade must keep."""
        line, pair = f"/models/{LINE}", f"/compare/{LINE}:1.0/{LINE}:1.1"
        traffic = f"/compare/{LINE}:1.0/{LINE}:1.2"
        urls = ["/models", line, *(f"{line}/versions/{v}" for v in ("1.0", "1.1", "1.2")),
                f"{line}/versions/1.0/artifact", "/evalsets", "/trainsets",
                f"{pair}?evalset=eval", f"{pair}?evalset=holdout",
                f"{traffic}?evalset=traffic", f"{traffic}/disagreements?evalset=traffic",
                f"{line}/matrix?evalset=eval", f"{line}/policy", f"{line}/decisions",
                f"{line}/promotions", f"{line}/unstable-samples?evalset=eval",
                *(f"/gate/decisions/{i}" for i in self.decisions),
                *(f"/jobs/{i}" for i in self.jobs)]
        return [["reader", url] for url in urls] + [["owner", f"{line}/policy"],
                                                    ["scraper", "/models"]]


def answers(client: httpx.Client, tokens: dict[str, str], reads: list[list[str]]) -> list:
    """[status, JSON body (or the sha256 of any other body)] of each read."""
    found = []
    for token, url in reads:
        response = client.get(url, headers={"Authorization": f"Bearer {tokens[token]}"})
        is_json = response.headers.get("content-type", "").startswith("application/json")
        found.append([response.status_code, response.json() if is_json
                      else hashlib.sha256(response.content).hexdigest()])
    return found


def fill(folder: Path) -> dict:
    """Migrate, mint, fill and read (see the module)."""
    cli("migrate")
    tokens = mint_tokens()
    admin = get_settings().admin_token.get_secret_value()
    with server(admin) as client:
        filler = Filler(client, tokens, folder)
        filler.fill()
        reads = filler.reads()
        return {"tokens": tokens, "scopes": {name: sorted(scopes.split(","))
                                             for name, (scopes, _) in TOKENS.items()},
                "sent": filler.sent, "jobs": filler.jobs, "decisions": filler.decisions,
                "reads": reads, "answers": answers(client, tokens, reads)}


def read(folder: Path) -> dict:
    """The answers to the reads that `fill` wrote into `folder`."""
    before = json.loads((folder / "filled.json").read_text())
    admin = get_settings().admin_token.get_secret_value()
    with server(admin) as client:
        return {"answers": answers(client, before["tokens"], before["reads"])}


if __name__ == "__main__":
    command, folder = sys.argv[1], Path(sys.argv[2])
    done = fill(folder) if command == "fill" else read(folder)
    (folder / OUTPUT[command]).write_text(json.dumps(done))
