"""What an ONNX classifier takes and gives: its named inputs, the output that holds its
scores, what those scores are (logits or probabilities) and the class labels it carries.

The scores output is an output named logits, probabilities, output_probability or scores if
exactly one is; else the only float output of shape (N, C), (N, 1) or (N,) or the only
ZipMap (a sequence of maps, skl2onnx's and onnxmltools' default). The scores are
probabilities for a ZipMap, a final Softmax or Sigmoid, an ai.onnx.ml classifier op whose
post_transform makes probabilities (or an L1 Normalizer after one), or a float output named
probabilities / output_probability beside a label output; logits otherwise.

A multi-label model (an eval set whose y is a matrix (N, L)) is read the same way, with one
score per label: a float output (N, L), a ZipMap of L keys (skl2onnx's OneVsRestClassifier)
or a sequence of L tensors (N, 2) whose column 1 is each label's probability (skl2onnx's
MultiOutputClassifier); a final Softmax is refused there (its scores are not per label). Its
decision thresholds, one per label, are the JSON list `thresholds` of the model's metadata
when it has one.
"""

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from flipgate import onnx_bytes as proto
from flipgate.errors import InputError
from flipgate.scores import LOGITS, PROBABILITIES, check_score_kind

if TYPE_CHECKING:  # the specs need no onnx (45 ms to import); a model is read with it
    import onnx

SCORE_NAMES = ("logits", "probabilities", "output_probability", "scores")
PROBABILITY_NAMES = ("probabilities", "output_probability")
FLOAT_TYPES = {proto.FLOAT16, proto.FLOAT, proto.DOUBLE}
INPUT_TYPES = {*FLOAT_TYPES, proto.INT32, proto.INT64, proto.BOOL, proto.STRING}
PASS_THROUGH_OPS = {"Identity", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}
PROBABILITY_OPS = {"Softmax", "Sigmoid"}
CLASSIFIER_OPS = {"TreeEnsembleClassifier", "LinearClassifier", "SVMClassifier"}
PROBABILISTIC_TRANSFORMS = {b"SOFTMAX", b"LOGISTIC", b"SOFTMAX_ZERO", b"PROBIT"}
STRING = np.dtype("U")


@dataclass(frozen=True)
class InputSpec:
    """A model input: its name, numpy dtype (STRING for strings) and shape (None: dynamic)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    @property
    def dtype_name(self) -> str:
        return "string" if self.dtype == STRING else self.dtype.name

    def describe(self) -> str:
        dims = ", ".join("N" if dim is None else str(dim) for dim in self.shape)
        return f"{self.name} {self.dtype_name} ({dims})"

    def as_json(self) -> dict[str, object]:
        """The spec as JSON (read back by `from_json`)."""
        return {"name": self.name, "dtype": self.dtype_name, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, spec: dict) -> "InputSpec":
        dtype = STRING if spec["dtype"] == "string" else np.dtype(spec["dtype"])
        return cls(spec["name"], dtype, tuple(spec["shape"]))

    def signature(self) -> tuple:
        """What one eval set array can feed: strings or not, and the per-sample shape."""
        return self.dtype == STRING, self.shape[1:]


@dataclass(frozen=True)
class OutputSpec:
    """The output read as scores: `kind` is logits or probabilities; `zipmap` when it is a
    sequence of maps; `class_labels` are the model's own names of its columns, if it has any
    (`int_labels` when they were integers)."""

    name: str
    kind: str
    num_classes: int
    zipmap: bool = False
    class_labels: tuple[str, ...] | None = None
    int_labels: bool = False
    per_label: bool = False  # a sequence of L tensors (N, 2), column 1 each label's score


def model_inputs(model: "onnx.ModelProto", source: str) -> tuple[InputSpec, ...]:
    """The graph inputs a caller feeds (initializers excluded), of the supported types."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = tuple(_input_spec(value, source) for value in model.graph.input
                   if value.name not in initializers)
    if not inputs:
        raise InputError("onnx_inputs", f"{source}: the model takes no input")
    return inputs


def _input_spec(value: "onnx.ValueInfoProto", source: str) -> InputSpec:
    from onnx import TensorProto, helper  # loaded already: the model was read with it

    tensor_type = value.type.tensor_type
    if not value.type.HasField("tensor_type") or tensor_type.elem_type not in INPUT_TYPES:
        kind = (TensorProto.DataType.Name(tensor_type.elem_type)
                if value.type.HasField("tensor_type") else value.type.WhichOneof("value"))
        raise InputError("onnx_input_type", f"{source}: input {value.name!r} is {kind}; "
                           "inputs must be float16/32/64, int32/64, bool or string tensors")
    dtype = (STRING if tensor_type.elem_type == proto.STRING
             else helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    return InputSpec(value.name, dtype, dims(tensor_type))


def dims(tensor_type: "onnx.TypeProto.Tensor") -> tuple[int | None, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)


def scores_output(model: "onnx.ModelProto", source: str, *, output: str | None = None,
                  scores: str | None = None) -> OutputSpec:
    """The output to read as scores (`output`, else chosen as the module says) and what its
    scores are (`scores`, else detected from the graph)."""
    graph = _Graph(model)
    name = _chosen_output(graph, source, output, multilabel=False)
    kind = check_score_kind(scores) if scores else graph.kind_of(name)
    labels, int_labels = graph.class_labels(name)
    num_classes = len(labels) if graph.is_zipmap(name) else graph.columns(name, labels, source)
    if labels is not None and len(labels) != num_classes:
        labels = None  # the labels belong to another output's columns
    return OutputSpec(name, kind, num_classes, graph.is_zipmap(name), labels, int_labels)


def label_scores_output(model: "onnx.ModelProto", source: str, *, output: str | None = None,
                        scores: str | None = None) -> OutputSpec:
    """A multi-label model's output of one score per label (`output`, else chosen as the
    module says), what its scores are (`scores`, else detected) and its label count."""
    graph = _Graph(model)
    name = _chosen_output(graph, source, output, multilabel=True)
    node = graph.source_node(name)
    if node is not None and node.op_type == "Softmax" and scores is None:
        raise InputError("multilabel_softmax", f"{source}: output {name!r} ends in a Softmax, "
                           "whose scores share one distribution over the labels; a multi-label "
                           "model gives one score per label (a sigmoid or a logit)")
    per_label = graph.is_label_sequence(name)
    probabilities = graph.is_zipmap(name) or per_label
    kind = check_score_kind(scores) if scores else PROBABILITIES if probabilities \
        else graph.kind_of(name)
    labels, int_labels = graph.class_labels(name) if graph.is_zipmap(name) else (None, False)
    num_labels = (len(labels) if graph.is_zipmap(name) else len(node.input) if per_label
                  else graph.columns(name, None, source))
    return OutputSpec(name, kind, num_labels, graph.is_zipmap(name), labels, int_labels,
                      per_label)


def model_thresholds(model: "onnx.ModelProto", source: str) -> tuple[float, ...] | None:
    """The decision threshold of each label that the model's metadata `thresholds` declares
    (a JSON list of numbers in (0, 1)), or None."""
    declared = {prop.key: prop.value for prop in model.metadata_props}.get("thresholds")
    if declared is None:
        return None
    try:
        values = json.loads(declared)
    except ValueError:
        values = None
    return check_thresholds(values, f"{source}: metadata `thresholds`")


def check_thresholds(values: object, source: str) -> tuple[float, ...]:
    """`values` as thresholds: a non-empty list of numbers strictly between 0 and 1."""
    fits = isinstance(values, list | tuple) and values and all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1 for v in values)
    if not fits:
        raise InputError("invalid_thresholds", f"{source}: thresholds must be a list of "
                           f"numbers strictly between 0 and 1, one per label, got {values!r}")
    return tuple(float(v) for v in values)


SHAPES = {False: "(N, C), (N, 1) or (N,)", True: "(N, L) or a sequence of (N, 2) per label"}


def _chosen_output(graph: "_Graph", source: str, output: str | None, *,
                   multilabel: bool) -> str:
    fits = graph.is_label_candidate if multilabel else graph.is_candidate
    candidates = [name for name in graph.outputs if fits(name)]
    if output is not None:
        if output not in candidates:
            raise InputError("onnx_output_unknown", f"{source}: no float scores output named "
                               f"{output!r}; the candidates are {candidates}")
        return output
    if not candidates:
        raise InputError("onnx_output_shape", f"{source}: no output holds float scores of "
                           f"shape {SHAPES[multilabel]} (its outputs: {list(graph.outputs)})")
    named = [name for name in candidates if name in SCORE_NAMES]
    chosen = named if len(named) == 1 else candidates
    if len(chosen) != 1:
        raise InputError("onnx_outputs", f"{source}: cannot tell which output holds the "
                           f"scores among {candidates or list(graph.outputs)}; choose one "
                           "with --output NAME (form field `output` on POST /models)")
    return chosen[0]


class _Graph:
    """The parts of a model's graph that tell its scores apart."""

    def __init__(self, model: "onnx.ModelProto") -> None:
        self.outputs = {value.name: value.type for value in model.graph.output}
        self.producers = {name: node for node in model.graph.node for name in node.output}
        self.nodes = list(model.graph.node)

    def is_zipmap(self, name: str) -> bool:
        return self.outputs[name].HasField("sequence_type") and self.source_node(name) is not None \
            and self.source_node(name).op_type == "ZipMap"

    def is_candidate(self, name: str) -> bool:
        """A ZipMap, or a float tensor of shape (N, C), (N, 1) or (N,)."""
        kind = self.outputs[name]
        if self.is_zipmap(name):
            return True
        return kind.HasField("tensor_type") and kind.tensor_type.elem_type in FLOAT_TYPES \
            and len(kind.tensor_type.shape.dim) in (1, 2)

    def is_label_candidate(self, name: str) -> bool:
        """A ZipMap, a float tensor of shape (N, L) or a sequence of per-label tensors."""
        kind = self.outputs[name]
        if self.is_zipmap(name) or self.is_label_sequence(name):
            return True
        return kind.HasField("tensor_type") and kind.tensor_type.elem_type in FLOAT_TYPES \
            and len(kind.tensor_type.shape.dim) == 2

    def is_label_sequence(self, name: str) -> bool:
        """A sequence of float tensors built by SequenceConstruct (one tensor per label)."""
        kind = self.outputs[name]
        node = self.producers.get(name)
        return kind.HasField("sequence_type") and node is not None \
            and node.op_type == "SequenceConstruct" \
            and kind.sequence_type.elem_type.tensor_type.elem_type in FLOAT_TYPES

    def columns(self, name: str, labels: tuple[str, ...] | None, source: str) -> int:
        """The number of classes of a tensor output: C of (N, C); 2 for (N, 1) and (N,)."""
        shape = dims(self.outputs[name].tensor_type)
        columns = 1 if len(shape) == 1 else shape[1]
        if columns is None and labels is not None:
            return len(labels)
        if columns is None or columns > (1 << 20):
            raise InputError("onnx_output_shape", f"{source}: output {name!r} has shape "
                               f"{tuple('?' if d is None else d for d in shape)}; the number "
                               "of classes must be fixed")
        return 2 if columns == 1 else columns

    def kind_of(self, name: str) -> str:
        """Probabilities or logits, as the module docstring says."""
        node = self.source_node(name)
        beside_label = any(not self.is_candidate(other) for other in self.outputs)
        probable = (self.is_zipmap(name) or (name in PROBABILITY_NAMES and beside_label)
                    or (node is not None and (node.op_type in PROBABILITY_OPS
                                              or _makes_probabilities(node, self))))
        return PROBABILITIES if probable else LOGITS

    def class_labels(self, name: str) -> tuple[tuple[str, ...] | None, bool]:
        """The model's own labels of its columns (a ZipMap's keys, else those of its one
        ai.onnx.ml classifier op) and whether they are integers."""
        source = self.source_node(name)
        holders = [source] if self.is_zipmap(name) else [
            node for node in self.nodes if node.op_type in CLASSIFIER_OPS]
        if len(holders) != 1:
            return None, False
        attributes = {a.name: a for a in holders[0].attribute}
        if "classlabels_strings" in attributes:
            return tuple(s.decode() for s in attributes["classlabels_strings"].strings), False
        if "classlabels_int64s" in attributes:
            return tuple(str(i) for i in attributes["classlabels_int64s"].ints), True
        return None, False

    def source_node(self, name: str) -> "onnx.NodeProto | None":
        """The node that computes `name`, looking through reshapes, casts and identities."""
        node = self.producers.get(name)
        while node is not None and node.op_type in PASS_THROUGH_OPS and node.input:
            node = self.producers.get(node.input[0])
        return node


def _makes_probabilities(node: "onnx.NodeProto", graph: _Graph) -> bool:
    """An ai.onnx.ml classifier op with a probabilistic post_transform, or an L1 Normalizer
    of one (skl2onnx's logistic regression)."""
    attributes = {a.name: a for a in node.attribute}
    if node.op_type in CLASSIFIER_OPS:
        return "post_transform" in attributes \
            and attributes["post_transform"].s in PROBABILISTIC_TRANSFORMS
    if node.op_type == "Normalizer" and attributes.get("norm") is not None:
        upstream = graph.source_node(node.input[0])
        return attributes["norm"].s == b"L1" and upstream is not None \
            and upstream.op_type in CLASSIFIER_OPS
    return False
