"""The optimisation settings of a training run, without torch (the server validates them)."""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of one training run; stored with the model it produced."""

    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs and batch size must be >= 1, got {self.epochs} and "
                             f"{self.batch_size}")
        if not (0 < self.lr < math.inf and 0 <= self.weight_decay < math.inf):
            raise ValueError(f"lr must be > 0 and weight decay >= 0, got {self.lr} and "
                             f"{self.weight_decay}")

    def steps(self, samples: int) -> int:
        return self.epochs * math.ceil(samples / self.batch_size)
