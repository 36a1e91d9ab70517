"""The content-addressed artifact store."""

import hashlib
import io
import threading

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


def test_files_are_addressed_by_their_sha256(store):
    artifact = store.put_stream(io.BytesIO(CONTENT), max_bytes=len(CONTENT))
    digest = hashlib.sha256(CONTENT).hexdigest()
    assert (artifact.sha256, artifact.size) == (digest, len(CONTENT))
    assert store.path(digest) == store.root / digest[:2] / digest[2:]
    with store.open(digest) as readable:
        assert readable.read() == CONTENT


def test_the_same_content_twice_is_one_file(store):
    first = store.put_stream(io.BytesIO(b"logits"))
    assert store.put_stream(io.BytesIO(b"logits")) == first
    assert stored_files(store) == [store.path(first.sha256)]


def test_uploads_over_the_limit_leave_nothing_behind(store):
    with pytest.raises(PayloadTooLarge) as refused:
        store.put_stream(io.BytesIO(CONTENT), max_bytes=len(CONTENT) - 1)
    assert refused.value.status_code == 413
    assert stored_files(store) == []


@pytest.mark.parametrize("sha256", ["../" * 21 + "a", "A" * 64, "a" * 63, "g" * 64, None])
def test_malformed_digests_are_refused(store, sha256):
    with pytest.raises(InvalidInput):
        store.path(sha256)


def test_missing_artifacts_are_not_found(store):
    assert not store.exists("0" * 64)
    with pytest.raises(NotFound):
        store.open("0" * 64)


def test_concurrent_puts_of_the_same_content_end_with_one_intact_file(store):
    start, results = threading.Barrier(8), []

    def put() -> None:
        start.wait()
        results.append(store.put_stream(io.BytesIO(CONTENT)))

    threads = [threading.Thread(target=put) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and len(results) == 8
    assert stored_files(store) == [store.path(results[0].sha256)]
    assert store.path(results[0].sha256).read_bytes() == CONTENT


def test_a_bundle_is_one_address_for_a_model_and_its_data(store, tmp_path):
    files = {"model.onnx": tmp_path / "m.onnx", "model.onnx.data": tmp_path / "d"}
    files["model.onnx"].write_bytes(b"graph")
    files["model.onnx.data"].write_bytes(b"weights")
    sha256 = bundle_sha256(files)
    store.put_bundle(files, sha256)
    assert store.exists(sha256) and store.model_path(sha256).read_bytes() == b"graph"
    assert (store.model_path(sha256).parent / "model.onnx.data").read_bytes() == b"weights"
    files["model.onnx.data"].write_bytes(b"other weights")
    assert bundle_sha256(files) != sha256
    assert sha256 in set(store.addresses())
    store.remove([sha256])
    assert not store.exists(sha256) and stored_files(store) == []
