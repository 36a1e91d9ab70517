"""Reading and validating what users hand to flipgate: eval sets, logits and ONNX models.

Nothing here unpickles: arrays are read with allow_pickle=False and ONNX files are parsed
as protobuf. Every refusal is an InputError with a machine-readable code.
"""

import math
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx

from flipgate.errors import InputError
from flipgate.metrics.chunks import release

NUMPY_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, struct.error)
MAX_CLASSES = 1 << 20  # labels and logits columns
MAX_SAMPLE_ELEMENTS = 1 << 26  # numbers in one sample (256 MiB of float32)
MAX_FIXED_BATCH = 1 << 16  # a model that insists on a larger batch cannot be scored
MAX_INITIALIZERS = 100_000
CHECK_CHUNK_BYTES = 64 << 20  # how much of an array a value check holds at once
ZIP_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a member's local file header (30 bytes)
DEFLATE_MAX_RATIO = 1032  # no deflate stream expands more than this: larger claims are lies


@dataclass(frozen=True)
class EvalSet:
    """A labeled evaluation set: float32 inputs x (N, ...) (possibly memory-mapped), int64
    labels y (N,) and, optionally, a group (slice) per sample."""

    x: np.ndarray
    y: np.ndarray
    groups: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.y.size)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])


def load_evalset(path: str | Path, *, max_decompressed_bytes: int | None = None,
                 mmap: bool = False, source: str | None = None) -> EvalSet:
    """Load an eval set .npz with arrays `x` (float, first axis N), `y` (integer labels) and an
    optional `groups` (one integer or string per sample).

    The array headers are checked before anything is allocated: every header must agree with
    the bytes the file holds, and compressed arrays may not expand beyond
    `max_decompressed_bytes` together. With `mmap`, a float32 `x` stored uncompressed (np.savez) is
    memory-mapped instead of read; values are checked chunk by chunk either way. Messages
    name the file as `source` (default: its path)."""
    path = _existing(path, "eval set", source)
    source = source or str(path)
    try:
        headers = npz_headers(path, source=source)
        _check_evalset_headers(headers, max_decompressed_bytes, source)
        x = _read_member(path, "x", headers["x"], mmap=mmap)
        y, groups = (np.load(path, allow_pickle=False)[name] if name in headers else None
                     for name in ("y", "groups"))
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise _unreadable(error, source, "evalset_corrupt", "a readable .npz archive") from error
    return validate_evalset(x, y, groups=groups, source=source)


def validate_evalset(x: np.ndarray, y: np.ndarray, *, groups: np.ndarray | None = None,
                     source: str = "eval set") -> EvalSet:
    """Check shapes, dtypes and values of an eval set (x in memory or memory-mapped)."""
    _check_x_y(_Header.of(x), _Header.of(y), source)
    _require_finite(x, f"{source}: x")
    check_labels(y, None, source=source)
    if groups is not None:
        _check_groups(groups, y.size, source)
    x = x if x.dtype == np.float32 and x.flags.c_contiguous else x.astype(np.float32)
    return EvalSet(x=x, y=y.astype(np.int64), groups=groups)


@dataclass(frozen=True)
class _Header:
    """What an .npy header declares: enough to refuse an array before allocating it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool = False
    data_offset: int | None = None  # where the raw data starts in the file, if uncompressed

    @classmethod
    def of(cls, array: np.ndarray) -> "_Header":
        return cls(tuple(array.shape), array.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def npz_headers(path: Path, *, source: str) -> dict[str, _Header]:
    """The header of every array in an .npz archive, read without reading the arrays."""
    with path.open("rb") as raw:
        if raw.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX:
            raise InputError("evalset_not_npz", f"{source}: expected an .npz archive holding "
                               "arrays 'x' and 'y', found a single array")
    with zipfile.ZipFile(path) as archive, path.open("rb") as raw:
        return {info.filename.removesuffix(".npy"): _member_header(archive, raw, info, source)
                for info in archive.infolist() if info.filename.endswith(".npy")}


def _member_header(archive: zipfile.ZipFile, raw: BinaryIO, info: zipfile.ZipInfo,
                   source: str) -> _Header:
    with archive.open(info) as member:
        shape, fortran_order, dtype = read_npy_header(member, source=source)
        header_bytes = member.tell()
    _check_declared_size(info, header_bytes + math.prod(shape) * dtype.itemsize, source)
    offset = None
    if info.compress_type == zipfile.ZIP_STORED:
        raw.seek(info.header_offset)
        fields = ZIP_LOCAL_HEADER.unpack(raw.read(ZIP_LOCAL_HEADER.size))
        offset = (info.header_offset + ZIP_LOCAL_HEADER.size + fields[-2] + fields[-1]
                  + header_bytes)
    return _Header(shape, dtype, fortran_order, offset)


def _check_declared_size(info: zipfile.ZipInfo, declared: int, source: str) -> None:
    """An array's header must agree with its member's size, and that size with what its
    compressed bytes can expand to, so that a lying header never gets its memory."""
    expandable = info.compress_size * (1 if info.compress_type == zipfile.ZIP_STORED
                                       else DEFLATE_MAX_RATIO)
    if declared != info.file_size or info.file_size > expandable + 1024:
        raise ValueError(f"{info.filename} declares {declared} bytes but holds "
                         f"{info.file_size} ({info.compress_size} compressed)")


def read_npy_header(handle: BinaryIO, *, source: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype of the .npy data at `handle`, which is left at the
    start of the raw data; object and structured arrays are refused."""
    version = np.lib.format.read_magic(handle)
    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f"unsupported .npy format version {version}")
    shape, fortran_order, dtype = readers[version](handle)
    if dtype.hasobject:
        raise InputError("object_array", f"{source}: holds an array of Python objects; "
                           "flipgate never unpickles data, store plain numeric arrays")
    if dtype.fields is not None or dtype.subdtype is not None:
        raise InputError("npy_dtype", f"{source}: structured arrays are not supported")
    return tuple(shape), fortran_order, dtype


def _check_evalset_headers(headers: dict[str, _Header], max_decompressed_bytes: int | None,
                           source: str) -> None:
    """Arrays present, of the right kinds and shapes, compressed ones within the limit."""
    missing = {"x", "y"} - set(headers)
    if missing:
        raise InputError("evalset_missing_array", f"{source}: the archive has no array "
                           f"{' or '.join(sorted(missing))!r} (it has {sorted(headers)})")
    _check_x_y(headers["x"], headers["y"], source)
    total = sum(header.nbytes for header in headers.values() if header.data_offset is None)
    if max_decompressed_bytes is not None and total > max_decompressed_bytes:
        raise InputError("evalset_too_large", f"{source}: its compressed arrays expand to "
                           f"{total} bytes, above the limit of {max_decompressed_bytes}; store "
                           "large eval sets uncompressed (np.savez)")


def _check_x_y(x: _Header, y: _Header, source: str) -> None:
    """x: float, samples on the first axis, non-empty samples; y: one integer per sample."""
    if len(x.shape) < 1 or not np.issubdtype(x.dtype, np.floating):
        raise InputError("evalset_x_dtype", f"{source}: x must be a float array with the "
                           f"samples on the first axis, got {x.dtype} with shape {x.shape}")
    if len(y.shape) != 1 or not np.issubdtype(y.dtype, np.integer):
        raise InputError("evalset_y_dtype", f"{source}: y must be a 1-D array of integer "
                           f"labels, got {y.dtype} with shape {y.shape}")
    if x.shape[0] != y.shape[0]:
        raise InputError("length_mismatch", f"{source}: x has {x.shape[0]} samples but y "
                           f"has {y.shape[0]} labels")
    if y.shape[0] == 0:
        raise InputError("empty", f"{source}: the eval set has no samples")
    _check_sample_shape(x.shape[1:], source)


def _check_sample_shape(shape: tuple[int, ...], source: str) -> None:
    """A sample holds at least one and at most MAX_SAMPLE_ELEMENTS numbers."""
    elements = math.prod(shape)
    if elements == 0:
        raise InputError("empty_samples", f"{source}: samples of shape {shape} hold no values")
    if elements > MAX_SAMPLE_ELEMENTS:
        raise InputError("sample_too_large", f"{source}: samples of shape {shape} hold "
                           f"{elements} values, above the limit of {MAX_SAMPLE_ELEMENTS}")


def _check_groups(groups: np.ndarray, n: int, source: str) -> None:
    """Groups: one integer or string per sample."""
    if groups.ndim != 1 or groups.dtype.kind not in "iuU":
        raise InputError("evalset_groups", f"{source}: groups must be a 1-D array of "
                           f"integers or strings, got {groups.dtype} with shape {groups.shape}")
    if groups.size != n:
        raise InputError("length_mismatch", f"{source}: groups has {groups.size} entries "
                           f"for {n} samples")


def _read_member(path: Path, name: str, header: _Header, *, mmap: bool) -> np.ndarray:
    """An array of an .npz: memory-mapped when asked and stored uncompressed as float32 in C
    order, else read (its size was checked against the limit)."""
    if mmap and header.data_offset is not None and header.dtype == np.float32 \
            and not header.fortran_order:
        return np.memmap(path, dtype=header.dtype, mode="r", offset=header.data_offset,
                         shape=header.shape)
    with np.load(path, allow_pickle=False) as archive:
        return archive[name]


def check_labels(labels: np.ndarray, num_classes: int | None, *, source: str) -> None:
    """Labels must lie in [0, num_classes) (in [0, MAX_CLASSES) when num_classes is None)."""
    limit = MAX_CLASSES if num_classes is None else num_classes
    bad = (labels < 0) | (labels >= limit)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        label = int(labels[first])
        allowed = (f"lie in [0, {num_classes})" if num_classes is not None else
                   "be >= 0" if label < 0 else f"lie below {MAX_CLASSES} (the class limit)")
        raise InputError("labels_out_of_range", f"{source}: labels must {allowed}; label "
                           f"{label} at index {first} does not")


def load_logits(path: str | Path, *, mmap: bool = False,
                source: str | None = None) -> np.ndarray:
    """Load (N, C) float logits from a .npy file, memory-mapped with `mmap`; the header is
    checked against the file before the data is read."""
    path = _existing(path, "logits", source)
    source = source or str(path)
    try:
        header = single_npy_header(path, source=source, what="logits")
        _check_logits_header(header, source)
        if path.stat().st_size != header.data_offset + header.nbytes:
            raise ValueError(f"the header declares {header.nbytes} bytes of data, the file "
                             f"holds {path.stat().st_size - header.data_offset}")
        logits = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise _unreadable(error, source, "logits_corrupt", "a readable .npy array") from error
    return validate_logits(logits, source=source)


def single_npy_header(path: Path, *, source: str, what: str) -> _Header:
    """The header of a one-array .npy file of `what` (an .npz archive is refused)."""
    if zipfile.is_zipfile(path):
        raise InputError(f"{what}_not_npy", f"{source}: expected one .npy array of {what}, "
                           "found an .npz archive")
    with path.open("rb") as handle:
        shape, _, dtype = read_npy_header(handle, source=source)
        return _Header(shape, dtype, data_offset=handle.tell())


def _check_logits_header(header: _Header, source: str) -> None:
    """Floats of shape (N, C) with N >= 1 and 2 <= C <= MAX_CLASSES."""
    if not np.issubdtype(header.dtype, np.floating):
        raise InputError("logits_dtype", f"{source}: logits must be floats, "
                           f"got {header.dtype}")
    shape = header.shape
    if len(shape) != 2 or shape[0] == 0 or shape[1] < 2:
        raise InputError("logits_shape", f"{source}: logits must have shape (N, C) with "
                           f"N >= 1 and C >= 2, got {shape}")
    if shape[1] > MAX_CLASSES:
        raise InputError("too_many_classes", f"{source}: {shape[1]} classes, above the "
                           f"limit of {MAX_CLASSES}")


def validate_logits(logits: np.ndarray, *, source: str = "logits") -> np.ndarray:
    """Logits must be a finite float array of shape (N, C) with N >= 1 and C >= 2."""
    _check_logits_header(_Header.of(logits), source)
    _require_finite(logits, source)
    return logits


def check_logits_match(logits: np.ndarray, evalset: EvalSet, *, source: str) -> None:
    """Logits must have one row per eval-set sample and a column for every label."""
    if logits.shape[0] != evalset.n:
        raise InputError("length_mismatch", f"{source}: {logits.shape[0]} rows of logits "
                           f"for an eval set of {evalset.n} samples")
    check_labels(evalset.y, logits.shape[1], source=f"eval set scored by {source}")


@dataclass(frozen=True)
class OnnxSpec:
    """The interface of an ONNX classifier: one float input and one (N, C) logits output."""

    input_name: str
    input_shape: tuple[int | None, ...]
    output_name: str
    num_classes: int

    @property
    def fixed_batch(self) -> int | None:
        """The batch size the model insists on, or None when the batch axis is dynamic."""
        return self.input_shape[0]

    def check_sample_shape(self, sample_shape: tuple[int, ...], *, source: str) -> None:
        """Refuse eval-set samples whose shape the model's input cannot take."""
        expected = self.input_shape[1:]
        fits = len(expected) == len(sample_shape) and all(
            want is None or want == got for want, got in zip(expected, sample_shape, strict=True)
        )
        if not fits:
            shown = tuple("N" if d is None else d for d in self.input_shape)
            raise InputError("onnx_input_shape", f"{source}: the model takes input of shape "
                               f"{shown} but the eval set's samples have shape {sample_shape}")


def inspect_onnx(path: str | Path, *, source: str | None = None) -> OnnxSpec:
    """Parse and validate an ONNX classifier without running it; messages name it `source`."""
    path = _existing(path, "model", source)
    source = source or str(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
        _check_external_data(model, path, source)
        _check_initializer_count(model, source)
        onnx.checker.check_model(str(path))  # by path: external data beside the model
    except InputError:
        raise
    except Exception as error:  # protobuf and checker raise many types for corrupt input
        raise InputError("onnx_corrupt", f"{source}: not a valid ONNX model "
                           f"({_explain(error)})") from error
    return OnnxSpec(*_single_input(model, source), *_logits_output(model, source))


def _check_initializer_count(model: onnx.ModelProto, source: str) -> None:
    count = len(model.graph.initializer)
    if count > MAX_INITIALIZERS:
        raise InputError("onnx_too_many_initializers", f"{source}: {count} initializers, "
                           f"above the limit of {MAX_INITIALIZERS}")


def _single_input(model: onnx.ModelProto, source: str) -> tuple[str, tuple[int | None, ...]]:
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    if len(inputs) != 1:
        raise InputError("onnx_inputs", f"{source}: a classifier must have exactly one "
                           f"input, this model has {len(inputs)}")
    tensor_type = inputs[0].type.tensor_type
    if tensor_type.elem_type != onnx.TensorProto.FLOAT:
        kind = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
        raise InputError("onnx_input_type", f"{source}: the input must be float32, not {kind}")
    dims = _dims(tensor_type)
    _check_input_dims(dims, source)
    return inputs[0].name, dims


def _check_input_dims(dims: tuple[int | None, ...], source: str) -> None:
    """A batch axis (dynamic, or fixed up to MAX_FIXED_BATCH) and a bounded, fixed sample."""
    if not dims:
        raise InputError("onnx_input_shape", f"{source}: the input needs a batch axis")
    if dims[0] is not None and not 1 <= dims[0] <= MAX_FIXED_BATCH:
        raise InputError("onnx_fixed_batch", f"{source}: the model insists on a batch of "
                           f"{dims[0]}; at most {MAX_FIXED_BATCH} is supported")
    if any(dim == 0 for dim in dims[1:]):
        raise InputError("empty_samples", f"{source}: input samples of shape {dims[1:]} "
                           "hold no values")
    _check_sample_shape(tuple(dim or 1 for dim in dims[1:]), source)


def _logits_output(model: onnx.ModelProto, source: str) -> tuple[str, int]:
    outputs = model.graph.output
    if len(outputs) != 1:
        raise InputError("onnx_outputs", f"{source}: a classifier must have exactly one "
                           f"output (logits), this model has {len(outputs)}")
    dims = _dims(outputs[0].type.tensor_type)
    if len(dims) != 2 or dims[1] is None or not 2 <= dims[1] <= MAX_CLASSES:
        shown = tuple("?" if d is None else d for d in dims)
        raise InputError("onnx_output_shape", f"{source}: the output must be logits of shape "
                           f"(N, C) with a fixed 2 <= C <= {MAX_CLASSES}, got {shown}")
    return outputs[0].name, dims[1]


def _dims(tensor_type: onnx.TypeProto.Tensor) -> tuple[int | None, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)


def _check_external_data(model: onnx.ModelProto, path: Path, source: str) -> None:
    """External tensors must be files inside the model's own folder."""
    folder = path.parent.resolve()
    for tensor in _all_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = _location(tensor)
        target = (folder / location).resolve()
        if not target.is_relative_to(folder) or target == folder:
            raise InputError("onnx_external_data", f"{source}: tensor {tensor.name!r} points "
                               f"to external data {location!r} outside the model's folder")
        if not target.is_file():
            raise InputError("onnx_external_data", f"{source}: tensor {tensor.name!r} needs "
                               f"external data file {location!r}, which does not exist")


def external_data_names(path: str | Path, *, source: str | None = None) -> set[str]:
    """The files (relative to the model's folder) that an ONNX model's external tensors name;
    the model is parsed without reading them."""
    path = _existing(path, "model", source)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf raises many types for corrupt input
        raise InputError("onnx_corrupt", f"{source or path}: not a valid ONNX model "
                           f"({_explain(error)})") from error
    return {_location(tensor) for tensor in _all_tensors(model.graph)
            if tensor.data_location == onnx.TensorProto.EXTERNAL}


def _location(tensor: onnx.TensorProto) -> str:
    return next((entry.value for entry in tensor.external_data if entry.key == "location"), "")


def _all_tensors(graph: onnx.GraphProto):
    """Initializers and tensor attributes of a graph and all of its subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            yield from ([attribute.t] if attribute.HasField("t") else [])
            yield from attribute.tensors
            for subgraph in [attribute.g] if attribute.HasField("g") else []:
                yield from _all_tensors(subgraph)
            for subgraph in attribute.graphs:
                yield from _all_tensors(subgraph)


def _unreadable(error: Exception, source: str, code: str, expected: str) -> InputError:
    if "allow_pickle" in str(error):
        return InputError("object_array", f"{source}: holds an array of Python objects; "
                            "flipgate never unpickles data, store plain numeric arrays")
    return InputError(code, f"{source}: not {expected} ({_explain(error)})")


def _require_finite(array: np.ndarray, source: str) -> None:
    """No NaN or infinity, checked a chunk of rows at a time (memory-mapped arrays stay so)."""
    bad = sum(chunk.size - np.count_nonzero(np.isfinite(chunk)) for chunk in row_chunks(array))
    if bad:
        raise InputError("non_finite", f"{source} contains {bad} NaN or infinite values")


def row_chunks(array: np.ndarray, chunk_bytes: int = CHECK_CHUNK_BYTES) -> Iterator[np.ndarray]:
    """Consecutive slices of `array` along its first axis of about `chunk_bytes` each; a
    memory-mapped array's pages are handed back once a slice has been used, so a check over
    a file of any size keeps about one chunk resident."""
    if array.ndim == 0:
        yield array
        return
    row_bytes = max(1, array[:1].nbytes)
    step = max(1, chunk_bytes // row_bytes)
    for start in range(0, array.shape[0], step):
        yield array[start:start + step]
        release(array, start, start + step)


def _existing(path: str | Path, what: str, source: str | None = None) -> Path:
    path = Path(path)
    if not path.is_file():
        raise InputError("file_not_found", f"{source or path}: no such {what} file")
    return path


def _explain(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
