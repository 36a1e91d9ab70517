"""Eval sets and uploaded predictions over HTTP."""

import numpy as np
import pytest

from tests.service.api.conftest import error_code


@pytest.fixture
def registered(npz_file, upload_model, upload_evalset):
    """digits:1.0 (3 classes) and the eval set `eval` of 30 samples."""
    upload_model("digits", "1.0")
    assert upload_evalset("eval", npz_file(n=30, num_classes=3)).status_code == 201


def test_an_eval_set_is_registered_and_listed(client, npz_file, upload_evalset):
    record = upload_evalset("eval", npz_file(n=30, num_classes=3)).json()
    assert (record["name"], record["n"], record["num_classes"], record["sample_shape"]) == (
        "eval", 30, 3, [4])
    assert client.get("/evalsets").json() == [record]
    assert error_code(upload_evalset("eval", npz_file(n=10)), 409) == "dataset_exists"


def test_a_truncated_eval_set_is_422(npz_file, upload_evalset):
    path = npz_file()
    path.write_bytes(path.read_bytes()[:-40])
    assert error_code(upload_evalset("eval", path), 422) == "evalset_corrupt"


def test_uploaded_logits_are_stored(registered, upload_logits):
    record = upload_logits("digits:1.0", "eval", np.zeros((30, 3), np.float32)).json()
    assert (record["source"], record["provider"]) == ("uploaded", None)


@pytest.mark.parametrize(("logits", "code"), [
    (np.zeros((29, 3)), "logits_shape"),
    (np.array([[np.nan, 0.0, 0.0]] * 30), "non_finite"),
    (np.array([[0.0, 1.0, object()]] * 30, dtype=object), "object_array"),
])
def test_refused_logits_are_422(registered, upload_logits, logits, code):
    assert error_code(upload_logits("digits:1.0", "eval", logits), 422) == code


def test_logits_of_an_unknown_version_are_404(registered, upload_logits):
    assert error_code(upload_logits("digits:2.0", "eval", np.zeros((30, 3))),
                      404) == "version_not_found"
