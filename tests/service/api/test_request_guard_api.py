"""Hostile scalars (issue 12): integers out of range in paths and query strings, and NUL bytes
anywhere in a request, answer 422 with a machine-readable code, never 500, and store nothing
(on SQLite and PostgreSQL)."""

import inspect
import json
import re
import time

import pytest
from fastapi.testclient import TestClient

from service.ui.router import router as dashboard
from tests.service.api.conftest import error_code

INT32_MAX = 2**31 - 1
TOO_LARGE = [2**31, 2**63, 10**30]


@pytest.mark.parametrize("value", TOO_LARGE)
@pytest.mark.parametrize("path", ["/jobs/{}", "/gate/decisions/{}", "/jobs/{}/cancel"])
def test_ids_above_the_32_bit_range_are_422(client, path, value):
    method = client.post if path.endswith("cancel") else client.get
    assert error_code(method(path.format(value)), 422) == "out_of_range"


@pytest.mark.parametrize("value", [INT32_MAX, -1, 0, -(2**31)])
def test_ids_inside_the_range_are_looked_up(client, value):
    assert error_code(client.get(f"/jobs/{value}"), 404) == "job_not_found"


def test_query_integers_out_of_range_are_422(client, upload_model):
    assert upload_model("digits", "1").status_code == 201
    for value in (2**31, -(2**31) - 1, 2**63):
        decisions = client.get("/models/digits/decisions", params={"before": value})
        assert error_code(decisions, 422) == "out_of_range"
        policy = client.get("/models/digits/policy", params={"version": value})
        assert error_code(policy, 422) == "out_of_range"
    assert client.get("/models/digits/decisions", params={"before": INT32_MAX}).json() == []


def integer_parameters(app) -> list[tuple[str, str, str, str]]:
    """(method, path, "path" or "query", name) of every integer parameter a client can send:
    those the app's OpenAPI document lists, and the dashboard's (its pages are left out of
    the document), read from their endpoints' signatures."""
    found = [(method.upper(), path, parameter["in"], parameter["name"])
             for path, operations in app.openapi()["paths"].items()
             for method, operation in operations.items()
             for parameter in operation.get("parameters", [])
             if '"integer"' in json.dumps(parameter["schema"])]
    for route in dashboard.routes:
        found += [(method, route.path_format, "path" if name in route.param_convertors
                   else "query", name)
                  for name, parameter in inspect.signature(route.endpoint).parameters.items()
                  if parameter.annotation in (int, int | None) for method in route.methods]
    return found


def test_every_integer_parameter_is_checked(client):
    """A route added with an integer parameter gets the check without being listed."""
    parameters = integer_parameters(client.app)
    assert {(path, name) for _method, path, _in, name in parameters} >= {
        ("/jobs/{job_id}", "job_id"), ("/models/{name}/decisions", "before"),
        ("/ui/decisions/{decision_id}", "decision_id"), ("/ui/lines/{name}", "page")}
    escaped = []
    for method, path, where, name in parameters:
        address = path.replace(f"{{{name}}}", str(2**31)) if where == "path" else path
        address = re.sub(r"{\w+}", "x", address)
        query = {name: 2**31} if where == "query" else {}
        response = client.request(method, address, params=query)
        if response.status_code != 422 or response.json()["error"]["code"] != "out_of_range":
            escaped.append((method, path, name, response.status_code))
    assert not escaped


def test_text_that_is_no_integer_keeps_its_own_validation_error(client):
    assert error_code(client.get("/jobs/twelve"), 422) == "invalid_request"


def test_a_nul_byte_in_the_path_is_422(client, upload_model):
    assert upload_model("digits", "1").status_code == 201
    assert error_code(client.get("/models/digits%00"), 422) == "nul_byte"
    assert error_code(client.get("/models/digits/versions/1%00"), 422) == "nul_byte"
    assert error_code(client.delete("/tokens/ci%00"), 422) == "nul_byte"


def test_a_nul_byte_in_the_query_string_is_422(client, upload_model):
    assert upload_model("digits", "1").status_code == 201
    for params in ({"evalset": "ev\x00"}, {"ev\x00": "1"}):
        assert error_code(client.get("/models/digits/matrix", params=params), 422) == "nul_byte"


def test_a_nul_byte_in_json_answers_422_before_the_signature_is_verified(client, upload_model):
    assert upload_model("digits", "1").status_code == 201
    anonymous, body = TestClient(client.app), {"model": "d\x00", "candidate": "1"}
    fresh = f"t={int(time.time())},v1={'0' * 64}"  # parses, in the window, a wrong digest
    webhook = anonymous.post("/gate", json=body, headers={"X-Flipgate-Signature-256": fresh})
    assert error_code(webhook, 422) == "nul_byte"
    malformed = anonymous.post("/gate", json=body,
                               headers={"X-Flipgate-Signature-256": "sha256=" + "0" * 64})
    assert error_code(malformed, 401) == "malformed_signature"
    nested = {"rules": [{"metric": "nfr", "max": 0.1, "note": ["fine", {"k\x00": 1}]}]}
    assert error_code(client.put("/models/digits/policy", json=nested), 422) == "nul_byte"
    alias = client.post("/models/digits/aliases/production", json={"version": "1\x00"})
    assert error_code(alias, 422) == "nul_byte"
    assert client.get("/models/digits").json()["aliases"] == []


def test_an_escaped_backslash_is_no_nul_byte(client, upload_model):
    assert upload_model("digits", "1").status_code == 201
    alias = client.post("/models/digits/aliases/production",
                        json={"version": "1\\u0000"})  # the text \u0000, six characters
    assert error_code(alias, 404) == "version_not_found"


@pytest.mark.parametrize("field", ["name", "version", "parent", "metadata"])
def test_a_nul_byte_in_a_form_field_is_422_and_nothing_is_stored(client, upload_model,
                                                                  settings, field):
    values = {"name": "digits", "version": "1", "parent": "base:1", "metadata": "{}"}
    values[field] += "\x00"
    response = upload_model(values.pop("name"), values.pop("version"), **values)
    assert error_code(response, 422) == "nul_byte"
    assert client.get("/models").json() == []
    assert not [path for path in settings.artifacts_dir.rglob("*") if path.is_file()]


def test_a_nul_byte_in_an_upload_file_name_is_422(client, onnx_file):
    """Sent raw: httpx would percent-encode the NUL of a file name."""
    part = (b'--b\r\nContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n')
    body = b"".join([part % (b"name", b"", b"digits"), part % (b"version", b"", b"1"),
                     part % (b"artifact", b'; filename="model\x00.onnx"',
                            onnx_file().read_bytes()), b"--b--\r\n"])
    response = client.post("/models", content=body,
                           headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert error_code(response, 422) == "nul_byte"
    assert client.get("/models").json() == []
