"""The content-addressed artifact store: the interface on both back-ends (the local folder
and a real S3 server), then what is particular to each."""

import hashlib
import io
import threading

import numpy as np
import pytest

from service.config import Settings
from service.errors import InvalidInput, NotFound, PayloadTooLarge
from service.storage import LocalStore, bundle_sha256, open_store

CONTENT = bytes(range(256)) * 12_000  # 3 MB: several chunks


def stored_files(store: LocalStore) -> list:
    return sorted(path for path in store.root.rglob("*") if path.is_file())


def test_the_store_lives_in_the_data_dir(tmp_path):
    store = open_store(Settings(data_dir=tmp_path))
    artifact = store.put_stream(io.BytesIO(b"model"))
    assert store.path(artifact.sha256).is_relative_to(tmp_path / "artifacts" / "sha256")


def test_files_are_addressed_by_their_sha256(each_store):
    artifact = each_store.put_stream(io.BytesIO(CONTENT), max_bytes=len(CONTENT))
    digest = hashlib.sha256(CONTENT).hexdigest()
    assert (artifact.sha256, artifact.size) == (digest, len(CONTENT))
    assert list(each_store.addresses()) == [digest]
    with each_store.open(digest) as readable:
        assert readable.read() == CONTENT


def test_the_local_layout_is_sha256_ab_cdef(store):
    digest = store.put_stream(io.BytesIO(CONTENT)).sha256
    assert store.path(digest) == store.root / digest[:2] / digest[2:]


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
    with pytest.raises(NotFound):
        each_store.open("0" * 64)


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
    files = {"model.onnx": tmp_path / "m.onnx", "model.onnx.data": tmp_path / "d"}
    files["model.onnx"].write_bytes(b"graph")
    files["model.onnx.data"].write_bytes(b"weights")
    sha256 = bundle_sha256(files)
    each_store.put_bundle(files, sha256)
    assert each_store.exists(sha256) and each_store.model_path(sha256).read_bytes() == b"graph"
    assert (each_store.model_path(sha256).parent / "model.onnx.data").read_bytes() == b"weights"
    files["model.onnx.data"].write_bytes(b"other weights")
    assert bundle_sha256(files) != sha256
    assert sha256 in set(each_store.addresses())
    each_store.remove([sha256])
    assert not each_store.exists(sha256) and list(each_store.addresses()) == []


def test_a_stored_array_reads_memory_mapped(each_store, tmp_path):
    array = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "a.npy", array)
    sha256 = each_store.put_file(tmp_path / "a.npy").sha256
    loaded = np.load(each_store.local_path(sha256), mmap_mode="r")
    assert isinstance(loaded, np.memmap) and (loaded == array).all()
