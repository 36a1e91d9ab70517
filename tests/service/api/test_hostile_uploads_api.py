"""Hostile and careless uploads: each refused with its 4xx code, nothing stored in the
database or the artifact store, and no server path in the message."""

import io
import json
import re
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from service.registry.router import METADATA_MAX_CHARS
from tests.conftest import linear_onnx
from tests.service.api.conftest import (
    both_ways,
    error_code,
    npy_bytes,
    post_evalset,
    post_model,
    put_evalset,
    put_model,
)

send_model = both_ways(post_model, put_model)  # every upload here, both ways


@pytest.fixture
def send_evalset(send_model):
    """Eval sets go the way models go."""
    return put_evalset if send_model is put_model else post_evalset


def stored_files(client) -> list[Path]:
    """Every file of the artifact store (the staging folder included)."""
    root = client.app.state.settings.artifacts_dir
    return sorted(path for path in root.rglob("*") if path.is_file()) if root.exists() else []


def state(client) -> tuple:
    """What a refused request must leave as it was: the store's files and the API's view."""
    return (stored_files(client), client.get("/models").json(),
            client.get("/evalsets").json())


@pytest.fixture
def line(client, upload_model, upload_evalset, npz_file) -> dict:
    assert upload_model("digits", "1").status_code == 201
    assert upload_evalset("eval", npz_file(n=30)).status_code == 201
    return {"files": len(stored_files(client))}


def refused(client, response, status: int, code: str, before: tuple) -> str:
    """Check the refusal and that nothing changed; the message, for further checks."""
    assert error_code(response, status) == code
    assert state(client) == before
    return response.json()["error"]["message"]


@pytest.mark.parametrize(("fields", "status", "code"), [
    ({"version": "1"}, 409, "version_exists"),
    ({"version": "2", "parent": "digits:9"}, 404, "version_not_found"),
    ({"version": "2", "parent": "no reference"}, 422, "invalid_reference"),
])
def test_a_refused_version_leaves_nothing_in_the_store(client, line, upload_model, fields,
                                                       status, code):
    before = state(client)
    refused(client, upload_model("digits", seed=7, **fields), status, code, before)


def test_a_refused_eval_set_leaves_nothing_in_the_store(client, line, upload_evalset, npz_file):
    before = state(client)
    refused(client, upload_evalset("eval", npz_file(n=12, seed=3)), 409, "dataset_exists",
            before)


def test_refused_logits_leave_nothing_in_the_store(client, line, upload_logits):
    assert upload_logits("digits:1", "eval", np.zeros((30, 3), np.float32)).status_code == 201
    before = state(client)
    refused(client, upload_logits("digits:1", "eval", np.ones((30, 3), np.float32)), 409,
            "predictions_exist", before)
    refused(client, upload_logits("digits:1", "eval", np.ones((29, 3), np.float32)), 422,
            "logits_shape", before)


def test_messages_name_the_upload_never_a_server_path(client, line):
    before = state(client)
    response = client.post("/evalsets", data={"name": "broken"},
                           files={"data": ("../../etc/eval.npz", b"PK\3\4 truncated")})
    message = refused(client, response, 422, "evalset_corrupt", before)
    assert message.startswith("data (eval.npz): ")
    assert str(client.app.state.settings.data_dir.resolve().parent) not in message
    response = client.post("/models", data={"name": "digits", "version": "3"},
                           files={"artifact": ("m.onnx", b"not a model")})
    assert refused(client, response, 422, "onnx_corrupt", before).startswith("artifact (m.onnx)")


def test_a_compressed_eval_set_that_expands_past_the_limit_is_422(client, line, tmp_path):
    client.app.state.settings.max_decompressed_mb = 1
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=np.zeros((4096, 128), np.float32), y=np.zeros(4096, int))
    before = state(client)
    response = client.post("/evalsets", data={"name": "bomb"},
                           files={"data": ("bomb.npz", buffer.getvalue())})
    refused(client, response, 422, "evalset_too_large", before)


READABLE_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)


def npz_with_method(method: int) -> bytes:
    """An eval set whose members are compressed with zip `method` (stored bytes relabelled
    when zipfile cannot write the method, as a hostile or exotic archiver would)."""
    buffer = io.BytesIO()
    writable = method if method in READABLE_METHODS else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer, "w", compression=writable) as archive:
        for name, array in {"x": np.ones((8, 2), np.float32), "y": np.arange(8) % 3}.items():
            archive.writestr(f"{name}.npy", npy_bytes(array))
    content = buffer.getvalue()
    if method != writable:  # the method field of each local and central header
        content = re.sub(rb"(PK\x03\x04.{4})\x00\x00|(PK\x01\x02.{6})\x00\x00",
                         lambda hit: (hit.group(1) or hit.group(2)) + struct.pack("<H", method),
                         content, flags=re.DOTALL)
    return content


@pytest.mark.parametrize("method", READABLE_METHODS)
def test_eval_sets_in_every_method_zipfile_reads_are_taken(client, line, method):
    response = client.post("/evalsets", data={"name": f"m{method}"},
                           files={"data": ("m.npz", npz_with_method(method))})
    assert response.status_code == 201, response.text


def test_an_eval_set_compressed_by_an_unreadable_method_is_422_naming_member_and_method(
        client, line):
    before = state(client)
    response = client.post("/evalsets", data={"name": "exotic"},
                           files={"data": ("exotic.npz", npz_with_method(99))})
    message = refused(client, response, 422, "npz_compression", before)
    assert "'x.npy'" in message and "method 99" in message


@pytest.mark.parametrize(("arrays", "code"), [
    ({"x": np.zeros((4, 0), np.float32), "y": np.zeros(4, int)}, "empty_samples"),
    ({"x": np.zeros((2, 4), np.float32), "y": np.array([0, 1 << 62])}, "labels_out_of_range"),
])
def test_empty_samples_and_absurd_labels_are_422(client, line, arrays, code):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    before = state(client)
    response = client.post("/evalsets", data={"name": "bad"},
                           files={"data": ("bad.npz", buffer.getvalue())})
    refused(client, response, 422, code, before)


def test_logits_with_an_object_header_are_422(client, line):
    before = state(client)
    response = client.post("/models/digits/versions/1/predictions", data={"evalset": "eval"},
                           files={"logits": ("l.npy", npy_bytes(np.array([None], object)))})
    refused(client, response, 422, "object_array", before)


@pytest.mark.parametrize("metadata", [
    '{"score": NaN}', '{"score": Infinity}', '{"owner": "a\\u0000b"}', '{"a\\u0000": 1}',
    "[" * 900 + "]" * 900, '{"a": ' * 40 + "1" + "}" * 40, '["not an object"]',
])
def test_hostile_metadata_is_422(client, line, upload_model, metadata):
    before = state(client)
    refused(client, upload_model("digits", "2", seed=2, metadata=metadata), 422,
            "invalid_metadata", before)


def test_metadata_over_the_limit_is_422(client, line, onnx_file):
    """By POST only: a query that long does not fit in a URL (httpx stops at 64 KiB)."""
    metadata = json.dumps({"x": "y" * METADATA_MAX_CHARS})
    before = state(client)
    refused(client, post_model(client, "digits", "2", onnx_file(3, 2).read_bytes(),
                               metadata=metadata), 422, "invalid_metadata", before)


def test_a_version_with_another_input_shape_is_refused(client, line, tmp_path):
    other = linear_onnx(tmp_path / "wide.onnx", np.ones((8, 3)), np.zeros(3), ("N", 8))
    before = state(client)
    response = client.post("/models", data={"name": "digits", "version": "2"},
                           files={"artifact": ("wide.onnx", other.read_bytes())})
    message = refused(client, response, 422, "input_signature_mismatch", before)
    assert "'x'" in message and "(N, 4)" in message and "(N, 8)" in message
