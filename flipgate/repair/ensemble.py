"""Ensemble fallback: one graph running both models on the same input, outputting
w·z_old + (1 − w)·z_new, or the log of w·p_old + (1 − w)·p_new with averaged probabilities."""

from pathlib import Path

import numpy as np
import onnx
from onnx import compose, helper, numpy_helper, version_converter

from flipgate.errors import InputError
from flipgate.formats.evalsets import EvalSet
from flipgate.formats.onnx_models import INPUT_NAME, OUTPUT_NAME, OnnxSpec
from flipgate.inference import OnnxClassifier
from flipgate.metrics import softmax
from flipgate.repair.graphs import load_classifier, write_checked
from flipgate.repair.search import (
    DEFAULT_LIMITS,
    Calibration,
    Limits,
    Progress,
    RepairResult,
    smallest_share,
)

PREFIXES = ("old/", "new/")


def ensemble(old: str | Path, new: str | Path, out: str | Path, *, weight: float | None = None,
             calibration: str | Path | EvalSet | None = None, limits: Limits = DEFAULT_LIMITS,
             probabilities: bool = False, progress: Progress | None = None) -> RepairResult:
    """Write the ensemble with the given weight, or with the smallest weight meeting `limits`
    on the calibration set (exactly one of the two must be given)."""
    if (weight is None) == (calibration is None):
        raise InputError("invalid_option", "give either a weight or a calibration set")
    pair = _compatible_pair(old, new)
    curve = []
    if weight is None:
        weight, curve = _chosen_weight(old, new, calibration, limits, probabilities, progress)
    graph = _combined(pair, weight, probabilities)
    return RepairResult("ensemble", weight, curve, write_checked(graph, out),
                        limits if curve else None)


def _chosen_weight(old: str | Path, new: str | Path, calibration: str | Path | EvalSet,
                   limits: Limits, probabilities: bool,
                   progress: Progress | None) -> tuple[float, list]:
    """The smallest weight meeting `limits`, from both models' logits (the mix is linear)."""
    old_model = OnnxClassifier(old, device="cpu")
    reference = Calibration(calibration, old_model)
    new_model = OnnxClassifier(new, device="cpu")
    outputs = [model.predict(reference.data.x) for model in (old_model, new_model)]
    if probabilities:
        outputs = [softmax(logits) for logits in outputs]

    def measure(weight: float):
        return reference.measure(weight, weight * outputs[0] + (1 - weight) * outputs[1])

    return smallest_share(measure, limits, progress)


def ensemble_graph(old: str | Path, new: str | Path, weight: float,
                   probabilities: bool = False) -> onnx.ModelProto:
    """One model: the shared input feeds both (prefixed) graphs, their outputs are mixed."""
    return _combined(_compatible_pair(old, new), weight, probabilities)


Pair = tuple[tuple[onnx.ModelProto, OnnxSpec], tuple[onnx.ModelProto, OnnxSpec]]


def _combined(pair: Pair, weight: float, probabilities: bool) -> onnx.ModelProto:
    if not 0 <= weight <= 1:
        raise InputError("invalid_weight", f"the weight must lie in [0, 1], got {weight}")
    (old_model, old_spec), (new_model, new_spec) = pair
    opset = max(_default_opset(old_model), _default_opset(new_model))
    members = [compose.add_prefix(_converted(model, opset), prefix)
               for model, prefix in zip((old_model, new_model), PREFIXES, strict=True)]
    specs = (old_spec, new_spec)
    nodes = [helper.make_node("Identity", [INPUT_NAME], [prefix + spec.input_name])
             for prefix, spec in zip(PREFIXES, specs, strict=True)]
    outputs = [prefix + spec.output_name for prefix, spec in zip(PREFIXES, specs, strict=True)]
    for member in members:
        nodes += member.graph.node
    nodes += _mixing_nodes(outputs, probabilities)
    graph = helper.make_graph(
        nodes, "flipgate_ensemble",
        [helper.make_tensor_value_info(INPUT_NAME, onnx.TensorProto.FLOAT,
                                       ["batch", *old_spec.input_shape[1:]])],
        [helper.make_tensor_value_info(OUTPUT_NAME, onnx.TensorProto.FLOAT,
                                       ["batch", old_spec.num_classes])],
        [*members[0].graph.initializer, *members[1].graph.initializer, *_weights(weight)],
        value_info=[*members[0].graph.value_info, *members[1].graph.value_info])
    return helper.make_model(graph, opset_imports=_opset_union(members),
                             ir_version=max(m.ir_version for m in members),
                             functions=[*members[0].functions, *members[1].functions],
                             producer_name="flipgate repair ensemble")


def _compatible_pair(old_path: str | Path, new_path: str | Path) -> Pair:
    """Both models, refused unless they take the same input shape and have the same classes."""
    (old_model, old), (new_model, new) = load_classifier(old_path), load_classifier(new_path)
    if old.input_shape[1:] != new.input_shape[1:] or old.num_classes != new.num_classes:
        raise InputError("incompatible_models", f"{old_path} takes {old.input_shape[1:]} and "
                           f"has {old.num_classes} classes, {new_path} takes "
                           f"{new.input_shape[1:]} and has {new.num_classes}: an ensemble needs "
                           "the same input and class count")
    return (old_model, old), (new_model, new)


def _mixing_nodes(outputs: list[str], probabilities: bool) -> list[onnx.NodeProto]:
    """w·a + (1 − w)·b over the two outputs (softmax first and log after, for probabilities)."""
    nodes = []
    if probabilities:
        nodes = [helper.make_node("Softmax", [name], [f"{name}/p"], axis=-1) for name in outputs]
        outputs = [f"{name}/p" for name in outputs]
    nodes += [helper.make_node("Mul", [outputs[0], "ensemble/w_old"], ["ensemble/old_part"]),
              helper.make_node("Mul", [outputs[1], "ensemble/w_new"], ["ensemble/new_part"])]
    mixed = "ensemble/mixed" if probabilities else OUTPUT_NAME
    nodes.append(helper.make_node("Add", ["ensemble/old_part", "ensemble/new_part"], [mixed]))
    if probabilities:
        nodes.append(helper.make_node("Log", [mixed], [OUTPUT_NAME]))
    return nodes


def _weights(weight: float) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.array(weight, np.float32), "ensemble/w_old"),
            numpy_helper.from_array(np.array(1 - weight, np.float32), "ensemble/w_new")]


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _converted(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """The model at the default-domain `opset` (converted up when it is older)."""
    if _default_opset(model) == opset:
        return model
    try:
        return version_converter.convert_version(model, opset)
    except Exception as error:  # the converter raises its own types for unsupported ops
        raise InputError("opset_mismatch", f"the models use different ONNX opsets and one "
                           f"cannot be converted to opset {opset} ({error})") from error


def _opset_union(models: list[onnx.ModelProto]) -> list[onnx.OperatorSetIdProto]:
    versions: dict[str, int] = {}
    for model in models:
        for opset in model.opset_import:
            versions[opset.domain] = max(versions.get(opset.domain, 0), opset.version)
    return [helper.make_opsetid(domain, version) for domain, version in versions.items()]
