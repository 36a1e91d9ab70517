"""Every malformed input to `flipgate compare`: exit code 2, one clear line, no traceback
(with --json, also one JSON error object on stdout)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from .conftest import linear_onnx, save_graph

RNG = np.random.default_rng(0)


def good_evalset(folder: Path, classes: int = 3) -> Path:
    path = folder / "eval.npz"
    np.savez(path, x=RNG.random((6, 4), dtype=np.float32), y=np.arange(6) % classes)
    return path


def model(folder: Path, name: str, classes: int = 3, input_shape=("N", 4)) -> Path:
    return linear_onnx(folder / name, RNG.random((4, classes)), np.zeros(classes), input_shape)


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def savez(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def save_npy(path: Path, array: np.ndarray) -> Path:
    with path.open("wb") as file:  # np.save(path) would append ".npy" to other suffixes
        np.save(file, array)
    return path


def external_data_model(folder: Path) -> Path:
    weight = numpy_helper.from_array(RNG.random((4, 3)).astype(np.float32), "w")
    set_external_data(weight, location="../outside.bin")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], [weight])
    return save_graph(graph, folder / "external.onnx")


def mistyped_model(folder: Path) -> Path:
    """Passes the ONNX checker, but multiplies a float input by an int64 weight."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.ones((4, 3), dtype=np.int64), "w")])
    return save_graph(graph, folder / "mistyped.onnx")


def two_input_model(folder: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["logits"])], "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 3]) for name in "ab"],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])])
    return save_graph(graph, folder / "two.onnx")


def rank3_output_model(folder: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x", "axes"], ["logits"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1, 4])],
        [numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")])
    return save_graph(graph, folder / "rank3.onnx")


def reshape_failing_model(folder: Path) -> Path:
    """Loads, but its Reshape fails on every batch of 4 features (run time, not load time)."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["logits"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.array([-1, 5], dtype=np.int64), "shape")])
    return save_graph(graph, folder / "reshape.onnx")


# Each case builds (old, new, evalset) in a folder and names the message it must produce.
CASES = {
    "missing eval set": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"), d / "none.npz"),
                         "no such eval set file"),
    "missing model": (lambda d: (d / "none.onnx", model(d, "b.onnx"), good_evalset(d)),
                      "no such model file"),
    "corrupt eval set": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"),
                                    write_bytes(d / "e.npz", b"PK\x03\x04garbage")),
                         "not a readable .npz archive"),
    "eval set is one array": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"),
                                         save_npy(d / "e.npz", np.zeros(3))),
                              "expected an .npz archive holding arrays 'x' and 'y'"),
    "object array": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"),
                                savez(d / "e.npz", x=np.array([{}, []], dtype=object),
                                      y=np.zeros(2, int))),
                     "holds an array of Python objects; flipgate never unpickles"),
    "NaN in x": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"),
                            savez(d / "e.npz", x=np.array([[np.nan] * 4, [0.0] * 4], np.float32),
                                  y=np.zeros(2, int))),
                 "NaN or infinite logits"),
    "complex x": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"),
                             savez(d / "e.npz", x=np.zeros((2, 4), np.complex64),
                                   y=np.zeros(2, int))),
                  "x must be an array of floats, integers, bools or strings"),
    "float x beyond float32": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"),
                                          savez(d / "e.npz", x=np.full((2, 4), 1e300),
                                                y=np.zeros(2, int))),
                               "x: some values of this float64 array do not survive a cast"),
    "float labels": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"),
                                savez(d / "e.npz", x=np.zeros((2, 4), np.float32),
                                      y=np.zeros(2))),
                     "y must be a 1-D array of integer or string labels"),
    "length mismatch": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"),
                                   savez(d / "e.npz", x=np.zeros((5, 4), np.float32),
                                         y=np.zeros(4, int))),
                        "x has 5 samples but y has 4 labels"),
    "negative label": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx"),
                                  savez(d / "e.npz", x=np.zeros((2, 4), np.float32),
                                        y=np.array([-1, 0]))),
                       "labels must be >= 0; label -1 at index 0 does not"),
    "label beyond the model's classes": (
        lambda d: (model(d, "a.onnx"), model(d, "b.onnx"), good_evalset(d, classes=5)),
        "labels must lie in [0, 3); label 3 at index 3 does not"),
    "corrupt logits": (lambda d: (write_bytes(d / "a.npy", b"\x93NUMPY garbage"),
                                  model(d, "b.onnx"), good_evalset(d)),
                       "not a readable .npy array"),
    "object logits": (lambda d: (save_npy(d / "a.npy", np.array([None, 1], dtype=object)),
                                 model(d, "b.onnx"), good_evalset(d)),
                      "holds an array of Python objects"),
    "1-D logits": (lambda d: (save_npy(d / "a.npy", np.zeros(6)), model(d, "b.onnx"),
                              good_evalset(d)),
                   "logits must have shape (N, C) with N >= 1 and C >= 2, got (6,)"),
    "integer logits": (lambda d: (save_npy(d / "a.npy", np.zeros((6, 3), int)),
                                  model(d, "b.onnx"), good_evalset(d)),
                       "logits must be floats"),
    "infinite logits": (lambda d: (save_npy(d / "a.npy", np.full((6, 3), np.inf)),
                                   model(d, "b.onnx"), good_evalset(d)),
                        "contains 18 NaN or infinite values"),
    "logits of another length": (lambda d: (save_npy(d / "a.npy", np.zeros((5, 3))),
                                            model(d, "b.onnx"), good_evalset(d)),
                                 "5 rows of logits for an eval set of 6 samples"),
    "corrupt ONNX": (lambda d: (write_bytes(d / "a.onnx", b"\x08\x07garbage\xff"),
                                model(d, "b.onnx"), good_evalset(d)),
                     "not a valid ONNX model"),
    "wrong input shape": (lambda d: (model(d, "a.onnx", input_shape=("N", 2, 2)),
                                     model(d, "b.onnx"), good_evalset(d)),
                          "the model's input 'x' has shape ('N', 2, 2) but the eval set's "
                          "samples have shape (4,)"),
    "class counts differ": (lambda d: (model(d, "a.onnx"), model(d, "b.onnx", classes=4),
                                       good_evalset(d)),
                            "has 3 classes but"),
    "external data outside the folder": (
        lambda d: (external_data_model(d), model(d, "b.onnx"), good_evalset(d)),
        "points to external data '../outside.bin' outside the model's folder"),
    "two inputs": (lambda d: (two_input_model(d), model(d, "b.onnx"), good_evalset(d)),
                   "the model's input 'a' has no array of that name in the eval set"),
    "output is not (N, C)": (lambda d: (rank3_output_model(d), model(d, "b.onnx"),
                                        good_evalset(d)),
                             "no output holds float scores of shape (N, C), (N, 1) or (N,)"),
    "graph ONNX Runtime rejects": (
        lambda d: (mistyped_model(d), model(d, "b.onnx"), good_evalset(d)),
        "ONNX Runtime cannot load the model"),
    "model that fails at run time": (
        lambda d: (model(d, "a.onnx"), reshape_failing_model(d), good_evalset(d)),
        "ONNX Runtime failed to run the model"),
    "unknown model format": (lambda d: (write_bytes(d / "a.pt", b"x"), model(d, "b.onnx"),
                                        good_evalset(d)),
                             "a model must be an .onnx file or .npy logits"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_malformed_input_is_refused_with_one_clear_line(case, tmp_path, run_cli):
    build, message = CASES[case]
    old, new, evalset = build(tmp_path)
    result = run_cli("compare", old, new, "--evalset", evalset)
    assert result.code == 2
    assert message in result.err
    assert result.err.startswith("flipgate compare: error: ")
    assert result.err.count("\n") == 1 and result.out == ""


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_with_json_malformed_input_prints_a_json_error(case, tmp_path, run_cli):
    build, message = CASES[case]
    old, new, evalset = build(tmp_path)
    result = run_cli("compare", old, new, "--evalset", evalset, "--json")
    assert result.code == 2
    error = json.loads(result.out)["error"]
    assert set(error) == {"code", "message"} and error["code"]
    assert message in error["message"]
    assert "Traceback" not in result.err and result.err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--batch-size", "0"], "must be a positive integer, got 0"),
     (["--device", "tpu"], "invalid choice: 'tpu'"),
     ([], "the following arguments are required: --evalset")],
)
def test_bad_options_exit_2(args, message, tmp_path, run_cli):
    old, new = model(tmp_path, "a.onnx"), model(tmp_path, "b.onnx")
    if args:
        args += ["--evalset", good_evalset(tmp_path)]
    result = run_cli("compare", old, new, *args)
    assert result.code == 2 and message in result.err
    assert result.err.count("\n") == 1


def test_installed_command_prints_no_traceback(tmp_path):
    old = write_bytes(tmp_path / "a.onnx", b"not onnx")
    flipgate = Path(sys.executable).with_name("flipgate")
    done = subprocess.run([flipgate, "compare", old, model(tmp_path, "b.onnx"), "--evalset",
                           good_evalset(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "not a valid ONNX model" in done.stderr
