"""A plain supervised training loop (cross-entropy) with a config saved beside its result."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from flipgate.formats import EvalSet
from flipgate.train.zoo import build_model

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of one training run; stored with the model it produced."""

    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(f"invalid training config {self}")


def default_device() -> torch.device:
    """The GPU when torch sees one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train_classifier(
    model: nn.Module, x: np.ndarray, y: np.ndarray, config: TrainConfig,
    progress: Progress | None = None,
) -> nn.Module:
    """Train `model` with Adam on cross-entropy; deterministic for a given config.seed."""
    device = default_device()
    generator = torch.Generator().manual_seed(config.seed)
    model = model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    inputs, targets = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    steps_per_epoch = -(-len(y) // config.batch_size)
    total = config.epochs * steps_per_epoch
    for step in range(total):
        if step % steps_per_epoch == 0:
            order = torch.randperm(len(y), generator=generator).to(device)
        batch = order[(step % steps_per_epoch) * config.batch_size :][: config.batch_size]
        loss = nn.functional.cross_entropy(model(inputs[batch]), targets[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if progress:
            progress(step + 1, total)
    return model.eval()



def train_new_model(
    arch: str, data: EvalSet, num_classes: int, config: TrainConfig,
    progress: Progress | None = None,
) -> nn.Module:
    """Initialise architecture `arch` from config.seed and train it on `data`."""
    torch.manual_seed(config.seed)
    model = build_model(arch, data.sample_shape, num_classes)
    return train_classifier(model, data.x, data.y, config, progress)
