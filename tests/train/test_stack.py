"""Vectorized stacks: every member trains exactly as it would alone."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from flipgate.formats.evalsets import EvalSet
from flipgate.train.config import TrainConfig
from flipgate.train.loop import fit, stacked_cross_entropy
from flipgate.train.stack import ModelStack, member_seeds
from flipgate.train.zoo import build_model

RNG = np.random.default_rng(0)
DATA = EvalSet(RNG.random((150, 6, 6), dtype=np.float32), RNG.integers(0, 4, 150))
CONFIG = TrainConfig(epochs=2, batch_size=32, lr=1e-2)


def train_alone(arch: str, seed: int) -> dict[str, torch.Tensor]:
    """Reference: an ordinary module, optimizer and loop, with the member's seed and order."""
    torch.manual_seed(seed)
    model = build_model(arch, (6, 6), 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=CONFIG.lr, fused=True)
    order_generator = torch.Generator().manual_seed(seed)
    x, y = torch.from_numpy(DATA.x), torch.from_numpy(DATA.y)
    for _ in range(CONFIG.epochs):
        order = torch.randperm(DATA.n, generator=order_generator)
        for start in range(0, DATA.n, CONFIG.batch_size):
            batch = order[start : start + CONFIG.batch_size]
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.state_dict()


@pytest.mark.slow
def test_each_member_equals_training_it_alone():
    seeds = member_seeds(3, 3)
    assert len(set(seeds)) == 3
    for arch in ("mlp:hidden=16", "cnn:channels=4,8"):
        stack = ModelStack.build(arch, (6, 6), 4, seeds, torch.device("cpu"))
        fit(stack, DATA, CONFIG, stacked_cross_entropy, order_seeds=seeds)
        for index, seed in enumerate(seeds):
            alone = train_alone(arch, seed)
            trained = stack.member(index).state_dict()
            for name, value in alone.items():
                torch.testing.assert_close(trained[name], value, atol=2e-5, rtol=1e-4)


def test_members_differ_and_shared_orders_see_the_same_batches():
    seeds = member_seeds(0, 2)
    seen = []

    def recording_loss(logits, batch):
        seen.append(batch.indices.clone())
        return stacked_cross_entropy(logits, batch)

    stack = ModelStack.build("mlp:hidden=8", (6, 6), 4, seeds, torch.device("cpu"))
    fit(stack, DATA, CONFIG, recording_loss, order_seeds=[7, 7])
    assert all(torch.equal(indices[0], indices[1]) for indices in seen)
    first, second = (m.state_dict() for m in stack.members())
    assert not torch.equal(first["1.weight"], second["1.weight"])
    x = torch.from_numpy(DATA.x[:5])
    torch.testing.assert_close(stack.on_shared(x)[1], stack.member(1)(x))
