"""GET /models/{name}/versions/{version}/artifact: the exact model a version registered, on
the local store and on an S3 store (a real SeaweedFS)."""

import hashlib
import io
import tarfile

import onnx
import pytest

from service.storage import bundle_sha256
from tests.service.api.conftest import error_code, post_model, store_settings
from tests.service.api.test_model_zip_api import zipped


@pytest.fixture(params=["local", "s3"])
def settings(request, engine, tmp_path):
    local = store_settings(engine, tmp_path)
    if request.param == "local":
        return local
    s3 = request.getfixturevalue("s3_settings")
    return local.model_copy(update={"artifact_store": s3.artifact_store})


def fresh_cache(client) -> None:
    """Forget what the server's cache holds (another API host would not have it)."""
    store = client.app.state.store
    if hasattr(store, "cache"):
        store.cache.discard(list(store.addresses()))


def test_a_versions_onnx_is_given_back_byte_for_byte(client, onnx_file):
    content = onnx_file().read_bytes()
    assert post_model(client, "digits", "1.0", content).status_code == 201
    fresh_cache(client)
    response = client.get("/models/digits/versions/1.0/artifact")
    assert response.status_code == 200 and response.content == content
    assert response.headers["x-flipgate-sha256"] == hashlib.sha256(content).hexdigest()
    assert 'filename="digits-1.0.onnx"' in response.headers["content-disposition"]


def test_a_model_with_external_data_is_given_back_as_its_bundle(client, onnx_file, tmp_path):
    model = onnx.load(onnx_file())
    folder = tmp_path / "exported"
    folder.mkdir()
    onnx.save_model(model, folder / "model.onnx", save_as_external_data=True,
                    location="model.onnx.data", size_threshold=0)
    files = {path.name: path.read_bytes() for path in folder.iterdir()}
    registered = client.post("/models", data={"name": "digits", "version": "1.0"},
                             files={"artifact": ("model.zip", zipped(files))})
    assert registered.status_code == 201, registered.text
    fresh_cache(client)
    response = client.get("/models/digits/versions/1.0/artifact")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(response.content)) as archive:
        members = archive.getmembers()
        given = {member.name: archive.extractfile(member).read() for member in members}
    assert [member.name for member in members] == ["model.onnx", "model.onnx.data"]
    assert given == files
    for name, content in given.items():
        (tmp_path / name).write_bytes(content)
    address = bundle_sha256({name: tmp_path / name for name in given})
    assert response.headers["x-flipgate-sha256"] == address == registered.json()[
        "artifact_sha256"]


def test_an_external_version_has_no_model(client):
    registered = client.post("/models", data={"name": "wine", "version": "1",
                                              "num_classes": "3"})
    assert registered.status_code == 201, registered.text
    response = client.get("/models/wine/versions/1/artifact")
    assert error_code(response, 404) == "version_has_no_model"
    assert error_code(client.get("/models/wine/versions/2/artifact"), 404) == (
        "version_not_found")
