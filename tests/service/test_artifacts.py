"""The content-addressed artifact store's contract, one suite run against both back-ends
(`each_store`: the local folder and a real S3 server): put, get, open and range reads,
bundles, delete, list, staged uploads and their abort; then what is particular to the local
folder (tests/service/test_s3_store.py has the bucket's)."""

import asyncio
import hashlib
import io
import threading

import numpy as np
import pytest

from service.config import Settings
from service.errors import InvalidInput, NotFound, PayloadTooLarge
from service.storage import bundle_sha256, open_store
from service.storage.bundle import bundle_chunks
from tests.service.conftest import bundle_files

CONTENT = bytes(range(256)) * 12_000  # 3 MB: several chunks
DIGEST = hashlib.sha256(CONTENT).hexdigest()
BEFORE_FAILING = 20 << 20  # what a broken body sends first: more than two parts of a bucket


async def body(content: bytes, fail: bool = False):
    """A request body of `content` in megabyte chunks; with `fail`, one that breaks off."""
    for start in range(0, len(content), 1 << 20):
        yield content[start:start + (1 << 20)]
    if fail:
        raise ConnectionResetError("the client went away")


def test_files_are_addressed_by_their_sha256(each_store):
    artifact = each_store.put_stream(io.BytesIO(CONTENT), max_bytes=len(CONTENT))
    assert (artifact.sha256, artifact.size) == (DIGEST, len(CONTENT))
    assert list(each_store.addresses()) == [DIGEST]
    with each_store.open(DIGEST) as readable:
        assert readable.read() == CONTENT


def test_an_artifact_is_read_from_any_offset(each_store):
    each_store.put_stream(io.BytesIO(CONTENT))
    with each_store.open(DIGEST) as readable:
        readable.seek(1_500_001)
        assert readable.read(1000) == CONTENT[1_500_001:1_501_001]
        readable.seek(-10, io.SEEK_END)
        assert readable.read() == CONTENT[-10:]


def test_the_same_content_twice_is_one_artifact(each_store):
    first = each_store.put_stream(io.BytesIO(b"logits"))
    assert each_store.put_stream(io.BytesIO(b"logits")) == first
    assert list(each_store.addresses()) == [first.sha256]


def test_uploads_over_the_limit_leave_nothing_behind(each_store):
    with pytest.raises(PayloadTooLarge) as refused:
        each_store.put_stream(io.BytesIO(CONTENT), max_bytes=len(CONTENT) - 1)
    assert refused.value.status_code == 413
    assert list(each_store.addresses()) == []


@pytest.mark.parametrize("sha256", ["../" * 21 + "a", "A" * 64, "a" * 63, "g" * 64, None])
def test_malformed_digests_are_refused(each_store, sha256):
    with pytest.raises(InvalidInput):
        each_store.local_path(sha256)


def test_missing_artifacts_are_not_found(each_store):
    assert not each_store.exists("0" * 64)
    for read in (each_store.open, each_store.local_path, each_store.is_bundle,
                 each_store.bundle_tar):
        with pytest.raises(NotFound):
            read("0" * 64)


def test_concurrent_puts_of_the_same_content_end_with_one_intact_artifact(each_store):
    start, results = threading.Barrier(8), []

    def put() -> None:
        start.wait()
        results.append(each_store.put_stream(io.BytesIO(CONTENT)))

    threads = [threading.Thread(target=put) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and len(results) == 8
    assert list(each_store.addresses()) == [results[0].sha256]
    assert each_store.local_path(results[0].sha256).read_bytes() == CONTENT


def test_a_bundle_is_one_address_for_a_model_and_its_data(each_store, tmp_path):
    files = bundle_files(tmp_path)
    sha256 = bundle_sha256(files)
    each_store.put_bundle(files, sha256)
    assert each_store.exists(sha256) and each_store.model_path(sha256).read_bytes() == b"graph"
    assert (each_store.model_path(sha256).parent / "model.onnx.data").read_bytes() == b"weights"
    files["model.onnx.data"].write_bytes(b"other weights")
    assert bundle_sha256(files) != sha256
    assert sha256 in set(each_store.addresses())
    each_store.remove([sha256])
    assert not each_store.exists(sha256) and list(each_store.addresses()) == []


def test_a_bundle_is_given_as_the_same_tar_by_either_back_end(each_store, tmp_path):
    files = bundle_files(tmp_path)
    sha256 = bundle_sha256(files)
    each_store.put_bundle(files, sha256)
    plain = each_store.put_stream(io.BytesIO(CONTENT)).sha256
    assert each_store.is_bundle(sha256) and not each_store.is_bundle(plain)
    assert b"".join(each_store.bundle_tar(sha256)) == b"".join(bundle_chunks(files))
    with pytest.raises(NotFound):
        each_store.bundle_tar(plain)


def test_deleted_artifacts_leave_the_listing(each_store, tmp_path):
    kept = each_store.put_stream(io.BytesIO(b"kept")).sha256
    gone = each_store.put_stream(io.BytesIO(b"gone")).sha256
    assert {sha256 for sha256, _ in each_store.entries()} == {kept, gone}
    each_store.remove([gone])
    assert list(each_store.addresses()) == [kept]
    assert not each_store.exists(gone) and each_store.exists(kept)


def test_a_stored_array_reads_memory_mapped(each_store, tmp_path):
    array = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "a.npy", array)
    sha256 = each_store.put_file(tmp_path / "a.npy").sha256
    loaded = np.load(each_store.local_path(sha256), mmap_mode="r")
    assert isinstance(loaded, np.memmap) and (loaded == array).all()


@pytest.mark.parametrize("declared", [None, DIGEST])
def test_a_received_body_is_stored_at_its_digest_only_once_put(each_store, declared):
    async def receive():
        async with each_store.receive(body(CONTENT), filename="body.npy",
                                      max_bytes=len(CONTENT), declared=declared) as staged:
            assert not each_store.exists(DIGEST)  # nothing is stored before it is put
            each_store.put_staged(staged)
        return staged

    staged = asyncio.run(receive())
    assert (staged.sha256, staged.size) == (DIGEST, len(CONTENT))
    assert list(each_store.addresses()) == [DIGEST]
    with each_store.open(DIGEST) as readable:
        assert readable.read() == CONTENT
    assert each_store.sweep_partial(0) == []  # nothing of the upload is left over


@pytest.mark.parametrize("ending", ["body breaks off", "not put", "another digest declared"])
def test_an_upload_not_put_is_aborted_and_leaves_nothing(each_store, ending):
    content = CONTENT if ending != "body breaks off" else bytes(BEFORE_FAILING)
    declared = "0" * 64 if ending == "another digest declared" else None

    async def receive():
        async with each_store.receive(body(content, fail=ending == "body breaks off"),
                                      filename="body.npy", max_bytes=1 << 30,
                                      declared=declared):
            pass

    expected = {"body breaks off": ConnectionResetError, "not put": None,
                "another digest declared": InvalidInput}[ending]
    if expected is None:
        asyncio.run(receive())
    else:
        with pytest.raises(expected):
            asyncio.run(receive())
    assert list(each_store.addresses()) == []
    assert each_store.sweep_partial(0) == []  # no staging file, object or multipart upload


def test_a_staged_form_upload_is_stored_by_put_staged(each_store):
    with each_store.stage(io.BytesIO(CONTENT), filename="data.npz",
                          max_bytes=len(CONTENT)) as staged:
        assert staged.path.read_bytes() == CONTENT and not each_store.exists(DIGEST)
        each_store.put_staged(staged)
    assert list(each_store.addresses()) == [DIGEST]
    assert each_store.sweep_partial(0) == []


def test_the_store_lives_in_the_data_dir(tmp_path):
    store = open_store(Settings(data_dir=tmp_path))
    artifact = store.put_stream(io.BytesIO(b"model"))
    assert store.path(artifact.sha256).is_relative_to(tmp_path / "artifacts" / "sha256")


def test_the_local_layout_is_sha256_ab_cdef(store):
    digest = store.put_stream(io.BytesIO(CONTENT)).sha256
    assert store.path(digest) == store.root / digest[:2] / digest[2:]
