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
from service.storage import ArtifactStore, bundle_sha256, open_store
from tests.s3server import SHARED_KEYS, unique_prefix
from tests.service.conftest import bundle_files, in_default_project

pytestmark = pytest.mark.slow


def flipgate(data_dir: Path, *args: str, **variables: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLIPGATE_")}
    command = Path(sys.executable).with_name("flipgate")
    return subprocess.run([command, "store", *args], env={
        **environment, "FLIPGATE_DATA_DIR": str(data_dir), **variables},
        capture_output=True, text=True, timeout=120)


def stray(store: ArtifactStore, tmp_path: Path, content: bytes, age_seconds: float) -> str:
    """An artifact no row references, last written `age_seconds` ago."""
    path = tmp_path / f"stray-{len(content)}"
    path.write_bytes(content)
    sha256 = store.put_file(path).sha256
    stamp = time.time() - age_seconds
    os.utime(store.path(sha256), (stamp, stamp))
    return sha256


def registered_in(settings: Settings, tmp_path: Path) -> tuple[Path, ArtifactStore, str]:
    """The data directory of `settings` migrated, its store, and the address of the one eval
    set registered in it."""
    data_dir = settings.data_dir
    upgrade(settings)
    store = open_store(settings)
    evalset = tmp_path / "eval.npz"
    np.savez(evalset, x=np.zeros((3, 2), np.float32), y=np.array([0, 1, 0]))
    with settings_session(settings) as session:
        dataset = register_dataset(session=in_default_project(session), store=store, name="eval",
                                   npz_path=evalset, role=DatasetRole.EVAL)
        return data_dir, store, dataset.sha256


@pytest.fixture
def registered(tmp_path) -> tuple[Path, ArtifactStore, str]:
    """An embedded data directory with its local store (registered_in)."""
    return registered_in(Settings(data_dir=tmp_path / "data"), tmp_path)


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


def test_check_and_gc_work_on_a_bucket(s3, s3_prefix, s3_settings, tmp_path):
    data_dir, store, kept = registered_in(s3_settings, tmp_path)
    bucket = s3.flipgate_env(s3_prefix)
    keys = (f"{s3_prefix}/staging/abandoned",  # a body without its digest
            store.key("ab" * 32))  # one declared: sent to its address
    abandoned = [s3.client().create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
                 for key in keys]
    unfinished = flipgate(data_dir, "check", **bucket)
    assert unfinished.returncode == 0, unfinished.stderr  # uploads under way, for all it knows
    assert sorted(unfinished.stdout.splitlines()) == sorted(
        f"unfinished upload: multipart upload to {key}, begun 0 minutes ago" for key in keys)
    assert "2 unfinished uploads (0 begun over 15 minutes ago)" in unfinished.stderr
    time.sleep(0.1)
    idle = flipgate(data_dir, "check", FLIPGATE_STAGING_IDLE_MINUTES="0.001", **bucket)
    assert idle.returncode == 1 and "(2 begun over 0.001 minutes ago)" in idle.stderr
    (tmp_path / "stray").write_bytes(b"stray")
    young = store.put_file(tmp_path / "stray").sha256
    check = flipgate(data_dir, "check", **bucket)
    assert check.returncode == 1, check.stderr
    assert check.stdout.splitlines()[0] == f"unreferenced artifact {young}"
    assert flipgate(data_dir, "gc", "--min-age-minutes", "30", **bucket).stdout == ""
    assert store.exists(young) and s3.incomplete_uploads(s3_prefix)  # younger than the grace
    gc = flipgate(data_dir, "gc", "--min-age-minutes", "0", **bucket)
    assert gc.returncode == 0 and gc.stdout.split() == ["removed", young], gc.stderr
    assert store.exists(kept) and not store.exists(young)
    assert s3.incomplete_uploads(s3_prefix) == [], abandoned
    assert not (data_dir / "artifacts").exists()


def test_migrate_copies_a_local_store_into_a_bucket_and_resumes(registered, s3, s3_prefix,
                                                                 tmp_path):
    data_dir, local, evalset = registered
    files = bundle_files(tmp_path)
    bundle = bundle_sha256(files)
    local.put_bundle(files, bundle)
    bucket = s3.flipgate_env(s3_prefix)
    to = ["migrate", "--to", bucket["FLIPGATE_ARTIFACT_STORE"]]
    first = flipgate(data_dir, *to, **s3.aws_env())
    assert first.returncode == 0 and "2 copied, 0 already there" in first.stderr, first.stderr
    s3.client().delete_object(Bucket=s3.bucket, Key=f"{s3_prefix}/sha256/{evalset[:2]}/"
                              f"{evalset[2:]}")  # a run cut short before this one
    again = flipgate(data_dir, *to, **s3.aws_env())
    assert "1 copied, 1 already there" in again.stderr, again.stderr
    assert flipgate(data_dir, "check", **bucket).returncode == 1  # the bundle: no row
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3.aws_env().items():
            patch.setenv(name, value)
        moved = open_store(Settings(data_dir=tmp_path / "another-host",
                                    artifact_store=bucket["FLIPGATE_ARTIFACT_STORE"],
                                    **SHARED_KEYS))
        assert moved.local_path(evalset).read_bytes() == local.path(evalset).read_bytes()
        assert moved.model_path(bundle).read_bytes() == b"graph"


def test_migrate_copies_no_artifact_whose_bytes_are_not_its_address(registered, s3,
                                                                    s3_prefix):
    data_dir, local, evalset = registered
    path = local.path(evalset)
    path.chmod(0o644)
    path.write_bytes(b"bit rot")
    migrated = flipgate(data_dir, "migrate", "--to", s3.store_url(s3_prefix), **s3.aws_env())
    assert migrated.returncode == 1 and evalset in migrated.stdout, migrated.stderr
    assert s3.keys(s3_prefix) == []


def test_migrate_copies_the_store_the_server_is_configured_with(s3, s3_prefix, s3_settings,
                                                                tmp_path):
    """Its source is FLIPGATE_ARTIFACT_STORE's store (here a bucket), not the data folder."""
    data_dir, _, evalset = registered_in(s3_settings, tmp_path)
    target = unique_prefix()
    moved = flipgate(data_dir, "migrate", "--to", s3.store_url(target),
                     **s3.flipgate_env(s3_prefix))
    assert moved.returncode == 0 and "1 copied" in moved.stderr, moved.stderr
    assert s3.keys(target) == [f"{target}/sha256/{evalset[:2]}/{evalset[2:]}"]
