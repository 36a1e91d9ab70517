"""What is particular to the S3 back-end, against a real S3 server (SeaweedFS): the read
cache of each host, the conditional writes, and the streamed uploads."""

import asyncio
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from service.errors import StorageUnavailable
from service.housekeeping import migrate_store
from service.storage import LocalStore, bundle_sha256, open_store
from service.storage.bundle import bundle_chunks
from service.storage.cache import EVICT_MARGIN, ReadCache
from service.storage.s3 import MULTIPART_AREAS
from tests.service.conftest import bundle_files

CONTENT = os.urandom(3 << 20)
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


@pytest.fixture
def s3_store(s3_settings):
    return open_store(s3_settings)


def another_host(s3_settings, tmp_path, name: str = "host-2", **changes):
    """The same bucket seen from another machine: its own empty data and cache folders."""
    return open_store(s3_settings.model_copy(update={"data_dir": tmp_path / name, **changes}))


def test_another_host_reads_an_artifact_from_the_bucket_into_its_cache(s3_store, s3_settings,
                                                                       tmp_path):
    (tmp_path / "a").write_bytes(CONTENT)
    sha256 = s3_store.put_file(tmp_path / "a").sha256
    reader = another_host(s3_settings, tmp_path)
    path = reader.local_path(sha256)
    assert path.is_relative_to(tmp_path / "host-2" / "cache") and path.read_bytes() == CONTENT
    assert not (tmp_path / "host-2" / "artifacts").exists()


def test_an_object_whose_bytes_are_not_its_address_is_refused_and_not_cached(
        s3, s3_store, s3_settings, tmp_path):
    (tmp_path / "a").write_bytes(CONTENT)
    sha256 = s3_store.put_file(tmp_path / "a").sha256
    s3.client().put_object(Bucket=s3.bucket, Key=s3_store.key(sha256), Body=b"tampered")
    reader = another_host(s3_settings, tmp_path)
    with pytest.raises(StorageUnavailable) as refused:
        reader.local_path(sha256)
    assert refused.value.code == "artifact_corrupt"
    assert not reader.cache.path(sha256).exists()


def test_the_processes_of_one_host_fetch_an_artifact_once(s3_store, s3_settings, tmp_path):
    (tmp_path / "a").write_bytes(CONTENT)
    sha256 = s3_store.put_file(tmp_path / "a").sha256
    readers = [another_host(s3_settings, tmp_path) for _ in range(6)]  # one cache folder
    fetched, start = [], threading.Barrier(len(readers))
    for reader in readers:
        download = reader._download
        reader._download = lambda *args, download=download: fetched.append(1) or download(*args)

    def read(reader) -> None:
        start.wait()
        assert reader.local_path(sha256).read_bytes() == CONTENT

    threads = [threading.Thread(target=read, args=(reader,)) for reader in readers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fetched) == 1


def test_the_least_recently_used_artifacts_are_evicted_beyond_the_limit(
        s3_store, s3_settings, tmp_path):
    reader = another_host(s3_settings, tmp_path, cache_max_gb=3.5 * len(CONTENT) / 2**30)
    addresses = []
    for index in range(4):
        (tmp_path / f"a{index}").write_bytes(CONTENT[index:] + CONTENT[:index])
        addresses.append(s3_store.put_file(tmp_path / f"a{index}").sha256)
    for age, sha256 in zip((300, 200, 100), addresses[:3], strict=True):
        path = reader.local_path(sha256)
        os.utime(path, (time.time() - age, time.time() - age))  # last read `age` s ago
    reader.local_path(addresses[0])  # read again: now the most recently used
    reader.local_path(addresses[3])  # a fourth does not fit: the least recently used goes
    cached = [sha256 for sha256 in addresses if reader.cache.path(sha256).exists()]
    assert cached == [addresses[0], addresses[2], addresses[3]]


def cached(root, index: int, size: int, age_seconds: float = 0) -> None:
    """An entry of `size` bytes in the cache folder `root`, last used `age_seconds` ago."""
    path = root / f"{index:064x}"[:2] / f"{index:064x}"[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    os.utime(path, (time.time() - age_seconds, time.time() - age_seconds))


def adopted(cache: ReadCache, tmp_path, size: int) -> None:
    """A worker's new result of `size` bytes kept in its cache."""
    path = tmp_path / f"result-{time.monotonic_ns()}"
    path.write_bytes(os.urandom(size))
    cache.adopt(path, os.urandom(32).hex())


def cache_bytes(root) -> int:
    return sum(path.stat().st_size for path in root.glob("[0-9a-f][0-9a-f]/*"))


def test_the_processes_of_a_host_evict_once_per_interval_unless_far_over_the_limit(tmp_path):
    """An eviction lists the whole cache: the processes sharing a cache folder take one turn
    per interval between them, and one that has cached more than EVICT_MARGIN of the limit
    since it last evicted evicts at once."""
    root, limit = tmp_path / "cache", 100_000
    processes = [ReadCache(root, limit, evict_seconds=3600) for _ in range(3)]
    for index in range(5):
        cached(root, index, 30_000, age_seconds=600 - index)
    for cache in processes:
        adopted(cache, tmp_path, 1000)  # the first process's turn: down to the limit
    assert cache_bytes(root) == 90_000 + 3000
    for index in range(5, 8):
        cached(root, index, 4000, age_seconds=600)  # over the limit: left to the next turn
    adopted(processes[1], tmp_path, 1000)
    assert cache_bytes(root) == 93_000 + 12_000 + 1000
    adopted(processes[1], tmp_path, int(EVICT_MARGIN * limit))  # past the margin: at once
    assert cache_bytes(root) <= limit


def stored_bundle(s3_store, tmp_path) -> tuple[dict, str]:
    """A model with its external data stored as a bundle: its files and address."""
    files = bundle_files(tmp_path)
    sha256 = bundle_sha256(files)
    s3_store.put_bundle(files, sha256)
    return files, sha256


def test_a_bundle_is_given_from_the_bucket_as_stored_not_through_the_cache(
        s3_store, s3_settings, tmp_path):
    files, sha256 = stored_bundle(s3_store, tmp_path)
    reader = another_host(s3_settings, tmp_path)
    assert b"".join(reader.bundle_tar(sha256)) == b"".join(bundle_chunks(files))
    assert not reader.cache.path(sha256).exists()


def test_a_bundle_whose_files_are_not_its_address_is_cut_short(s3, s3_store, tmp_path):
    files, sha256 = stored_bundle(s3_store, tmp_path)
    files["model.onnx.data"].write_bytes(b"tampered weights")
    s3.client().put_object(Bucket=s3.bucket, Key=s3_store.key(sha256),
                           Body=b"".join(bundle_chunks(files)),
                           Metadata={"flipgate-kind": "bundle"})
    given = []
    with pytest.raises(StorageUnavailable) as refused:
        given.extend(s3_store.bundle_tar(sha256))
    assert refused.value.code == "artifact_corrupt"
    assert len(b"".join(given)) < len(b"".join(bundle_chunks(files)))


def test_migrating_a_bucket_lists_an_object_whose_bytes_are_not_its_address(
        s3, s3_store, tmp_path):
    (tmp_path / "a").write_bytes(CONTENT)
    (tmp_path / "b").write_bytes(CONTENT[::-1])
    intact, tampered = (s3_store.put_file(tmp_path / name).sha256 for name in ("a", "b"))
    s3.client().put_object(Bucket=s3.bucket, Key=s3_store.key(tampered), Body=b"tampered")
    s3_store.cache.discard([tampered])
    local = LocalStore(tmp_path / "local")
    report = migrate_store(source=s3_store, target=local, progress=lambda *_: None)
    assert (report.copied, report.corrupt) == ([intact], [tampered])
    assert list(local.addresses()) == [intact]


def test_a_streamed_body_is_stored_only_once_put(s3, s3_store, s3_prefix):
    async def body():
        for start in range(0, len(CONTENT), 1 << 20):
            yield CONTENT[start:start + (1 << 20)]

    async def receive():
        async with s3_store.receive(body(), filename="x", max_bytes=len(CONTENT)) as staged:
            assert s3.keys(s3_prefix) == []  # nothing visible before it is put
            assert s3.incomplete_uploads(s3_prefix) == [staged.key]
            s3_store.put_staged(staged)
        return staged

    staged = asyncio.run(receive())
    assert staged.head == CONTENT[:len(staged.head)] and staged.size == len(CONTENT)
    assert s3.keys(s3_prefix) == [s3_store.key(staged.sha256)]
    assert s3.incomplete_uploads(s3_prefix) == []


def test_the_same_body_streamed_to_two_servers_at_once_is_one_object(s3, s3_store, s3_settings,
                                                                     s3_prefix, tmp_path):
    """Two API processes (here two stores of one bucket, on two threads) receiving the same
    bytes at the same moment: both copies are conditional, so one object is stored."""
    stores, start = [s3_store, another_host(s3_settings, tmp_path)], threading.Barrier(2)
    staged = []

    async def body():
        yield CONTENT

    async def receive(store) -> None:
        async with store.receive(body(), filename="x", max_bytes=len(CONTENT)) as upload:
            await asyncio.to_thread(start.wait)
            store.put_staged(upload)
            staged.append(upload.sha256)

    threads = [threading.Thread(target=asyncio.run, args=(receive(store),)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(staged) == 2 and staged[0] == staged[1]
    assert s3.keys(s3_prefix) == [s3_store.key(staged[0])]
    assert s3.incomplete_uploads(s3_prefix) == []


def test_the_documented_lifecycle_rule_ends_every_unfinished_upload_and_expires_only_staging():
    """docs/operations.md's rule covers every area multipart uploads are written under."""
    rule = re.search(r"```json\n(\{\"Rules\".*?)\n```", OPERATIONS.read_text(), re.DOTALL)
    rules = json.loads(rule.group(1))["Rules"]
    aborting = [each["Filter"]["Prefix"] for each in rules
                if "AbortIncompleteMultipartUpload" in each]
    for area in MULTIPART_AREAS:
        assert any(f"PREFIX/{area}".startswith(prefix) for prefix in aborting), area
    assert [each["Filter"]["Prefix"] for each in rules if "Expiration" in each] == [
        "PREFIX/staging/"]
