"""Exporting torch classifiers to ONNX (single models and averaged ensembles) and reading an
exported model's weights back into a torch module (warm starts)."""

import warnings
from pathlib import Path

import onnx
import torch
from onnx import numpy_helper
from torch import nn

from flipgate.errors import InputError
from flipgate.formats.onnx_models import INPUT_NAME, OUTPUT_NAME, inspect_onnx

OPSET = 17


class AveragedEnsemble(nn.Module):
    """Averages the logits of its members: an ensemble deployed as one graph."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([member(x) for member in self.members]).mean(dim=0)


def export_onnx(model: nn.Module, sample_shape: tuple[int, ...], path: str | Path) -> Path:
    """Write `model` as an ONNX classifier with a dynamic batch axis; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval().cpu()
    example = torch.zeros((2, *sample_shape), dtype=torch.float32)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # GroupNorm's batch-size check
        # The TorchScript-based exporter: fast, and it needs no onnxscript. Every parameter
        # keeps its state_dict name (read_weights relies on it): no constant folding, and
        # initializers kept as inputs, which skips merging parameters of equal values.
        torch.onnx.export(
            model, (example,), str(path), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=OPSET, dynamo=False, do_constant_folding=False,
            keep_initializers_as_inputs=True,
        )
    _drop_initializer_inputs(path)
    return path


def _drop_initializer_inputs(path: Path) -> None:
    """Leave the sample batch as the graph's only input (initializers become constants)."""
    model = onnx.load(str(path))
    initializers = {tensor.name for tensor in model.graph.initializer}
    kept = [value for value in model.graph.input if value.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    onnx.save(model, str(path))


def read_weights(path: str | Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of `model` filled from the ONNX initializers of the same names; refuses a
    model whose weights are missing from the file or shaped otherwise."""
    inspect_onnx(path)  # a valid classifier, external data only inside its folder
    stored = {tensor.name: tensor for tensor in onnx.load(str(path)).graph.initializer}
    state = {}
    for name, expected in model.state_dict().items():
        if name not in stored:
            raise InputError("init_mismatch", f"{path} has no weight named {name!r}: --init "
                               "needs a model flipgate exported from the same architecture")
        value = torch.from_numpy(numpy_helper.to_array(stored[name]).copy())
        if value.shape != expected.shape:
            raise InputError("init_mismatch", f"weight {name!r} is shaped "
                               f"{tuple(value.shape)} in {path} but {tuple(expected.shape)} in "
                               "this architecture")
        state[name] = value.to(expected.dtype)
    return state

