"""The training loop every recipe uses: Adam over a ModelStack, one loss per step."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from flipgate.formats.evalsets import EvalSet
from flipgate.progress import Progress
from flipgate.train.config import TrainConfig
from flipgate.train.losses import as_classes
from flipgate.train.stack import ModelStack


@dataclass(frozen=True)
class Batch:
    """One step's data for a stack of m members: x (m, B, ...), indices (m, B), y (m, B) class
    indices or, multi-label, (m, B, L) label matrices."""

    x: Tensor
    y: Tensor
    indices: Tensor
    step: int


StackLoss = Callable[[Tensor, Batch], Tensor]


def default_device() -> torch.device:
    """The GPU when torch sees one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def batch_orders(samples: int, config: TrainConfig, order_seeds: list[int],
                 device: torch.device) -> Iterator[Tensor]:
    """(m, B) sample indices per step: member i reshuffles every epoch with order_seeds[i]."""
    generators = [torch.Generator().manual_seed(seed) for seed in order_seeds]
    for _ in range(config.epochs):
        orders = torch.stack([torch.randperm(samples, generator=g) for g in generators])
        orders = orders.to(device)
        for start in range(0, samples, config.batch_size):
            yield orders[:, start : start + config.batch_size]


def fit(stack: ModelStack, data: EvalSet, config: TrainConfig, loss: StackLoss, *,
        order_seeds: list[int], progress: Progress | None = None) -> ModelStack:
    """Train every member of `stack` on `data`; equal order seeds make members share batches."""
    device = stack.parameters()[0].device
    inputs, targets = torch.from_numpy(data.x).to(device), torch.from_numpy(data.y).to(device)
    optimizer = torch.optim.Adam(stack.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay, fused=True)
    total = config.steps(data.n)
    for step, indices in enumerate(batch_orders(data.n, config, order_seeds, device)):
        batch = Batch(inputs[indices], targets[indices], indices, step)
        value = loss(stack(batch.x), batch)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        if progress:
            progress(step + 1, total)
    return stack


def stacked_cross_entropy(logits: Tensor, batch: Batch) -> Tensor:
    """Sum over members of each member's mean cross-entropy on its own batch (multi-label:
    binary cross-entropy, its mean over the batch's (sample, label) pairs)."""
    flat = torch.nn.functional.cross_entropy(
        *as_classes(logits.flatten(0, 1), batch.y.flatten(0, 1)), reduction="sum")
    return flat / batch.y[0].numel()
