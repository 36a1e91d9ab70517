"""flipgate.scores: every model's scores as log-space logits that give its own probabilities
back, and the eval-set inputs a model is fed."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from flipgate.errors import InputError
from flipgate.formats.evalsets import cast_input, evalset_of
from flipgate.inference import OnnxClassifier
from flipgate.metrics.probs import softmax
from flipgate.scores import PROBABILITY_FLOOR, to_logits

RNG = np.random.default_rng(0)


def test_probabilities_come_back_through_a_softmax():
    probs = RNG.dirichlet(np.ones(5), size=200)
    logits = to_logits(probs, "probabilities")
    assert logits.dtype == np.float32 and logits.shape == (200, 5)
    np.testing.assert_allclose(softmax(logits.astype(np.float64)), probs, atol=1e-6)


def test_exact_zeros_and_ones_are_floored_not_nan():
    votes = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.2, 0.8, 0.0]])
    logits = to_logits(votes, "probabilities")
    assert np.isfinite(logits).all()
    assert logits[0, 1] == pytest.approx(np.log(PROBABILITY_FLOOR))
    np.testing.assert_allclose(softmax(logits.astype(np.float64)), votes, atol=1e-12)
    assert list(logits.argmax(1)) == [0, 1, 1]


def test_one_column_is_class_one_of_a_binary_classifier():
    p = np.array([0.0, 0.3, 0.7, 1.0], np.float32)
    from_probability = softmax(to_logits(p[:, None], "probabilities").astype(np.float64))
    np.testing.assert_allclose(from_probability[:, 1], p, atol=1e-6)
    z = np.array([-40.0, -1.0, 2.0, 90.0])
    from_logit = softmax(to_logits(z, "logits").astype(np.float64))
    np.testing.assert_allclose(from_logit[:, 1], 1 / (1 + np.exp(-z)), atol=1e-7)


@pytest.mark.parametrize(("scores", "kind", "code"), [
    (np.array([[0.5, 1.5]]), "probabilities", "scores_not_probabilities"),
    (np.array([[np.nan, 1.0]]), "logits", "model_output_not_finite"),
    (np.zeros((2, 2, 2)), "logits", "scores_shape"),
    (np.zeros((2, 2)), "odds", "invalid_scores"),
])
def test_scores_that_cannot_be_read_are_refused(scores, kind, code):
    with pytest.raises(InputError) as refused:
        to_logits(scores, kind)
    assert refused.value.code == code


@pytest.mark.parametrize(("array", "dtype"), [
    (np.array([[2.5]]), np.int32),
    (np.array([[2**24 + 1]], np.int64), np.float32),
    (np.array([[3e38 * 10]]), np.float32),
    (np.array([[70000.0]]), np.float16),
    (np.array([["a"]]), np.float32),
])
def test_lossy_casts_are_refused_naming_the_array(array, dtype):
    with pytest.raises(InputError, match="ids"):
        cast_input(array, np.dtype(dtype), source="eval set array 'ids'")


def test_lossless_casts_pass_with_missing_values():
    floats = np.array([[np.nan, np.inf, 1e30, -2.5]])
    assert cast_input(floats, np.dtype(np.float32), source="x") is floats
    assert cast_input(np.array([[7, -3]]), np.dtype(np.float16), source="x").dtype == np.int64


def two_input_model(path):
    """logits = a + b, with a float32 and b int64 cast to float."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["a", "bf"], ["logits"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("b", TensorProto.INT64, ["N", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return path


def test_each_input_reads_the_array_of_its_name(tmp_path):
    model = OnnxClassifier(two_input_model(tmp_path / "m.onnx"), device="cpu")
    a, b = RNG.normal(size=(50, 3)), RNG.integers(-5, 5, (50, 3))
    evalset = evalset_of({"a": a, "b": b, "c": np.zeros((50, 2)), "y": np.zeros(50, int)})
    logits = model.predict(model.feeds(evalset), batch_size=7)
    np.testing.assert_allclose(logits, a + b, atol=1e-6)
    partial = evalset_of({"a": a, "y": np.zeros(50, int)})
    with pytest.raises(InputError, match="the model's input 'b' has no array of that name"):
        model.feeds(partial)


def test_training_needs_a_float_x(run_cli, tmp_path):
    np.savez(data := tmp_path / "tokens.npz", input_ids=np.ones((8, 4), np.int64),
             y=np.zeros(8, int))
    result = run_cli("train", "--method", "baseline", "--arch", "mlp", "--train", data,
                     "--out", tmp_path / "m.onnx")
    assert result.code == 2 and "training needs a float array `x`" in result.err
    assert not (tmp_path / "m.onnx").exists()


def test_a_float64_model_runs_as_it_is(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["logits"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.DOUBLE, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (path := tmp_path / "f64.onnx").write_bytes(model.SerializeToString())
    classifier = OnnxClassifier(path, device="cpu")
    x = RNG.normal(size=(20, 3)).astype(np.float32)
    assert classifier.spec.inputs[0].dtype == np.float64
    np.testing.assert_allclose(classifier.predict(x), x.astype(np.float64) ** 2, rtol=1e-6)
