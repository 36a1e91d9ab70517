"""`flipgate store check|gc` as an operator runs them: the installed command in a fresh
process, on an embedded data directory with one registered eval set and two strays."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from service.config import Settings
from service.datasets.models import DatasetRole
from service.datasets.service import register_dataset
from service.db import settings_session
from service.migrate import upgrade
from service.storage import ArtifactStore, open_store

pytestmark = pytest.mark.slow


def flipgate(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLIPGATE_")}
    command = Path(sys.executable).with_name("flipgate")
    return subprocess.run([command, "store", *args], env={**environment, "FLIPGATE_DATA_DIR":
                          str(data_dir)}, capture_output=True, text=True, timeout=120)


def stray(store: ArtifactStore, tmp_path: Path, content: bytes, age_seconds: float) -> str:
    """An artifact no row references, last written `age_seconds` ago."""
    path = tmp_path / f"stray-{len(content)}"
    path.write_bytes(content)
    sha256 = store.put_file(path).sha256
    stamp = time.time() - age_seconds
    os.utime(store.path(sha256), (stamp, stamp))
    return sha256


@pytest.fixture
def registered(tmp_path) -> tuple[Path, ArtifactStore, str]:
    """A migrated data directory, its store, and the address of its one registered eval set."""
    data_dir = tmp_path / "data"
    settings = Settings(data_dir=data_dir)
    upgrade(settings)
    store = open_store(settings)
    evalset = tmp_path / "eval.npz"
    np.savez(evalset, x=np.zeros((3, 2), np.float32), y=np.array([0, 1, 0]))
    with settings_session(settings) as session:
        dataset = register_dataset(session=session, store=store, name="eval",
                                   npz_path=evalset, role=DatasetRole.EVAL)
        return data_dir, store, dataset.sha256


def test_check_reports_strays_and_gc_removes_only_old_unreferenced_ones(registered, tmp_path):
    data_dir, store, kept = registered
    old, young = stray(store, tmp_path, b"old", 7200), stray(store, tmp_path, b"young", 0)
    check = flipgate(data_dir, "check")
    assert check.returncode == 1, check.stderr
    assert sorted(check.stdout.split()[2::3]) == sorted([old, young])
    gc = flipgate(data_dir, "gc", "--min-age-minutes", "30")
    assert gc.returncode == 0, gc.stderr
    assert gc.stdout.split() == ["removed", old]
    assert store.exists(kept) and store.exists(young) and not store.exists(old)
    assert flipgate(data_dir, "gc", "--min-age-minutes", "0").returncode == 0
    clean = flipgate(data_dir, "check")
    assert (clean.returncode, clean.stdout) == (0, ""), clean.stderr
    assert store.exists(kept)


def test_check_reports_a_row_whose_artifact_is_gone_and_gc_rejects_a_bad_age(registered):
    data_dir, store, lost = registered
    store.remove([lost])
    check = flipgate(data_dir, "check")
    assert check.returncode == 1
    assert check.stdout.split("\n")[0] == f"missing artifact {lost} (a row references it)"
    refused = flipgate(data_dir, "gc", "--min-age-minutes", "-5")
    assert refused.returncode == 2 and "must be a number >= 0" in refused.stderr
