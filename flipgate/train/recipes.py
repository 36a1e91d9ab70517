"""Training recipes: baseline, KD, FD, ELODI, co-distillation, entropy, anti-distillation, paragon.

Each recipe takes its options dataclass from flipgate.train.methods (saved beside the model)
and trains through the same loop. A multi-label training set (y a 0/1 matrix (N, L)) trains
the same recipes on per-label logits (flipgate.train.losses.as_classes); the methods that do
not apply to it are refused (flipgate.train.methods). Old-model logits for the training set
are computed once before training: the loop applies no augmentation, so they equal the
"online per batch" logits of docs/metrics.md.
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
from flipgate.errors import InputError
from flipgate.export import AveragedEnsemble, export_onnx, read_weights
from flipgate.formats.evalsets import EvalSet
from flipgate.progress import ProgressFactory
from flipgate.train.config import TrainConfig
from flipgate.train.loop import Batch, default_device, fit, stacked_cross_entropy
from flipgate.train.losses import (
    AntiDistillation,
    ELODILoss,
    FocalDistillation,
    KnowledgeDistillation,
    MinimumEntropy,
    SymmetricKLCodistillation,
    as_classes,
)
from flipgate.train.methods import (
    FD,
    KD,
    AntiDistill,
    Baseline,
    Codistill,
    Elodi,
    Entropy,
    Paragon,
    resolve_options,
)
from flipgate.train.stack import ModelStack, member_seeds
from flipgate.train.zoo import build_model


@dataclass(frozen=True)
class TrainingSetup:
    """Everything a recipe needs besides its own options."""

    arch: str
    data: EvalSet
    num_classes: int
    config: TrainConfig
    device: torch.device
    old: Tensor | None
    progress: ProgressFactory | None
    init: dict[str, Tensor] | None = None

    def stack(self, seeds: list[int]) -> ModelStack:
        """One member per seed, each starting from the warm-start weights when there are some."""
        stack = ModelStack.build(self.arch, self.data.sample_shape, self.num_classes, seeds,
                                 self.device)
        if self.init is not None:
            with torch.no_grad():
                for name, stacked in stack.params.items():
                    stacked.copy_(self.init[name])  # broadcast over the members
        return stack

    def fit(self, stack: ModelStack, loss, order_seeds: list[int], label: str,
            epochs_scale: float = 1.0) -> ModelStack:
        """Train `stack` for `epochs_scale` × config.epochs (rounded, at least one)."""
        progress = self.progress(label) if self.progress else None
        epochs = max(1, round(self.config.epochs * epochs_scale))
        return fit(stack, self.data, replace(self.config, epochs=epochs), loss,
                   order_seeds=order_seeds, progress=progress)

    def single(self, loss: Callable[[Tensor, Batch], Tensor], label: str,
               epochs_scale: float = 1.0) -> nn.Module:
        """Train one model initialised from config.seed with loss(logits (B, C), batch)."""
        seeds = [self.config.seed]
        stack = self.fit(self.stack(seeds), lambda logits, batch: loss(logits[0], batch), seeds,
                         label, epochs_scale)
        return stack.member(0)

    def towards_old(self, loss: nn.Module, label: str) -> nn.Module:
        """Train one model with loss(logits, labels, the old model's logits) (per label on a
        multi-label set)."""
        return self.single(lambda z, b: loss(*as_classes(z, b.y[0], self.old_logits(b))), label)

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


def _baseline(ctx: TrainingSetup, options: Baseline) -> nn.Module:
    return ctx.single(lambda z, b: F.cross_entropy(*as_classes(z, b.y[0])), "training (baseline)")


def _kd(ctx: TrainingSetup, options: KD) -> nn.Module:
    return ctx.towards_old(KnowledgeDistillation(**asdict(options)), "training (KD)")


def _fd(ctx: TrainingSetup, options: FD) -> nn.Module:
    return ctx.towards_old(FocalDistillation(**asdict(options)), "training (FD)")


def _entropy(ctx: TrainingSetup, options: Entropy) -> nn.Module:
    loss = MinimumEntropy(**asdict(options))
    return ctx.single(lambda z, b: loss(z, b.y[0]), "training (min-entropy)")


def _paragon(ctx: TrainingSetup, options: Paragon) -> nn.Module:
    members = ctx.ensemble(options.members, f"training {options.members} members").members()
    return AveragedEnsemble(members)


def _elodi(ctx: TrainingSetup, options: Elodi) -> nn.Module:
    """Teacher ensemble, then the student; the teacher's mean logits are computed once, which
    equals computing them on each batch because the loop applies no augmentation."""
    teacher = ctx.ensemble(options.members, f"ELODI teacher ({options.members} members)")
    return elodi_student(ctx, options, ctx.mean_logits(teacher))


def elodi_student(ctx: TrainingSetup, options: Elodi, reference: Tensor) -> nn.Module:
    """The student distilled towards `reference`, the teacher's mean logits (N, C) (or (N, L):
    each label's logit towards the teacher's mean logit of that label)."""
    loss = ELODILoss(alpha=options.alpha, k=options.k, p=options.p, select=options.select,
                     legacy_weight=options.legacy_weight)

    def student_loss(z: Tensor, batch: Batch) -> Tensor:
        old = None if options.legacy_weight is None else ctx.old_logits(batch)
        return loss(*as_classes(z, batch.y[0], reference[batch.indices[0]], old))

    return ctx.single(student_loss, "ELODI student", options.student_epochs)


def _codistill(ctx: TrainingSetup, options: Codistill) -> nn.Module:
    loss = SymmetricKLCodistillation(**asdict(options))
    shared_order = [ctx.config.seed] * 2
    stack = ctx.fit(ctx.stack(member_seeds(ctx.config.seed, 2, stream=2)),
                    lambda logits, b: loss(logits[0], logits[1], b.y[0], b.step), shared_order,
                    "co-distillation (2 models)")
    return stack.member(0)


def _anti_distill(ctx: TrainingSetup, options: AntiDistill) -> nn.Module:
    loss = AntiDistillation(lam=options.lam, variant=options.variant)
    shared_order = [ctx.config.seed] * options.members
    stack = ctx.fit(ctx.stack(member_seeds(ctx.config.seed, options.members, stream=3)),
                    lambda logits, b: loss(logits, b.y[0]), shared_order,
                    f"anti-distillation ({options.members} members)")
    return AveragedEnsemble(stack.members())


RUNNERS: dict[str, Callable[[TrainingSetup, Any], nn.Module]] = {
    "baseline": _baseline,
    "kd": _kd,
    "fd": _fd,
    "elodi": _elodi,
    "codistill": _codistill,
    "entropy": _entropy,
    "anti_distill": _anti_distill,
    "paragon": _paragon,
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
    progress: ProgressFactory | None = None, init: str | Path | None = None,
) -> TrainedModel:
    """Train with `method`'s recipe; `options` defaults to the recipe's option defaults. With
    `init` (an ONNX file of the same architecture), every model starts from its weights."""
    options = resolve_options(method, options, has_old=old_logits is not None,
                              multilabel=data.multilabel)
    _check_label_count(data, num_classes)
    device = default_device()
    old = None if old_logits is None else torch.from_numpy(old_logits).float().to(device)
    context = TrainingSetup(arch, data, num_classes, config, device, old, progress,
                      _warm_start(init, arch, data, num_classes, device))
    started = time.perf_counter()
    module = RUNNERS[method](context, options).cpu().eval()
    record = {
        "method": method, "arch": arch, "num_classes": num_classes, "samples": data.n,
        "multilabel": data.multilabel,
        "train": asdict(config), "options": asdict(options), "targets_old_model": old is not None,
        "device": device.type, "seconds": round(time.perf_counter() - started, 3),
        "init": None if init is None else str(init), "flipgate": __version__,
    }
    return TrainedModel(module, record)


def _check_label_count(data: EvalSet, num_classes: int) -> None:
    """A multi-label model has one output per label: as many as y has columns."""
    if data.multilabel and data.y.shape[1] != num_classes:
        raise InputError("label_count_mismatch", f"the training set has {data.y.shape[1]} "
                         f"labels (columns of y) but the model would have {num_classes} outputs")


def _warm_start(init: str | Path | None, arch: str, data: EvalSet, num_classes: int,
                device: torch.device) -> dict[str, Tensor] | None:
    """The weights of the ONNX file `init`, read into the shape of `arch`."""
    if init is None:
        return None
    shape = build_model(arch, data.sample_shape, num_classes)
    return {name: value.to(device) for name, value in read_weights(init, shape).items()}
