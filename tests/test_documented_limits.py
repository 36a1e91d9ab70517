"""The limits docs/server.md documents, at their boundary: the limit itself is accepted, one more
is refused with its code (65,536 fixed batch, 2^26 values per sample, 2^20 classes in a model
and in logits, 100,000 initializers)."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from flipgate.formats.logits import load_logits
from flipgate.formats.onnx_models import inspect_onnx

from .conftest import linear_onnx
from .test_formats_limits import code_of, graph_model

BATCH, SAMPLE, CLASSES, INITIALIZERS = 65_536, 1 << 26, 1 << 20, 100_000


@pytest.mark.parametrize(("input_shape", "classes", "code"), [
    ((BATCH, 4), 3, "onnx_fixed_batch"),
    (("N", SAMPLE), 3, "sample_too_large"),
    (("N", 1 << 13, 1 << 13), 3, "sample_too_large"),  # 2^26 values in two axes
    (("N", 4), CLASSES, "onnx_output_shape"),
])
def test_a_model_at_the_limit_is_read_and_one_over_it_refused(tmp_path, input_shape, classes,
                                                              code):
    assert inspect_onnx(graph_model(tmp_path, input_shape, classes)) is not None
    over = list(input_shape)
    if classes == CLASSES:
        classes += 1
    elif over[0] == BATCH:
        over[0] += 1
    else:
        over[-1] += 1
    assert code_of(inspect_onnx, graph_model(tmp_path, over, classes)) == code


def test_logits_with_the_most_classes_are_read_and_one_more_refused(tmp_path):
    path = tmp_path / "wide.npy"
    np.save(path, np.zeros((1, CLASSES), np.float16))
    assert load_logits(path).shape == (1, CLASSES)
    np.save(path, np.zeros((1, CLASSES + 1), np.float16))
    assert code_of(load_logits, path) == "too_many_classes"


def with_initializers(tmp_path, count: int):
    """A linear model carrying `count` initializers in all (2 of its own, the rest unused)."""
    path = linear_onnx(tmp_path / f"m{count}.onnx", np.ones((4, 3)), np.zeros(3), ("N", 4))
    model = onnx.load(path)
    unused = numpy_helper.from_array(np.zeros(1, np.float32), "u")
    for index in range(count - 2):
        tensor = model.graph.initializer.add()
        tensor.CopyFrom(unused)
        tensor.name = f"u{index}"
    onnx.save(model, path)
    return path


def test_a_model_with_the_most_initializers_is_read_and_one_more_refused(tmp_path):
    assert inspect_onnx(with_initializers(tmp_path, INITIALIZERS)).num_classes == 3
    refused = with_initializers(tmp_path, INITIALIZERS + 1)
    assert code_of(inspect_onnx, refused) == "onnx_too_many_initializers"
