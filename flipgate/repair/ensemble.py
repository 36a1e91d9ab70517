"""Ensemble fallback: one graph running both models on the same input, outputting
w·z_old + (1 − w)·z_new, or the log of w·p_old + (1 − w)·p_new with averaged probabilities.

Multi-label models (one logit per label): averaged logits as above, or, with averaged
probabilities, per label the logit of p = w·σ(z_old) + (1 − w)·σ(z_new), computed as
log p − log(w·σ(−z_old) + (1 − w)·σ(−z_new)) so that p near 0 or 1 loses no precision; the
graph carries the mixed thresholds (flipgate.repair.graphs.mixed_thresholds)."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import compose, helper, numpy_helper, version_converter

from flipgate.errors import InputError
from flipgate.formats.evalsets import EvalSet
from flipgate.formats.onnx_models import INPUT_NAME, OUTPUT_NAME, OnnxSpec
from flipgate.inference import OnnxClassifier
from flipgate.metrics import softmax
from flipgate.repair.graphs import (
    Declared,
    load_classifier,
    mixed_thresholds,
    with_thresholds,
    write_checked,
)
from flipgate.repair.search import (
    DEFAULT_LIMITS,
    Calibration,
    LabelCalibration,
    Limits,
    Progress,
    RepairResult,
    calibration_for,
    calibration_set,
    smallest_share,
)
from flipgate.scores import LOGITS, PROBABILITY_FLOOR, label_probabilities

PREFIXES = ("old/", "new/")


def ensemble(old: str | Path, new: str | Path, out: str | Path, *, weight: float | None = None,
             calibration: str | Path | EvalSet | None = None, limits: Limits = DEFAULT_LIMITS,
             probabilities: bool = False, multilabel: bool = False,
             thresholds: Declared | None = None,
             progress: Progress | None = None) -> RepairResult:
    """Write the ensemble with the given weight, or with the smallest weight meeting `limits`
    on the calibration set (exactly one of the two must be given). The models are multi-label
    when `multilabel` says so or the calibration set is (see flipgate.repair.search); then
    `thresholds` (old, new) replace what their metadata declares."""
    if (weight is None) == (calibration is None):
        raise InputError("invalid_option", "give either a weight or a calibration set")
    pair = _compatible_pair(old, new)
    data = None if calibration is None else calibration_set(calibration, multilabel=multilabel)
    mixing = Mixing(probabilities, multilabel or (data is not None and data.multilabel))
    mixed = mixed_thresholds(pair[0][0], pair[1][0], mixing.multilabel, thresholds)
    curve = []
    if data is not None:
        weight, curve = _chosen_weight(old, new, calibration_for(data, old, mixed),
                                       mixing, limits, progress)
    graph = with_thresholds(_combined(pair, weight, mixing), mixed(weight))
    return RepairResult("ensemble", weight, curve, write_checked(graph, out),
                        limits if curve else None)


@dataclass(frozen=True)
class Mixing:
    """What the ensemble averages: logits, or probabilities (a softmax over classes, or a
    sigmoid per label for multi-label models)."""

    probabilities: bool = False
    multilabel: bool = False

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """What is averaged, from one model's logits: multi-label probabilities as the pair
        (σ(z), σ(−z)) stacked on a first axis."""
        if not self.probabilities:
            return logits
        if self.multilabel:
            return np.stack([label_probabilities(logits, LOGITS),
                             label_probabilities(-logits, LOGITS)])
        return softmax(logits)

    def output(self, mixed: np.ndarray) -> np.ndarray:
        """The ensemble's output from the averaged scores (argmax-equivalent for a softmax)."""
        if not (self.probabilities and self.multilabel):
            return mixed
        present, absent = np.log(np.maximum(mixed, PROBABILITY_FLOOR))
        return present - absent


def _chosen_weight(old: str | Path, new: str | Path, reference: Calibration | LabelCalibration,
                   mixing: Mixing, limits: Limits,
                   progress: Progress | None) -> tuple[float, list]:
    """The smallest weight meeting `limits`, from both models' scores (the mix is linear)."""
    outputs = [mixing.scores(OnnxClassifier(path, device="cpu").predict(reference.data.x))
               for path in (old, new)]

    def measure(weight: float):
        mixed = weight * outputs[0] + (1 - weight) * outputs[1]
        return reference.measure(weight, mixing.output(mixed))

    return smallest_share(measure, limits, progress)


def ensemble_graph(old: str | Path, new: str | Path, weight: float,
                   probabilities: bool = False, multilabel: bool = False) -> onnx.ModelProto:
    """One model: the shared input feeds both (prefixed) graphs, their outputs are mixed
    (multi-label: per label, with the mixed thresholds)."""
    pair = _compatible_pair(old, new)
    mixing = Mixing(probabilities, multilabel)
    thresholds = mixed_thresholds(pair[0][0], pair[1][0], multilabel)
    return with_thresholds(_combined(pair, weight, mixing), thresholds(weight))


Pair = tuple[tuple[onnx.ModelProto, OnnxSpec], tuple[onnx.ModelProto, OnnxSpec]]


def _combined(pair: Pair, weight: float, mixing: Mixing) -> onnx.ModelProto:
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
    nodes += _mixing_nodes(outputs, mixing)
    graph = helper.make_graph(
        nodes, "flipgate_ensemble",
        [helper.make_tensor_value_info(INPUT_NAME, onnx.TensorProto.FLOAT,
                                       ["batch", *old_spec.input_shape[1:]])],
        [helper.make_tensor_value_info(OUTPUT_NAME, onnx.TensorProto.FLOAT,
                                       ["batch", old_spec.num_classes])],
        [*members[0].graph.initializer, *members[1].graph.initializer,
         *_weights(weight, mixing)],
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


def _mixing_nodes(outputs: list[str], mixing: Mixing) -> list[onnx.NodeProto]:
    """w·a + (1 − w)·b over the two outputs (softmax first and log after, for probabilities;
    per label for multi-label probabilities, see the module's docstring)."""
    if not mixing.probabilities:
        return _weighted_sum(outputs, OUTPUT_NAME, "ensemble")
    if not mixing.multilabel:
        nodes = [helper.make_node("Softmax", [name], [f"{name}/p"], axis=-1) for name in outputs]
        nodes += _weighted_sum([f"{name}/p" for name in outputs], "ensemble/mixed", "ensemble")
        return [*nodes, helper.make_node("Log", ["ensemble/mixed"], [OUTPUT_NAME])]
    nodes = []
    for name in outputs:
        nodes += [helper.make_node("Sigmoid", [name], [f"{name}/present"]),
                  helper.make_node("Neg", [name], [f"{name}/negated"]),
                  helper.make_node("Sigmoid", [f"{name}/negated"], [f"{name}/absent"])]
    for side in ("present", "absent"):
        nodes += _weighted_sum([f"{name}/{side}" for name in outputs], f"ensemble/{side}",
                               f"ensemble/{side}")
        nodes += [helper.make_node("Max", [f"ensemble/{side}", "ensemble/floor"],
                                   [f"ensemble/{side}/floored"]),
                  helper.make_node("Log", [f"ensemble/{side}/floored"], [f"ensemble/{side}/log"])]
    return [*nodes, helper.make_node("Sub", ["ensemble/present/log", "ensemble/absent/log"],
                                     [OUTPUT_NAME])]


def _weighted_sum(inputs: list[str], output: str, stem: str) -> list[onnx.NodeProto]:
    """output = w_old·inputs[0] + w_new·inputs[1], the parts named after `stem`."""
    return [helper.make_node("Mul", [inputs[0], "ensemble/w_old"], [f"{stem}/old_part"]),
            helper.make_node("Mul", [inputs[1], "ensemble/w_new"], [f"{stem}/new_part"]),
            helper.make_node("Add", [f"{stem}/old_part", f"{stem}/new_part"], [output])]


def _weights(weight: float, mixing: Mixing) -> list[onnx.TensorProto]:
    """The two weights, and the probability floor where multi-label probabilities are mixed."""
    floor = [numpy_helper.from_array(np.array(PROBABILITY_FLOOR, np.float32), "ensemble/floor")]
    return [numpy_helper.from_array(np.array(weight, np.float32), "ensemble/w_old"),
            numpy_helper.from_array(np.array(1 - weight, np.float32), "ensemble/w_new"),
            *(floor if mixing.probabilities and mixing.multilabel else [])]


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
