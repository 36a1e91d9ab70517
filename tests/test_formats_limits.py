"""Hostile and large inputs: sizes are checked before anything is allocated, arrays can be
memory-mapped, and messages name the input as the caller calls it."""

import io
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from flipgate.errors import InputError
from flipgate.formats import onnx_models
from flipgate.formats.evalsets import cast_input, load_evalset
from flipgate.formats.logits import load_logits
from flipgate.formats.onnx_models import inspect_onnx
from flipgate.metrics import chunks

from .conftest import linear_onnx, save_graph

RNG = np.random.default_rng(1)


def code_of(call, *args, **kwargs) -> str:
    with pytest.raises(InputError) as refused:
        call(*args, **kwargs)
    return refused.value.code


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def lying_npy(shape: tuple[int, ...], payload: bytes = b"\0" * 16) -> bytes:
    """An .npy header that declares `shape` float32 in front of a few bytes of data."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return np.lib.format.magic(1, 0) + buffer.getvalue()[8:] + payload


def zip_members(path: Path, members: dict[str, bytes],
                compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_a_compressed_archive_over_the_limit_is_refused_from_its_headers(tmp_path):
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, x=np.zeros((50_000, 256), np.float32), y=np.zeros(50_000, int))
    assert path.stat().st_size < 1 << 20  # 51 MB of zeros in a few hundred kB
    assert code_of(load_evalset, path, max_decompressed_bytes=10 << 20) == "evalset_too_large"
    assert load_evalset(path, max_decompressed_bytes=60 << 20).n == 50_000
    np.savez(stored := tmp_path / "stored.npz", x=np.zeros((3, 4), np.float32), y=np.zeros(3, int))
    assert load_evalset(stored, max_decompressed_bytes=1, mmap=True).n == 3  # bounded by its file


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_header_that_declares_terabytes_is_refused_without_allocating(tmp_path, compression):
    path = zip_members(tmp_path / "lie.npz", {"x.npy": lying_npy((1 << 40, 1)),
                                              "y.npy": npy_bytes(np.zeros(4, np.int64))},
                       compression)
    assert code_of(load_evalset, path) == "evalset_corrupt"


def test_logits_whose_header_declares_more_than_the_file_holds_are_refused(tmp_path):
    path = tmp_path / "lie.npy"
    path.write_bytes(lying_npy((1 << 40, 10)))
    assert code_of(load_logits, path) == "logits_corrupt"
    path.write_bytes(npy_bytes(np.zeros((4, 1 << 21), np.float16))[:4096])
    assert code_of(load_logits, path) == "too_many_classes"


def test_logits_are_memory_mapped_and_object_headers_refused(tmp_path):
    path = tmp_path / "big.npy"
    np.save(path, logits := RNG.random((1000, 10)).astype(np.float32))
    mapped = load_logits(path, mmap=True)
    assert isinstance(mapped, np.memmap) and np.array_equal(mapped, logits)
    np.save(path, np.array([None, 1.0], dtype=object))
    assert code_of(load_logits, path) == "object_array"


@pytest.mark.parametrize(("arrays", "code"), [
    ({"x": np.zeros((5, 0), np.float32), "y": np.zeros(5, int)}, "empty_samples"),
    ({"x": np.zeros((2, 3), np.float32), "y": np.array([0, 1 << 62])}, "labels_out_of_range"),
    ({"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, int),
      "groups": np.array(["a", "b", "c"])}, "length_mismatch"),
    ({"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, int),
      "groups": np.zeros(2, np.float32)}, "evalset_groups"),
    ({"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, int),
      "groups": np.array(["a", None], dtype=object)}, "object_array"),
])
def test_bad_eval_sets_are_refused(tmp_path, arrays, code):
    path = tmp_path / "e.npz"
    np.savez(path, **arrays)
    assert code_of(load_evalset, path) == code


def test_groups_are_read_with_the_eval_set(tmp_path):
    path = tmp_path / "e.npz"
    groups = np.array(["de", "en", "en"])
    np.savez(path, x=np.zeros((3, 2), np.float32), y=np.array([0, 1, 1]), groups=groups)
    assert load_evalset(path).groups.tolist() == groups.tolist()
    np.savez(path, x=np.zeros((3, 2), np.float32), y=np.array([0, 1, 1]))
    assert load_evalset(path).groups is None


def test_an_uncompressed_eval_set_is_memory_mapped_with_the_same_values(tmp_path):
    x, y = RNG.random((300, 1, 8, 8), dtype=np.float32), RNG.integers(0, 10, 300)
    np.savez(stored := tmp_path / "stored.npz", x=x, y=y)
    np.savez_compressed(packed := tmp_path / "packed.npz", x=x, y=y)
    mapped = load_evalset(stored, mmap=True)
    assert isinstance(mapped.x, np.memmap)
    assert np.array_equal(mapped.x, x) and np.array_equal(mapped.y, y)
    read = load_evalset(packed, mmap=True)
    assert not isinstance(read.x, np.memmap) and np.array_equal(read.x, x)


def test_casts_are_checked_chunk_by_chunk_across_chunk_borders(tmp_path, monkeypatch):
    monkeypatch.setattr(chunks, "CHECK_CHUNK_BYTES", 64)
    x = np.zeros((100, 4), np.float64)
    x[[3, 57], [0, 2]] = [np.nan, np.inf]  # missing values and infinities survive a cast
    assert cast_input(x, np.dtype(np.float32), source="x") is x
    x[99, 3] = 1e300  # the last chunk's last value does not fit a float32
    with pytest.raises(InputError, match="x: some values of this float64 array do not"):
        cast_input(x, np.dtype(np.float32), source="x")


def test_messages_name_the_source_not_the_server_path(tmp_path):
    path = tmp_path / "staging-0123" / "data.npz"
    path.parent.mkdir()
    path.write_bytes(b"PK\3\4 truncated")
    with pytest.raises(InputError) as refused:
        load_evalset(path, source="upload 'data' (eval.npz)")
    assert str(tmp_path) not in refused.value.message
    assert refused.value.message.startswith("upload 'data' (eval.npz): ")


def graph_model(folder: Path, input_shape, classes: int = 3) -> Path:
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", classes])])
    return save_graph(graph, folder / "m.onnx")


@pytest.mark.parametrize(("input_shape", "classes", "code"), [
    ((1 << 40, 4), 3, "onnx_fixed_batch"),
    (("N", 1 << 62), 3, "sample_too_large"),
    (("N", 0), 3, "empty_samples"),
    (("N", 4), 1 << 31, "onnx_output_shape"),
])
def test_models_with_absurd_dimensions_are_refused(tmp_path, input_shape, classes, code):
    assert code_of(inspect_onnx, graph_model(tmp_path, input_shape, classes)) == code


def test_models_with_too_many_initializers_are_refused(tmp_path, monkeypatch):
    path = linear_onnx(tmp_path / "m.onnx", RNG.random((4, 3)), np.zeros(3), ("N", 4))
    model = onnx.load(path)
    model.graph.initializer.extend(numpy_helper.from_array(np.zeros(1, np.float32), f"u{i}")
                                   for i in range(20))
    onnx.save(model, path)
    monkeypatch.setattr(onnx_models, "MAX_INITIALIZERS", 22)
    assert inspect_onnx(path).num_classes == 3
    monkeypatch.setattr(onnx_models, "MAX_INITIALIZERS", 21)
    assert code_of(inspect_onnx, path) == "onnx_too_many_initializers"
