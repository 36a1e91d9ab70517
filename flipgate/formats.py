"""Reading and validating what users hand to flipgate: eval sets, logits and ONNX models.

Nothing here unpickles: arrays are read with allow_pickle=False and ONNX files are parsed
as protobuf. Every refusal is an InputError with a machine-readable code.
"""

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from flipgate.errors import InputError

NUMPY_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile)


@dataclass(frozen=True)
class EvalSet:
    """A labeled evaluation set: float32 inputs x (N, ...) and int64 labels y (N,)."""

    x: np.ndarray
    y: np.ndarray

    @property
    def n(self) -> int:
        return int(self.y.size)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])


def load_evalset(path: str | Path) -> EvalSet:
    """Load an eval set .npz with arrays `x` (float, first axis N) and `y` (integer labels)."""
    path = _existing(path, "eval set")
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise InputError("evalset_not_npz", f"{path}: expected an .npz archive holding "
                               "arrays 'x' and 'y', found a single array")
        with archive:
            missing = {"x", "y"} - set(archive.files)
            if missing:
                raise InputError("evalset_missing_array", f"{path}: the archive has no "
                                   f"array {' or '.join(sorted(missing))!r} (it has "
                                   f"{sorted(archive.files)})")
            x, y = archive["x"], archive["y"]
    except NUMPY_READ_ERRORS as error:
        raise _unreadable(error, path, "evalset_corrupt", "a readable .npz archive") from error
    return validate_evalset(x, y, source=str(path))


def validate_evalset(x: np.ndarray, y: np.ndarray, *, source: str = "eval set") -> EvalSet:
    """Check shapes, dtypes and values of an eval set held in memory."""
    if x.ndim < 1 or not np.issubdtype(x.dtype, np.floating):
        raise InputError("evalset_x_dtype", f"{source}: x must be a float array with the "
                           f"samples on the first axis, got {x.dtype} with shape {x.shape}")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise InputError("evalset_y_dtype", f"{source}: y must be a 1-D array of integer "
                           f"labels, got {y.dtype} with shape {y.shape}")
    if x.shape[0] != y.size:
        raise InputError("length_mismatch", f"{source}: x has {x.shape[0]} samples but y "
                           f"has {y.size} labels")
    if y.size == 0:
        raise InputError("empty", f"{source}: the eval set has no samples")
    _require_finite(x, f"{source}: x")
    check_labels(y, None, source=source)
    return EvalSet(x=np.ascontiguousarray(x, dtype=np.float32), y=y.astype(np.int64))


def check_labels(labels: np.ndarray, num_classes: int | None, *, source: str) -> None:
    """Labels must lie in [0, num_classes) (only >= 0 when num_classes is None)."""
    bad = labels < 0 if num_classes is None else (labels < 0) | (labels >= num_classes)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        allowed = "be >= 0" if num_classes is None else f"lie in [0, {num_classes})"
        raise InputError("labels_out_of_range", f"{source}: labels must {allowed}; label "
                           f"{int(labels[first])} at index {first} does not")


def load_logits(path: str | Path) -> np.ndarray:
    """Load (N, C) float logits from a .npy file."""
    path = _existing(path, "logits")
    try:
        logits = np.load(path, allow_pickle=False)
    except NUMPY_READ_ERRORS as error:
        raise _unreadable(error, path, "logits_corrupt", "a readable .npy array") from error
    if not isinstance(logits, np.ndarray):
        logits.close()
        raise InputError("logits_not_npy", f"{path}: expected one .npy array of logits, "
                           "found an .npz archive")
    return validate_logits(logits, source=str(path))


def validate_logits(logits: np.ndarray, *, source: str = "logits") -> np.ndarray:
    """Logits must be a finite float array of shape (N, C) with N >= 1 and C >= 2."""
    if not np.issubdtype(logits.dtype, np.floating):
        raise InputError("logits_dtype", f"{source}: logits must be floats, got {logits.dtype}")
    if logits.ndim != 2 or logits.shape[0] == 0 or logits.shape[1] < 2:
        raise InputError("logits_shape", f"{source}: logits must have shape (N, C) with "
                           f"N >= 1 and C >= 2, got {logits.shape}")
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


def inspect_onnx(path: str | Path) -> OnnxSpec:
    """Parse and validate an ONNX classifier without running it."""
    path = _existing(path, "model")
    try:
        model = onnx.load(str(path), load_external_data=False)
        _check_external_data(model, path)
        onnx.checker.check_model(model)
    except InputError:
        raise
    except Exception as error:  # protobuf and checker raise many types for corrupt input
        raise InputError("onnx_corrupt", f"{path}: not a valid ONNX model "
                           f"({_explain(error)})") from error
    return OnnxSpec(*_single_input(model, path), *_logits_output(model, path))


def _single_input(model: onnx.ModelProto, path: Path) -> tuple[str, tuple[int | None, ...]]:
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    if len(inputs) != 1:
        raise InputError("onnx_inputs", f"{path}: a classifier must have exactly one input, "
                           f"this model has {len(inputs)}")
    tensor_type = inputs[0].type.tensor_type
    if tensor_type.elem_type != onnx.TensorProto.FLOAT:
        kind = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
        raise InputError("onnx_input_type", f"{path}: the input must be float32, not {kind}")
    return inputs[0].name, _dims(tensor_type)


def _logits_output(model: onnx.ModelProto, path: Path) -> tuple[str, int]:
    outputs = model.graph.output
    if len(outputs) != 1:
        raise InputError("onnx_outputs", f"{path}: a classifier must have exactly one output "
                           f"(logits), this model has {len(outputs)}")
    dims = _dims(outputs[0].type.tensor_type)
    if len(dims) != 2 or dims[1] is None or dims[1] < 2:
        shown = tuple("?" if d is None else d for d in dims)
        raise InputError("onnx_output_shape", f"{path}: the output must be logits of shape "
                           f"(N, C) with a fixed C >= 2, got {shown}")
    return outputs[0].name, dims[1]


def _dims(tensor_type: onnx.TypeProto.Tensor) -> tuple[int | None, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)


def _check_external_data(model: onnx.ModelProto, path: Path) -> None:
    """External tensors must be files inside the model's own folder."""
    folder = path.parent.resolve()
    for tensor in _all_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not target.is_relative_to(folder) or target == folder:
            raise InputError("onnx_external_data", f"{path}: tensor {tensor.name!r} points "
                               f"to external data {location!r} outside the model's folder")
        if not target.is_file():
            raise InputError("onnx_external_data", f"{path}: tensor {tensor.name!r} needs "
                               f"external data file {location!r}, which does not exist")


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


def _unreadable(error: Exception, path: Path, code: str, expected: str) -> InputError:
    if "allow_pickle" in str(error):
        return InputError("object_array", f"{path}: holds an array of Python objects; "
                            "flipgate never unpickles data, store plain numeric arrays")
    return InputError(code, f"{path}: not {expected} ({_explain(error)})")


def _require_finite(array: np.ndarray, source: str) -> None:
    bad = np.size(array) - np.count_nonzero(np.isfinite(array))
    if bad:
        raise InputError("non_finite", f"{source} contains {bad} NaN or infinite values")


def _existing(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise InputError("file_not_found", f"{path}: no such {what} file")
    return path


def _explain(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
