"""Credentials are checked from the headers before a body is read (service.limits.Admission)."""

from fastapi.testclient import TestClient

from tests.service.api.conftest import bearer, error_code


def test_a_large_upload_without_a_token_is_refused_and_stores_nothing(client):
    anonymous = TestClient(client.app)
    response = anonymous.post("/models", data={"name": "m", "version": "1"},
                              files={"artifact": ("model.onnx", b"\0" * (1 << 20))})
    assert error_code(response, 401) == "missing_credentials"
    assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/models").json() == []


def test_a_bad_token_is_refused_before_the_body_is_read(client):
    response = client.post("/models", data={"name": "m", "version": "1"},
                           files={"artifact": ("model.onnx", b"\0" * (1 << 20))},
                           headers=bearer("fg_wrong"))
    assert error_code(response, 401) == "invalid_token"
    assert client.get("/models").json() == []
