"""Loading, running and writing the ONNX graphs a repair reads and produces."""

import tempfile
from pathlib import Path

import numpy as np
import onnx

from flipgate.errors import InputError
from flipgate.formats.onnx_models import OnnxSpec, inspect_onnx
from flipgate.inference import OnnxClassifier
from flipgate.scores import LOGITS


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
