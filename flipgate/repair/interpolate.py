"""Weight interpolation: θ(α) = α·θ_old + (1 − α)·θ_new for two graphs of identical structure."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from flipgate.errors import InputError
from flipgate.formats.evalsets import EvalSet
from flipgate.repair.graphs import (
    Declared,
    load_classifier,
    logits_of,
    mixed_thresholds,
    with_thresholds,
    write_checked,
)
from flipgate.repair.search import (
    DEFAULT_LIMITS,
    Limits,
    Progress,
    RepairResult,
    calibration_for,
    calibration_set,
    smallest_share,
)

FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


def interpolate(old: str | Path, new: str | Path, calibration: str | Path | EvalSet,
                out: str | Path, limits: Limits = DEFAULT_LIMITS,
                progress: Progress | None = None, *,
                thresholds: Declared | None = None) -> RepairResult:
    """Write the interpolation with the smallest α meeting `limits` on the calibration set.

    A multi-label calibration set (y a 0/1 matrix (N, L)) measures the curve per label
    (flipgate.repair.search) and the model written carries the mixed thresholds at α
    (flipgate.repair.graphs.mixed_thresholds; `thresholds` (old, new) replace what the models'
    metadata declares)."""
    old_model, new_model = same_structure(old, new)
    data = calibration_set(calibration)
    mixed = mixed_thresholds(old_model, new_model, data.multilabel, thresholds)
    reference = calibration_for(data, old, mixed)
    blend = _blender(old_model, new_model)

    def measure(alpha: float):
        return reference.measure(alpha, logits_of(blend(alpha), data.x))

    alpha, curve = smallest_share(measure, limits, progress)
    path = write_checked(with_thresholds(blend(alpha), mixed(alpha)), out)
    return RepairResult("interpolate", alpha, curve, path, limits)


def interpolate_graph(old: str | Path, new: str | Path, alpha: float,
                      multilabel: bool = False) -> onnx.ModelProto:
    """The new model's graph with every float initializer set to α·θ_old + (1 − α)·θ_new
    (multi-label: with the mixed thresholds at α)."""
    old_model, new_model = same_structure(old, new)
    thresholds = mixed_thresholds(old_model, new_model, multilabel)
    return with_thresholds(_blender(old_model, new_model)(alpha), thresholds(alpha))


def _blender(old: onnx.ModelProto, new: onnx.ModelProto,
             ) -> Callable[[float], onnx.ModelProto]:
    """A function of α building the interpolated model (the float pairs are read once)."""
    pairs = {tensor.name: (numpy_helper.to_array(tensor), numpy_helper.to_array(other))
             for tensor, other in zip(old.graph.initializer, _by_name(new, old), strict=True)
             if tensor.data_type in FLOAT_TYPES}

    def blend(alpha: float) -> onnx.ModelProto:
        if not 0 <= alpha <= 1:
            raise InputError("invalid_alpha", f"α must lie in [0, 1], got {alpha}")
        model = onnx.ModelProto()
        model.CopyFrom(new)
        for tensor in model.graph.initializer:
            if tensor.name in pairs:
                theta_old, theta_new = pairs[tensor.name]
                mixed = theta_old.dtype.type(alpha) * theta_old \
                    + theta_old.dtype.type(1 - alpha) * theta_new
                tensor.CopyFrom(numpy_helper.from_array(mixed, tensor.name))
        return model

    return blend


def _by_name(model: onnx.ModelProto, like: onnx.ModelProto) -> list[onnx.TensorProto]:
    """`model`'s initializers in the order of `like`'s."""
    tensors = {tensor.name: tensor for tensor in model.graph.initializer}
    return [tensors[tensor.name] for tensor in like.graph.initializer]


def same_structure(old: str | Path, new: str | Path) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Both models, refused unless they have the same nodes, inputs, outputs, opsets and
    initializers (names, shapes, dtypes; non-float initializers equal)."""
    (old_model, _), (new_model, _) = load_classifier(old), load_classifier(new)
    difference = _first_difference(old_model, new_model)
    if difference:
        raise InputError("structure_mismatch", f"{old} and {new} cannot be interpolated: "
                           f"{difference}; interpolation needs two versions of one "
                           "architecture (use `flipgate repair ensemble` for any two models)")
    return old_model, new_model


def _first_difference(old: onnx.ModelProto, new: onnx.ModelProto) -> str | None:
    """A description of the first structural difference between the models, or None."""
    checks = (
        ("opsets", _opsets(old), _opsets(new)),
        ("inputs", list(old.graph.input), list(new.graph.input)),
        ("outputs", list(old.graph.output), list(new.graph.output)),
        ("node count", len(old.graph.node), len(new.graph.node)),
    )
    for what, mine, theirs in checks:
        if mine != theirs:
            return f"their {what} differ"
    for index, (mine, theirs) in enumerate(zip(old.graph.node, new.graph.node, strict=True)):
        if _node_key(mine) != _node_key(theirs):
            return f"node {index} differs ({mine.op_type} {mine.name!r} vs {theirs.op_type} " \
                   f"{theirs.name!r})"
    return _initializer_difference(old, new)


def _initializer_difference(old: onnx.ModelProto, new: onnx.ModelProto) -> str | None:
    names = {tensor.name for tensor in old.graph.initializer}
    others = {tensor.name: tensor for tensor in new.graph.initializer}
    if names != set(others):
        return f"initializer names differ ({sorted(names ^ set(others))[:3]} ...)"
    for tensor in old.graph.initializer:
        other = others[tensor.name]
        if (tensor.data_type, list(tensor.dims)) != (other.data_type, list(other.dims)):
            return f"initializer {tensor.name!r} has another shape or dtype"
        if tensor.data_type not in FLOAT_TYPES and not np.array_equal(
                numpy_helper.to_array(tensor), numpy_helper.to_array(other)):
            return f"non-float initializer {tensor.name!r} holds other values"
    return None


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {opset.domain: opset.version for opset in model.opset_import}


def _node_key(node: onnx.NodeProto) -> tuple:
    """What a node computes and on which tensors (its name is free)."""
    return (node.op_type, node.domain, list(node.input), list(node.output),
            [attribute.SerializeToString() for attribute in node.attribute])
