"""Two projects side by side through the CLI against a real server (the app under uvicorn in
a thread, as tests/test_cli_gate.py runs it): `flipgate project create` and `flipgate token
create --project` on the server's database, then the same line and eval-set names uploaded,
compared and gated in each project, by a project-bound token (which names nothing) and by
the server admin (--project or $FLIPGATE_PROJECT)."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from flipgate.processes import free_port
from service.celery_app import create_celery_app
from service.config import Settings, get_settings
from service.main import create_app
from service.migrate import upgrade
from tests.conftest import linear_onnx
from tests.reasons import rate_figures
from tests.test_cli_gate import ADMIN_TOKEN, checked, npy, serve
from worker import runtime, tasks
from worker.runtime import WorkerContext

FEATURES, CLASSES, SAMPLES = 4, 3, 200
PROJECTS = ("alpha", "beta")


@dataclass(frozen=True)
class Server:
    url: str
    settings: Settings
    admin: httpx.Client


@pytest.fixture
def server(tmp_path, monkeypatch) -> Iterator[Server]:
    """A migrated, empty server whose database the CLI's server commands also reach
    (FLIPGATE_DATA_DIR)."""
    for name in ("FLIPGATE_TOKEN", "FLIPGATE_PROJECT", "GITHUB_ACTIONS", "GITLAB_CI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLIPGATE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FLIPGATE_ADMIN_TOKEN", ADMIN_TOKEN)
    get_settings.cache_clear()
    settings = get_settings()
    upgrade(settings)
    with (serve(create_app(settings), free_port()) as url,
          httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                       timeout=30) as admin):
        yield Server(url, settings, admin)
    get_settings.cache_clear()


def files(folder: Path, flipped: bool) -> dict[str, Path]:
    """The eval set `holdout`, two versions and their logits: 1.1 flips every fourth right
    answer of 1.0 when `flipped`, else answers as 1.0 does."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    labels = np.arange(SAMPLES) % CLASSES
    paths = {"holdout": folder / "holdout.npz"}
    np.savez(paths["holdout"], x=rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32),
             y=labels)
    flips = (np.arange(SAMPLES) % 4 == 0) if flipped else 0
    for version, answers in (("1.0", labels), ("1.1", (labels + flips) % CLASSES)):
        paths[version] = linear_onnx(folder / f"{version}.onnx",
                                     rng.normal(size=(FEATURES, CLASSES)),
                                     rng.normal(size=CLASSES), ("N", FEATURES))
        paths[f"{version}.npy"] = folder / f"{version}.npy"
        paths[f"{version}.npy"].write_bytes(npy(np.eye(CLASSES)[answers] * 5))
    return paths


def upload(run_cli, server: Server, paths: dict[str, Path], *who: str) -> None:
    """The eval set, both versions and their logits, by `flipgate upload` as `who`."""
    common = ("--server", server.url, *who)
    commands = [("evalset", "holdout", paths["holdout"])]
    for version in ("1.0", "1.1"):
        commands += [("model", f"fraud:{version}", paths[version]),
                     ("logits", f"fraud:{version}", paths[f"{version}.npy"], "--evalset",
                      "holdout")]
    for command in commands:
        result = run_cli("upload", *command, *common)
        assert result.code == 0, result.err


def measure(server: Server, project: str) -> None:
    """The pair 1.0 → 1.1 on holdout measured on the server (its metrics job run here), and
    the policy max_nfr 0.01 set, in `project`."""
    where = {"project": project}
    job = checked(server.admin.post("/compare/fraud:1.0/fraud:1.1",
                                    params={"evalset": "holdout", **where}))["job_id"]
    context = WorkerContext.from_settings(server.settings, create_celery_app(server.settings))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime, "context", lambda: context)
        tasks.metrics(job)
    checked(server.admin.put("/models/fraud/policy", params=where,
                             json={"max_nfr": 0.01, "evalsets": ["holdout"]}))


def test_two_projects_hold_the_same_names_side_by_side_through_the_cli(
        server, run_cli, tmp_path, monkeypatch):
    for project in PROJECTS:
        assert run_cli("project", "create", project).code == 0
    again = run_cli("project", "create", "alpha")
    assert again.code == 2 and "exists" in again.err
    minted = run_cli("token", "create", "--name", "ci", "--scopes", "read,write,gate",
                     "--project", "alpha")
    assert minted.code == 0, minted.err
    bound = minted.out.strip()
    upload(run_cli, server, files(tmp_path / "alpha", flipped=False), "--token", bound)
    upload(run_cli, server, files(tmp_path / "beta", flipped=True), "--token", ADMIN_TOKEN,
           "--project", "beta")
    for project in PROJECTS:
        measure(server, project)
    gate = ("gate", "--server", server.url, "--model", "fraud", "--candidate", "1.1",
            "--baseline", "1.0", "--poll", "0.05", "--timeout", "20")
    approved = run_cli(*gate, "--token", bound)
    assert approved.code == 0, approved.err
    assert "holdout: NFR 0.00% (0 of 200)" in approved.out
    monkeypatch.setenv("FLIPGATE_PROJECT", "beta")
    blocked = run_cli(*gate, "--token", ADMIN_TOKEN)
    assert blocked.code == 1, blocked.err
    [reason] = [line for line in blocked.out.splitlines() if "[blocking]" in line]
    assert reason.startswith("  [blocking] on holdout: NFR ")  # every fourth sample flipped
    assert rate_figures(reason)[::2] == (pytest.approx(SAMPLES // 4 / SAMPLES, abs=5e-5), 0.01)
    assert run_cli(*gate, "--token", ADMIN_TOKEN, "--project", "alpha").code == 0


def test_a_bound_token_naming_another_project_is_refused_as_for_none(server, run_cli):
    for project in PROJECTS:
        assert run_cli("project", "create", project).code == 0
    bound = run_cli("token", "create", "--name", "ci", "--scopes", "read,gate", "--project",
                    "alpha").out.strip()
    gate = ("gate", "--server", server.url, "--model", "fraud", "--candidate", "1.0",
            "--token", bound, "--project")
    refused = [run_cli(*gate, project) for project in ("beta", "nowhere")]
    assert [result.code for result in refused] == [2, 2]
    assert refused[0].err.replace("'beta'", "'P'") == refused[1].err.replace("'nowhere'", "'P'")
    assert "HTTP 404 project_not_found" in refused[0].err
