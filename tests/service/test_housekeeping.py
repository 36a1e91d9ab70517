"""Abandoned uploads are swept (once per period by the processes of a host, and in a bucket
by one sweeper of the deployment), unreferenced artifacts and unfinished uploads reported and
collected, nothing a row references is ever removed, and a store is copied into another."""

import io
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from service.datasets.models import DatasetRole
from service.datasets.service import register_dataset
from service.db import Base
from service.housekeeping import (
    ARTIFACT_COLUMNS,
    SharedSweep,
    check_store,
    collect_garbage,
    migrate_store,
    sweep_abandoned_uploads,
)
from service.main import create_app
from service.registry.service import register_version
from service.storage import LocalStore, bundle_sha256, open_store
from tests.service.conftest import bundle_files

HOUR = 3600
NOT_ARTIFACT_COLUMNS = {"gate_decisions.request_sha256"}  # a request's digest, never stored


def age(path, seconds: float) -> None:
    """Make a file (and everything in a folder) look untouched for `seconds`."""
    stamp = time.time() - seconds
    for item in [path, *(path.rglob("*") if path.is_dir() else [])]:
        os.utime(item, (stamp, stamp))


def partial_upload(store, name: str):
    folder = store.staging / name
    folder.mkdir(parents=True)
    (folder / "data.npz").write_bytes(b"half an upload")
    return folder


def test_only_partial_files_idle_for_the_period_are_swept(store):
    stale, fresh = partial_upload(store, "tmp-stale"), partial_upload(store, "tmp-fresh")
    store.root.mkdir(parents=True, exist_ok=True)
    unfinished = store.root / ".upload-abandoned"
    unfinished.write_bytes(b"x")
    age(stale, 2 * HOUR)
    age(unfinished, 2 * HOUR)
    age(fresh, 2 * HOUR)
    (fresh / "data.npz").touch()  # an upload still writing
    swept = store.sweep_partial(HOUR)
    assert sorted(swept) == sorted([str(stale), str(unfinished)])
    assert fresh.exists() and not stale.exists() and not unfinished.exists()


def test_the_api_sweeps_abandoned_uploads_when_it_starts(engine, tmp_path):
    from service.config import Settings
    settings = Settings(database_url=engine.url.render_as_string(hide_password=False),
                        data_dir=tmp_path / "data", staging_idle_minutes=1)
    app = create_app(settings)
    stale = partial_upload(app.state.store, "tmp-killed-server")
    age(stale, 120)
    with TestClient(app):
        deadline = time.monotonic() + 10
        while stale.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not stale.exists()


def sweep_in_a_process(root, idle_seconds: float) -> list[str]:
    """What one process of the host sweeps, with a store of its own on the folder `root`."""
    return sweep_abandoned_uploads(store=LocalStore(root), idle_seconds=idle_seconds)


def sweeps_of(processes: int, root, idle_seconds: float) -> list[list[str]]:
    """What each of `processes` processes sweeping the folder `root` at once removed."""
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(sweep_in_a_process, [root] * processes,
                             [idle_seconds] * processes))


def test_the_processes_of_a_host_sweep_its_staging_folder_once_per_half_period(tmp_path):
    root = tmp_path / "artifacts"
    store = LocalStore(root)
    first = partial_upload(store, "tmp-first")
    age(first, 2 * HOUR)
    swept = sweeps_of(4, root, HOUR)
    assert sorted(swept, key=len) == [[], [], [], [str(first)]] and not first.exists()
    second = partial_upload(store, "tmp-second")  # abandoned after the turn was taken
    age(second, 2 * HOUR)
    assert sweeps_of(4, root, HOUR) == [[]] * 4 and second.exists()
    assert sorted(sweeps_of(4, root, 0.2), key=len)[-1] == [str(second)]  # a short period:
    assert not second.exists()  # the last turn is over half of it ago


def test_one_sweeper_of_a_deployment_sweeps_the_bucket(engine, s3, s3_prefix, s3_settings):
    """On PostgreSQL the holder of the store's advisory lock, and another once it is gone;
    on SQLite (one host) any sweeper."""
    store = open_store(s3_settings)
    s3.client().create_multipart_upload(Bucket=s3.bucket, Key=store.key("a" * 64))
    time.sleep(1.1)  # begun a whole second ago (the store's times have whole seconds)
    url = engine.url.render_as_string(hide_password=False)
    engines = [create_engine(url) for _ in range(3)]  # as many sweeper processes
    sweepers = [SharedSweep(each, s3_settings.artifact_store) for each in engines]
    try:
        leaders = [sweeper for sweeper in sweepers if sweeper.leads()]
        swept = [len(sweep_abandoned_uploads(store=store, shared=sweeper, idle_seconds=0))
                 for sweeper in sweepers]
        assert sum(swept) == 1 and s3.incomplete_uploads(s3_prefix) == []
        if engine.dialect.name == "sqlite":
            assert leaders == sweepers
            return
        assert leaders == [sweepers[swept.index(1)]] and leaders[0].leads()  # it keeps it
        leaders[0].release()  # its process ended
        assert sum(sweeper.leads() for sweeper in sweepers if sweeper is not leaders[0]) == 1
    finally:
        for sweeper, each in zip(sweepers, engines, strict=True):
            sweeper.release()
            each.dispose()


@pytest.fixture
def registered(session, store, npz_file, onnx_file):
    dataset = register_dataset(session=session, store=store, name="eval",
                               role=DatasetRole.EVAL, npz_path=npz_file())
    version = register_version(session=session, store=store, line_name="digits", version="1",
                               onnx_path=onnx_file())
    session.flush()
    return {dataset.sha256, version.artifact_sha256}


def test_check_reports_unreferenced_artifacts_and_rows_without_one(session, store, registered,
                                                                   tmp_path):
    orphan = tmp_path / "orphan.bin"
    orphan.write_bytes(b"left by a crash")
    stray = store.put_file(orphan).sha256
    lost = sorted(registered)[0]
    store.remove([lost])
    report = check_store(session=session, store=store)
    assert (report.unreferenced, report.missing) == ([stray], [lost])


def test_gc_removes_only_old_unreferenced_artifacts(session, store, registered, tmp_path):
    (old := tmp_path / "old.bin").write_bytes(b"old orphan")
    (young := tmp_path / "young.bin").write_bytes(b"a registration not yet committed")
    old_sha, young_sha = store.put_file(old).sha256, store.put_file(young).sha256
    age(store.path(old_sha), 2 * HOUR)
    for sha256 in registered:
        age(store.path(sha256), 2 * HOUR)
    assert collect_garbage(session=session, store=store, min_age_seconds=HOUR) == [old_sha]
    assert set(store.addresses()) == registered | {young_sha}


def test_every_sha256_column_is_declared_an_artifact_or_not():
    """A new artifact column that gc does not know would have its artifacts collected."""
    declared = {f"{attribute.property.columns[0].table.name}.{attribute.key}"
                for attribute in ARTIFACT_COLUMNS}
    columns = {f"{table.name}.{column.name}" for table in Base.metadata.tables.values()
               for column in table.columns if column.name.endswith("sha256")}
    assert columns == declared | NOT_ARTIFACT_COLUMNS


def test_migration_copies_every_artifact_into_a_store_of_the_other_kind(each_store,
                                                                          other_store,
                                                                          tmp_path):
    """Either way between the local folder and a bucket; a bundle stays a bundle; run again,
    it copies nothing."""
    plain = each_store.put_stream(io.BytesIO(b"an eval set")).sha256
    files = bundle_files(tmp_path)
    bundle = bundle_sha256(files)
    each_store.put_bundle(files, bundle)
    report = migrate_store(source=each_store, target=other_store, progress=lambda *_: None)
    assert (report.copied, report.present, report.corrupt) == (sorted([plain, bundle]), [], [])
    assert sorted(other_store.addresses()) == sorted([plain, bundle])
    assert other_store.local_path(plain).read_bytes() == b"an eval set"
    assert other_store.is_bundle(bundle)
    assert b"".join(other_store.bundle_tar(bundle)) == b"".join(each_store.bundle_tar(bundle))
    again = migrate_store(source=each_store, target=other_store, progress=lambda *_: None)
    assert (again.copied, again.present) == ([], sorted([plain, bundle]))
