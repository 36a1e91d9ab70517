"""The optimisation settings of a training run, without torch (the server validates them)."""

import math
from dataclasses import dataclass

MAX_EPOCHS = 10_000
MAX_BATCH_SIZE = 1 << 16


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of one training run; stored with the model it produced."""

    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (1 <= self.epochs <= MAX_EPOCHS and 1 <= self.batch_size <= MAX_BATCH_SIZE):
            raise ValueError(f"epochs must lie in [1, {MAX_EPOCHS}] and batch size in [1, "
                             f"{MAX_BATCH_SIZE}], got {self.epochs} and {self.batch_size}")
        if not (0 < self.lr < math.inf and 0 <= self.weight_decay < math.inf):
            raise ValueError(f"lr must be > 0 and weight decay >= 0, got {self.lr} and "
                             f"{self.weight_decay}")

    def steps(self, samples: int) -> int:
        return self.epochs * math.ceil(samples / self.batch_size)


def is_custom_architecture(spec: str) -> bool:
    """Whether an architecture spec names a factory to import (package.module:function)
    rather than one of the zoo's (flipgate.train.zoo)."""
    return "." in spec.partition(":")[0]
