"""Training recipes: baseline, KD, FD, ELODI, co-distillation, entropy, anti-distillation, paragon.

Each recipe has a dataclass of options (saved beside the model) and trains through the same
loop. Old-model logits for the training set are computed once before training: the loop
applies no augmentation, so they equal the "online per batch" logits of DESIGN §5.
"""

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from flipgate import __version__
from flipgate.export import AveragedEnsemble, export_onnx
from flipgate.formats import EvalSet
from flipgate.train.loop import Batch, TrainConfig, default_device, fit, stacked_cross_entropy
from flipgate.train.losses import (
    AntiDistillation,
    ELODILoss,
    FocalDistillation,
    KnowledgeDistillation,
    MinimumEntropy,
    SymmetricKLCodistillation,
)
from flipgate.train.stack import ModelStack, member_seeds

ProgressFactory = Callable[[str], Callable[[int, int], None]]
DEFAULT_LEGACY_WEIGHT = 0.5  # ELODI's λ towards an old model not trained with ELODI


@dataclass(frozen=True)
class Baseline:
    """Plain cross-entropy."""


@dataclass(frozen=True)
class KD:
    """Knowledge distillation from the old model."""

    lam: float = 1.0
    temperature: float = 4.0


@dataclass(frozen=True)
class FD:
    """Focal Distillation towards the old model, weighted α + β·1[old correct]."""

    alpha: float = 1.0
    beta: float = 5.0
    temperature: float = 100.0
    lam: float = 1.0
    divergence: str = "kl"


@dataclass(frozen=True)
class Elodi:
    """Distil a homogeneous ensemble of `members` replicas with the top-K LDI loss.

    α = 0.5 and p = 1 (the paper: 0.8 and 2) halve NFR at no more than +0.3 points of error
    on small data sets such as 2,500 MNIST digits (docs/reproduction.md).
    """

    members: int = 8
    k: int | None = 10
    p: float = 1.0
    alpha: float = 0.5
    select: str = "reference"
    legacy_weight: float | None = None

    def __post_init__(self) -> None:
        _check_members(self.members)

    def for_old_model(self, has_old: bool) -> "Elodi":
        """Resolve λ: the legacy term needs an old model and defaults to DEFAULT_LEGACY_WEIGHT."""
        if not has_old and self.legacy_weight is not None:
            raise ValueError("ELODI's legacy weight needs the old model (--old)")
        if has_old and self.legacy_weight is None:
            return replace(self, legacy_weight=DEFAULT_LEGACY_WEIGHT)
        return self


@dataclass(frozen=True)
class Codistill:
    """Two models trained jointly with symmetric KL (member 0 is deployed)."""

    beta: float = 5.0
    ramp_steps: int = 200
    top_k: int | None = None
    entropy_weight: float = 0.0
    entropy_kind: str = "entropy"


@dataclass(frozen=True)
class Entropy:
    """Cross-entropy with a minimum-entropy regulariser."""

    alpha: float = 0.1
    top_k: int | None = None
    kind: str = "entropy"


@dataclass(frozen=True)
class AntiDistill:
    """An ensemble whose members' logits are decorrelated; deployed as one averaged graph."""

    members: int = 4
    lam: float = 1.0
    variant: str = "correlation"

    def __post_init__(self) -> None:
        _check_members(self.members)


@dataclass(frozen=True)
class Paragon:
    """Independently trained members deployed as one averaged graph."""

    members: int = 8

    def __post_init__(self) -> None:
        _check_members(self.members)


def _check_members(members: int) -> None:
    if members < 1:
        raise ValueError(f"an ensemble needs members >= 1, got {members}")


@dataclass(frozen=True)
class Context:
    """Everything a recipe needs besides its own options."""

    arch: str
    data: EvalSet
    num_classes: int
    config: TrainConfig
    device: torch.device
    old: Tensor | None
    progress: ProgressFactory | None

    def stack(self, seeds: list[int]) -> ModelStack:
        return ModelStack.build(self.arch, self.data.sample_shape, self.num_classes, seeds,
                                self.device)

    def fit(self, stack: ModelStack, loss, order_seeds: list[int], label: str) -> ModelStack:
        progress = self.progress(label) if self.progress else None
        return fit(stack, self.data, self.config, loss, order_seeds=order_seeds,
                   progress=progress)

    def single(self, loss: Callable[[Tensor, Batch], Tensor], label: str) -> nn.Module:
        """Train one model initialised from config.seed with loss(logits (B, C), batch)."""
        seeds = [self.config.seed]
        stack = self.fit(self.stack(seeds), lambda logits, batch: loss(logits[0], batch), seeds,
                         label)
        return stack.member(0)

    def ensemble(self, members: int, label: str) -> ModelStack:
        """`members` models with their own seeds and data orders, trained with cross-entropy."""
        seeds = member_seeds(self.config.seed, members, stream=1)
        return self.fit(self.stack(seeds), stacked_cross_entropy, seeds, label)

    def old_logits(self, batch: Batch) -> Tensor:
        return self.old[batch.indices[0]]

    @torch.no_grad()
    def mean_logits(self, stack: ModelStack, chunk: int = 1024) -> Tensor:
        """The members' mean logits on every training sample, (N, C), in one pass."""
        x = torch.from_numpy(self.data.x).to(self.device)
        return torch.cat([stack.on_shared(x[i : i + chunk]).mean(dim=0)
                          for i in range(0, len(x), chunk)])


def _baseline(ctx: Context, options: Baseline) -> nn.Module:
    return ctx.single(lambda z, batch: F.cross_entropy(z, batch.y[0]), "training (baseline)")


def _kd(ctx: Context, options: KD) -> nn.Module:
    loss = KnowledgeDistillation(**asdict(options))
    return ctx.single(lambda z, b: loss(z, b.y[0], ctx.old_logits(b)), "training (KD)")


def _fd(ctx: Context, options: FD) -> nn.Module:
    loss = FocalDistillation(**asdict(options))
    return ctx.single(lambda z, b: loss(z, b.y[0], ctx.old_logits(b)), "training (FD)")


def _entropy(ctx: Context, options: Entropy) -> nn.Module:
    loss = MinimumEntropy(**asdict(options))
    return ctx.single(lambda z, b: loss(z, b.y[0]), "training (min-entropy)")


def _paragon(ctx: Context, options: Paragon) -> nn.Module:
    members = ctx.ensemble(options.members, f"training {options.members} members").members()
    return AveragedEnsemble(members)


def _elodi(ctx: Context, options: Elodi) -> nn.Module:
    """Teacher ensemble, then the student; the teacher's mean logits are computed once, which
    equals computing them on each batch because the loop applies no augmentation."""
    loss = ELODILoss(alpha=options.alpha, k=options.k, p=options.p, select=options.select,
                     legacy_weight=options.legacy_weight)
    teacher = ctx.ensemble(options.members, f"ELODI teacher ({options.members} members)")
    reference = ctx.mean_logits(teacher)

    def student_loss(z: Tensor, batch: Batch) -> Tensor:
        old = None if options.legacy_weight is None else ctx.old_logits(batch)
        return loss(z, batch.y[0], reference[batch.indices[0]], old)

    return ctx.single(student_loss, "ELODI student")


def _codistill(ctx: Context, options: Codistill) -> nn.Module:
    loss = SymmetricKLCodistillation(**asdict(options))
    shared_order = [ctx.config.seed] * 2
    stack = ctx.fit(ctx.stack(member_seeds(ctx.config.seed, 2, stream=2)),
                    lambda logits, b: loss(logits[0], logits[1], b.y[0], b.step), shared_order,
                    "co-distillation (2 models)")
    return stack.member(0)


def _anti_distill(ctx: Context, options: AntiDistill) -> nn.Module:
    loss = AntiDistillation(lam=options.lam, variant=options.variant)
    shared_order = [ctx.config.seed] * options.members
    stack = ctx.fit(ctx.stack(member_seeds(ctx.config.seed, options.members, stream=3)),
                    lambda logits, b: loss(logits, b.y[0]), shared_order,
                    f"anti-distillation ({options.members} members)")
    return AveragedEnsemble(stack.members())


@dataclass(frozen=True)
class Recipe:
    options: type
    run: Callable[[Context, Any], nn.Module]
    old: str = "unused"  # "required", "optional" or "unused"
    resolve: Callable[[Any, bool], Any] = lambda options, has_old: options


RECIPES: dict[str, Recipe] = {
    "baseline": Recipe(Baseline, _baseline),
    "kd": Recipe(KD, _kd, old="required"),
    "fd": Recipe(FD, _fd, old="required"),
    "elodi": Recipe(Elodi, _elodi, old="optional",
                    resolve=lambda options, has_old: options.for_old_model(has_old)),
    "codistill": Recipe(Codistill, _codistill),
    "entropy": Recipe(Entropy, _entropy),
    "anti_distill": Recipe(AntiDistill, _anti_distill),
    "paragon": Recipe(Paragon, _paragon),
}


@dataclass
class TrainedModel:
    """The deployable module and the record of how it was made."""

    module: nn.Module
    record: dict = field(default_factory=dict)

    def save(self, path: str | Path, sample_shape: tuple[int, ...]) -> Path:
        """Export ONNX to `path` (*.onnx) and write the record as JSON beside it (same stem)."""
        if Path(path).suffix != ".onnx":
            raise ValueError(f"the model file must end in .onnx, got {path}")
        path = export_onnx(self.module, sample_shape, path)
        path.with_suffix(".json").write_text(json.dumps(self.record, indent=2) + "\n")
        return path


def train(
    method: str, arch: str, data: EvalSet, num_classes: int, config: TrainConfig,
    options: Any = None, old_logits: np.ndarray | None = None,
    progress: ProgressFactory | None = None,
) -> TrainedModel:
    """Train with `method`'s recipe; `options` defaults to the recipe's option defaults."""
    recipe = _recipe(method, old_logits)
    options = recipe.resolve(recipe.options() if options is None else options,
                             old_logits is not None)
    device = default_device()
    old = None if old_logits is None else torch.from_numpy(old_logits).float().to(device)
    context = Context(arch, data, num_classes, config, device, old, progress)
    started = time.perf_counter()
    module = recipe.run(context, options).cpu().eval()
    record = {
        "method": method, "arch": arch, "num_classes": num_classes, "samples": data.n,
        "train": asdict(config), "options": asdict(options), "targets_old_model": old is not None,
        "device": device.type, "seconds": round(time.perf_counter() - started, 3),
        "flipgate": __version__,
    }
    return TrainedModel(module, record)


def _recipe(method: str, old_logits: np.ndarray | None) -> Recipe:
    if method not in RECIPES:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(RECIPES)}")
    recipe = RECIPES[method]
    if recipe.old == "required" and old_logits is None:
        raise ValueError(f"method {method!r} needs the old model (--old OLD.onnx)")
    if recipe.old == "unused" and old_logits is not None:
        raise ValueError(f"method {method!r} does not use an old model; drop --old")
    return recipe
