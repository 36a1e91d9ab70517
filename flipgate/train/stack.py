"""m models of one architecture trained as one batched computation (torch.func + vmap).

Each member keeps its own initialisation (its own seed) and, when batches are not shared,
its own data order; the members' parameters are stacked along a leading axis, so one
forward and one backward pass serve all of them. Summing the members' losses keeps their
gradients apart, and Adam is elementwise, so every member trains exactly as it would alone.
"""

import copy

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from flipgate.train.zoo import build_model


def member_seeds(seed: int, count: int, stream: int = 0) -> list[int]:
    """`count` independent seeds derived from (seed, stream); stream separates model groups."""
    state = np.random.SeedSequence([seed, stream]).generate_state(count)
    return [int(s) for s in state]


class ModelStack:
    """A stack of same-architecture models evaluated with one vmap'ed functional call."""

    def __init__(self, members: list[nn.Module]) -> None:
        if not members:
            raise ValueError("a stack needs at least one member")
        self.params, self.buffers = stack_module_state(members)
        self.base = copy.deepcopy(members[0]).to("meta")
        self.size = len(members)

    @classmethod
    def build(cls, arch: str, sample_shape: tuple[int, ...], num_classes: int,
              seeds: list[int], device: torch.device) -> "ModelStack":
        """Initialise one member of `arch` per seed (torch.manual_seed(seed) before each)."""
        members = []
        for seed in seeds:
            torch.manual_seed(seed)
            members.append(build_model(arch, sample_shape, num_classes).to(device))
        return cls(members)

    def parameters(self) -> list[Tensor]:
        return list(self.params.values())

    def __call__(self, x: Tensor) -> Tensor:
        """Per-member inputs (m, B, ...) -> logits (m, B, C)."""
        return vmap(self._call_one)(self.params, self.buffers, x)

    def on_shared(self, x: Tensor) -> Tensor:
        """One input batch (B, ...) seen by every member -> logits (m, B, C)."""
        return vmap(self._call_one, in_dims=(0, 0, None))(self.params, self.buffers, x)

    def _call_one(self, params: dict, buffers: dict, x: Tensor) -> Tensor:
        return functional_call(self.base, (params, buffers), (x,))

    def members(self) -> list[nn.Module]:
        """Independent copies of the members as ordinary modules (on the CPU, in eval mode)."""
        return [self.member(i) for i in range(self.size)]

    def member(self, index: int) -> nn.Module:
        module = copy.deepcopy(self.base).to_empty(device="cpu")
        state = {name: value[index].detach().cpu() for name, value in
                 {**self.params, **self.buffers}.items()}
        module.load_state_dict(state)
        return module.eval()
