"""Loading, running and writing the ONNX graphs a repair reads and produces."""

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx

from flipgate.errors import InputError
from flipgate.formats.onnx_models import OnnxSpec, inspect_onnx
from flipgate.inference import OnnxClassifier
from flipgate.metrics.multilabel import DEFAULT_THRESHOLD
from flipgate.onnx_io import model_thresholds
from flipgate.scores import LOGITS

Thresholds = Callable[[float], np.ndarray | None]  # a repair's per-label thresholds at a share
Declared = tuple[Sequence[float] | None, Sequence[float] | None]  # the old and new model's


def load_classifier(path: str | Path) -> tuple[onnx.ModelProto, OnnxSpec]:
    """A validated ONNX classifier (external data inside its folder loaded) and its interface;
    repairs rewrite graphs of one float input and one logits tensor output only."""
    spec = inspect_onnx(path)
    if len(spec.inputs) != 1 or spec.inputs[0].dtype != np.float32 \
            or spec.output.kind != LOGITS or spec.output.zipmap:
        raise InputError("repair_unsupported_model", f"{path}: a repair rewrites models of one "
                           "float32 input and a logits output; this one takes "
                           f"{[i.describe() for i in spec.inputs]} and its output "
                           f"{spec.output_name!r} holds {spec.output.kind}")
    return onnx.load(str(path)), spec


def logits_of(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """Run an in-memory model on the CPU through ONNX Runtime; logits (N, C)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        onnx.save(model, str(path))
        return OnnxClassifier(path, device="cpu").predict(x)


def write_checked(model: onnx.ModelProto, out: str | Path) -> Path:
    """Check the model with onnx.checker (full, with shape inference) and write it."""
    out = Path(out)
    if out.suffix != ".onnx":
        raise InputError("invalid_output", f"--out must name an .onnx file, got {out}")
    onnx.checker.check_model(model, full_check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    return out


def mixed_thresholds(old: onnx.ModelProto, new: onnx.ModelProto, multilabel: bool,
                     declared: Declared | None = None) -> Thresholds:
    """A multi-label repair's thresholds at the old model's share s: s·t_old + (1 − s)·t_new
    per label, t being what `declared` gives, else what each model's metadata declares (0.5
    where none is), so that each end decides as its model does; None (0.5 everywhere) when
    neither declares any, and for a single-label repair."""
    if declared is None:
        declared = tuple(model_thresholds(model, name)
                         for model, name in ((old, "old"), (new, "new")))
    declared = [None if values is None else list(values) for values in declared]
    if not multilabel or declared == [None, None]:
        return lambda share: None
    count = len(next(values for values in declared if values is not None))
    t_old, t_new = (np.full(count, DEFAULT_THRESHOLD) if values is None
                    else np.asarray(values) for values in declared)
    if len(t_old) != len(t_new):
        raise InputError("invalid_thresholds", f"the old model declares {len(t_old)} "
                         f"thresholds, the new one {len(t_new)}: one per label each")
    return lambda share: share * t_old + (1 - share) * t_new


def with_thresholds(model: onnx.ModelProto, thresholds: np.ndarray | None) -> onnx.ModelProto:
    """`model` with its metadata `thresholds` set to these (removed when None)."""
    props = {prop.key: prop.value for prop in model.metadata_props if prop.key != "thresholds"}
    if thresholds is not None:
        props["thresholds"] = json.dumps([float(value) for value in thresholds])
    onnx.helper.set_model_props(model, props)
    return model
