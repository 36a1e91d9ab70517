"""ONNX classifiers, parsed and validated without being run: the inputs they are fed, the
output read as scores (flipgate.onnx_io), bounded dimensions, external data only in the
model's own folder."""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flipgate import onnx_bytes as proto
from flipgate.errors import InputError
from flipgate.formats.evalsets import check_sample_size
from flipgate.formats.files import existing_file, first_line
from flipgate.onnx_io import (
    InputSpec,
    OutputSpec,
    label_scores_output,
    model_inputs,
    model_thresholds,
    scores_output,
)

if TYPE_CHECKING:  # imported where a model is read: 45 ms that .npy files never need
    import onnx

MAX_FIXED_BATCH = 1 << 16  # a model that insists on a larger batch cannot be scored
MAX_INITIALIZERS = 100_000
INPUT_NAME, OUTPUT_NAME = "input", "logits"  # what flipgate's own exports call them


@dataclass(frozen=True)
class OnnxSpec:
    """The interface of an ONNX classifier: its named inputs, the output read as scores and,
    for a multi-label model, the thresholds its metadata declares (None: none)."""

    inputs: tuple[InputSpec, ...]
    output: OutputSpec
    thresholds: tuple[float, ...] | None = None

    @property
    def input_name(self) -> str:
        return self.inputs[0].name

    @property
    def input_shape(self) -> tuple[int | None, ...]:
        return self.inputs[0].shape

    @property
    def output_name(self) -> str:
        return self.output.name

    @property
    def num_classes(self) -> int:
        return self.output.num_classes

    @property
    def fixed_batch(self) -> int | None:
        """The batch size the model insists on, or None when the batch axis is dynamic."""
        return self.inputs[0].shape[0]

    def check_sample_shape(self, sample_shape: tuple[int, ...], *, source: str) -> None:
        """Refuse samples whose shape the (first) input cannot take."""
        check_input_shape(self.inputs[0], sample_shape, source=source)

    def describe(self) -> dict[str, object]:
        """Which inputs it is fed, which output is read and as what (for reports)."""
        return {"inputs": [spec.describe() for spec in self.inputs],
                "output": self.output.name, "scores": self.output.kind}


def check_input_shape(spec: InputSpec, sample_shape: tuple[int, ...], *, source: str) -> None:
    """Refuse samples whose shape the model input `spec` cannot take."""
    expected = spec.shape[1:]
    fits = len(expected) == len(sample_shape) and all(
        want is None or want == got for want, got in zip(expected, sample_shape, strict=True))
    if not fits:
        shown = tuple("N" if d is None else d for d in spec.shape)
        raise InputError("onnx_input_shape", f"{source}: the model's input {spec.name!r} has "
                           f"shape {shown} but the eval set's samples have shape "
                           f"{sample_shape}")


def inspect_onnx(path: str | Path, *, source: str | None = None, output: str | None = None,
                 scores: str | None = None, multilabel: bool = False) -> OnnxSpec:
    """Parse and validate an ONNX classifier without running it; `output` and `scores`
    override the chosen scores output and what its scores are (see flipgate.onnx_io);
    `multilabel` reads one score per label; messages name it `source`."""
    import onnx

    path = existing_file(path, "model", source)
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
                           f"({first_line(error)})") from error
    inputs = model_inputs(model, source)
    for spec in inputs:
        _check_input_dims(spec.shape, f"{source}: input {spec.name!r}")
    if multilabel:
        return OnnxSpec(inputs, label_scores_output(model, source, output=output, scores=scores),
                        model_thresholds(model, source))
    return OnnxSpec(inputs, scores_output(model, source, output=output, scores=scores))


def _check_initializer_count(model: "onnx.ModelProto", source: str) -> None:
    count = len(model.graph.initializer)
    if count > MAX_INITIALIZERS:
        raise InputError("onnx_too_many_initializers", f"{source}: {count} initializers, "
                           f"above the limit of {MAX_INITIALIZERS}")


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
    check_sample_size(tuple(dim or 1 for dim in dims[1:]), source)


def _check_external_data(model: "onnx.ModelProto", path: Path, source: str) -> None:
    """External tensors must be files inside the model's own folder."""
    folder = path.parent.resolve()
    for tensor in _all_tensors(model.graph):
        if tensor.data_location != proto.EXTERNAL:
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
    import onnx

    path = existing_file(path, "model", source)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf raises many types for corrupt input
        raise InputError("onnx_corrupt", f"{source or path}: not a valid ONNX model "
                           f"({first_line(error)})") from error
    return {_location(tensor) for tensor in _all_tensors(model.graph)
            if tensor.data_location == proto.EXTERNAL}


def _location(tensor: "onnx.TensorProto") -> str:
    return next((entry.value for entry in tensor.external_data if entry.key == "location"), "")


def _all_tensors(graph: "onnx.GraphProto"):
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

