"""Exporting torch classifiers to ONNX: single models and averaged ensembles."""

import warnings
from pathlib import Path

import torch
from torch import nn

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
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
        # The TorchScript-based exporter: fast, and it needs no onnxscript.
        torch.onnx.export(
            model, (example,), str(path), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=OPSET, dynamo=False,
        )
    return path

