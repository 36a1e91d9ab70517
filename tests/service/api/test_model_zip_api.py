"""POST /models with a .zip: a model exported by torch.onnx.export's defaults (model.onnx
beside model.onnx.data) is stored with its data and scored by the worker; hostile archives
are refused before anything is unpacked, and nothing is stored."""

import io
import zipfile
from pathlib import Path

import pytest

from tests.service.api.conftest import error_code, measure, put_model
from tests.service.api.test_hostile_uploads_api import state


def zipped(files: dict[str, bytes], *, links: tuple[str, ...] = ()) -> bytes:
    """A .zip of `files` by their member names; those in `links` are marked as symlinks."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if name in links:
                info.external_attr = 0o120777 << 16
            archive.writestr(info, content)
    return buffer.getvalue()


def model_zip(onnx_path: Path) -> bytes:
    """A model folder as `torch.onnx.export` left it, zipped flat."""
    return zipped({path.name: path.read_bytes() for path in onnx_path.parent.iterdir()})


def post_model(client, version: str, content: bytes):
    return client.post("/models", data={"name": "digits", "version": version},
                       files={"artifact": ("model.zip", content)})


def test_a_zipped_torch_export_is_stored_with_its_data_and_scored(client, settings,
                                                                   torch_export_pair,
                                                                   upload_evalset):
    pair = torch_export_pair
    for version, path in (("1", pair.old_onnx), ("2", pair.new_onnx)):
        assert post_model(client, version, model_zip(path)).status_code == 201
    stored = client.get("/models/digits/versions/1").json()
    bundle = settings.artifacts_dir / "sha256" / stored["artifact_sha256"][:2] \
        / stored["artifact_sha256"][2:]
    assert sorted(p.name for p in bundle.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert upload_evalset("eval", pair.evalset_path).status_code == 201
    report = measure(client, "digits:1", "digits:2", "eval")
    old, new, y = pair.old_logits.argmax(1), pair.new_logits.argmax(1), pair.evalset.y
    assert report["negative_flips"] == int(((old == y) & (new != y)).sum())
    assert report["positive_flips"] == int(((old != y) & (new == y)).sum())
    assert report["churn"] == pytest.approx(float((old != new).mean()))


def test_the_same_zip_twice_is_one_artifact(client, torch_export_pair):
    """Once as a multipart POST, once as the raw body of a PUT."""
    content = model_zip(torch_export_pair.old_onnx)
    first = post_model(client, "1", content)
    second = put_model(client, "digits", "2", content)
    assert first.status_code == second.status_code == 201, second.text
    assert first.json()["artifact_sha256"] == second.json()["artifact_sha256"]


def hostile_archives(onnx_path: Path) -> dict[str, tuple[bytes, str]]:
    model = onnx_path.read_bytes()
    data = (onnx_path.parent / "model.onnx.data").read_bytes()
    return {
        "parent folder": (zipped({"model.onnx": model, "../model.onnx.data": data}),
                          "model_zip_path"),
        "absolute path": (zipped({"model.onnx": model, "/tmp/model.onnx.data": data}),
                          "model_zip_path"),
        "sub-folder": (zipped({"model.onnx": model, "weights/model.onnx.data": data}),
                       "model_zip_path"),
        "link": (zipped({"model.onnx": model, "model.onnx.data": b"/etc/passwd"},
                        links=("model.onnx.data",)), "model_zip_member_type"),
        "missing data": (zipped({"model.onnx": model}), "model_zip_missing_data"),
        "extra file": (zipped({"model.onnx": model, "model.onnx.data": data, "x.sh": b"rm"}),
                       "model_zip_extra_files"),
        "two models": (zipped({"a.onnx": model, "b.onnx": model, "model.onnx.data": data}),
                       "model_zip_onnx_count"),
        "bomb": (zipped({"model.onnx": model, "model.onnx.data": bytes(4 << 20)}),
                 "model_zip_too_large"),
        "not a zip": (b"PK\x03\x04 and then nothing", "model_zip_corrupt"),
    }


@pytest.fixture
def small_unpack_limit(client, monkeypatch):
    """Unpacked models of at most 1 MiB, so that a small zip bomb's claim is over the limit."""
    monkeypatch.setattr(type(client.app.state.settings), "max_decompressed_bytes",
                        property(lambda _: 1 << 20))


@pytest.mark.parametrize("case", ["parent folder", "absolute path", "sub-folder", "link",
                                  "missing data", "extra file", "two models", "bomb",
                                  "not a zip"])
def test_hostile_zips_are_422_and_store_nothing(client, torch_export_pair, small_unpack_limit,
                                                case):
    content, code = hostile_archives(torch_export_pair.old_onnx)[case]
    before = state(client)
    assert error_code(post_model(client, "1", content), 422) == code
    assert state(client) == before
