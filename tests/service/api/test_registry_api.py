"""Registering and reading model versions over HTTP."""

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from tests.service.api.conftest import both_ways, error_code, post_model, put_model

send_model = both_ways(post_model, put_model)  # every registration here, both ways


def test_registration_creates_the_line_and_returns_the_version(client, upload_model):
    response = upload_model("digits", "1.0", metadata=json.dumps({"owner": "vision"}))
    assert response.status_code == 201, response.text
    record = response.json()
    assert (record["version"], record["num_classes"]) == ("1.0", 3)
    assert record["input_shape"] == [None, 4]
    assert record["metadata"] == {"owner": "vision"} and len(record["artifact_sha256"]) == 64
    child = upload_model("digits", "1.1", seed=1, parent="digits:1.0").json()
    assert child["parent_id"] == record["id"]


def test_a_parent_must_be_a_version_of_the_same_line(client, upload_model):
    assert upload_model("letters", "0.1").status_code == 201
    assert upload_model("digits", "1.0").status_code == 201
    refused = upload_model("digits", "1.1", seed=1, parent="letters:0.1")
    assert error_code(refused, 422) == "parent_not_in_line"
    fresh_line = upload_model("symbols", "1", parent="digits:1.0")  # nor of a line it starts
    assert error_code(fresh_line, 422) == "parent_not_in_line"
    assert [version["version"] for version in client.get("/models/digits").json()[
        "versions"]] == ["1.0"]
    assert client.get("/models/symbols").status_code == 404


def test_a_parent_may_be_named_by_its_bare_version(client, upload_model):
    """docs/server.md: `parent` is "a version of the same line", named with or without it."""
    first = upload_model("digits", "1").json()
    second = upload_model("digits", "2", seed=1, parent="1")
    assert second.status_code == 201, second.text
    assert second.json()["parent_id"] == first["id"]
    external = client.post("/models", data={"name": "digits", "version": "3", "parent": "2"})
    assert external.status_code == 201, external.text
    assert external.json()["parent_id"] == second.json()["id"]
    assert error_code(upload_model("digits", "4", parent="9"), 404) == "version_not_found"


def test_lines_and_versions_are_listed_and_read(client, upload_model):
    first = upload_model("digits", "1.0").json()
    upload_model("digits", "1.1", seed=1)
    upload_model("letters", "0.1", num_classes=5)
    assert [line["name"] for line in client.get("/models").json()] == ["digits", "letters"]
    detail = client.get("/models/digits").json()
    assert detail["line"]["num_classes"] == 3 and detail["aliases"] == []
    assert [version["version"] for version in detail["versions"]] == ["1.0", "1.1"]
    assert client.get("/models/digits/versions/1.0").json() == first
    assert error_code(client.get("/models/digits/versions/9"), 404) == "version_not_found"


def test_the_same_version_twice_is_409(upload_model):
    upload_model("digits", "1.0")
    assert error_code(upload_model("digits", "1.0", seed=1), 409) == "version_exists"


@pytest.mark.parametrize(("fields", "content", "code"), [
    ({}, b"\x08\x07not an onnx model", "onnx_corrupt"),
    ({"metadata": "[1, 2]"}, None, "invalid_metadata"),
    ({"version": "bad version"}, None, "invalid_version"),
])
def test_refused_registrations_are_422_and_store_nothing(client, settings, upload_model,
                                                          fields, content, code):
    response = upload_model(**{"name": "digits", "version": "1.0", **fields}, content=content)
    assert error_code(response, 422) == code
    assert client.get("/models").json() == []
    assert not list((settings.artifacts_dir / "sha256").glob("*/*"))


def test_a_missing_form_field_is_422_in_the_same_shape(client):
    assert error_code(client.post("/models", data={"name": "digits"}), 422) == "invalid_request"


@pytest.fixture
def one_mb_client(client, settings) -> Iterator[TestClient]:
    """A client of an app created with a 1 MiB upload limit, in the same test transaction."""
    app = create_app(settings.model_copy(update={"max_upload_mb": 1}))
    app.state.sessions = app.state.readers = client.app.state.sessions
    with TestClient(app, headers=client.headers) as small:
        yield small


@pytest.mark.parametrize(("size_mb", "message"), [(1.5, "upload is larger than the limit"),
                                                  (3, "request body is larger")])
def test_an_upload_over_the_limit_is_413_and_stores_nothing(settings, one_mb_client, size_mb,
                                                            message):
    """1.5 MiB passes the body limit (file + form overhead) but not the file limit; 3 MiB is
    stopped while the body is read."""
    response = one_mb_client.post("/models", data={"name": "digits", "version": "1.0"},
                                  files={"artifact": ("m.onnx", b"\0" * int(size_mb * 2**20))})
    assert error_code(response, 413) == "payload_too_large"
    assert message in response.json()["error"]["message"].lower()
    assert one_mb_client.get("/models").json() == []
    assert not [path for path in settings.data_dir.rglob("*") if path.is_file()]
