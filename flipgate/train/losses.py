"""Training losses for flip-free model updates (docs/metrics.md, training methods).

Shapes: logits and targets are (B, C), labels are (B,) class indices. Every ``forward`` returns a
scalar: per-sample terms are averaged over the batch. A multi-label model (logits (B, L), labels
a 0/1 matrix (B, L)) is trained through the same losses by `as_classes`: each (sample, label)
pair becomes a two-class problem, so every per-sample term becomes a per-(sample, label) term.
Logits that act as fixed targets (teacher, old model, reference ensemble) are detached, so no
gradient reaches the model that produced them. A method's loss takes its defaults from the
method's options (flipgate.train.methods), the one place they are set.
"""

import math
from typing import get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flipgate.train.methods import (
    FD,
    KD,
    AntiDistill,
    AntiDistillationVariant,
    Codistill,
    ConfidenceKind,
    Elodi,
    Entropy,
    FocalDivergence,
    Selection,
)

# --- hyperparameter checks -------------------------------------------------------------------


def _at_least(name: str, value: float, minimum: float) -> float:
    """Return ``value`` if it is a finite number >= ``minimum``, else raise ValueError."""
    if not (math.isfinite(value) and value >= minimum):
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    return float(value)


def _positive(name: str, value: float) -> float:
    """Return ``value`` if it is a finite number > 0, else raise ValueError."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _fraction(name: str, value: float) -> float:
    """Return ``value`` if it lies in [0, 1], else raise ValueError."""
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return float(value)


def _integer(name: str, value: int, minimum: int) -> int:
    """Return ``value`` if it is an int >= ``minimum``, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _optional_integer(name: str, value: int | None, minimum: int) -> int | None:
    """Return ``value`` if it is None or an int >= ``minimum``, else raise ValueError."""
    return None if value is None else _integer(name, value, minimum)


def _one_of(name: str, value: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ValueError."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


# --- class supports and distributions --------------------------------------------------------


def _top_k_support(logits: Tensor, k: int | None) -> Tensor | None:
    """Boolean (B, C) mask of each sample's k highest classes; None when that is every class."""
    if k is None or k >= logits.shape[1]:
        return None
    indices = logits.detach().topk(k, dim=1).indices  # dim=1: classes, per sample
    return torch.zeros_like(logits, dtype=torch.bool).scatter_(1, indices, True)


def _union(first: Tensor | None, second: Tensor | None) -> Tensor | None:
    """Union of two supports, where None stands for all classes."""
    if first is None or second is None:
        return None
    return first | second


def _sum_over(values: Tensor, support: Tensor | None) -> Tensor:
    """Per-sample sum of ``values`` over the classes in ``support``."""
    if support is not None:
        values = values.masked_fill(~support, 0.0)
    return values.sum(dim=1)


def _log_softmax_over(logits: Tensor, support: Tensor | None) -> Tensor:
    """Log-softmax renormalised over ``support``, with 0 (not -inf) outside it."""
    if support is None:
        return F.log_softmax(logits, dim=1)
    restricted = F.log_softmax(logits.masked_fill(~support, -math.inf), dim=1)
    return restricted.masked_fill(~support, 0.0)


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """Per-sample KL(p || q) from log-probabilities that are 0 outside the common support."""
    return (log_p.exp() * (log_p - log_q)).sum(dim=1)


def _symmetric_kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """Per-sample KL(p || q) + KL(q || p)."""
    return _kl(log_p, log_q) + _kl(log_q, log_p)


def _entropy(log_p: Tensor) -> Tensor:
    """Per-sample Shannon entropy H(p) in nats."""
    return -(log_p.exp() * log_p).sum(dim=1)


def _uniform_log_probs(log_p: Tensor, support: Tensor | None) -> Tensor:
    """Log-probabilities of the uniform distribution over ``support`` (0 outside it)."""
    if support is None:
        return torch.full_like(log_p, -math.log(log_p.shape[1]))
    sizes = support.sum(dim=1, keepdim=True).to(log_p.dtype)
    return torch.where(support, -sizes.log(), torch.zeros_like(log_p))


def _confidence_penalty(log_p: Tensor, support: Tensor | None, kind: ConfidenceKind) -> Tensor:
    """Per-sample minimum-entropy regulariser: H(p), or -SKL(p, U) (paper 004, eqs. 6 and 7)."""
    if kind == "entropy":
        return _entropy(log_p)
    return -_symmetric_kl(log_p, _uniform_log_probs(log_p, support))


def _tempered_kl(target_logits: Tensor, logits: Tensor, temperature: float) -> Tensor:
    """Per-sample T^2 * KL(softmax(target/T) || softmax(logits/T)), target detached."""
    log_p = F.log_softmax(target_logits.detach() / temperature, dim=1)
    log_q = F.log_softmax(logits / temperature, dim=1)
    return temperature**2 * _kl(log_p, log_q)


# --- multi-label targets ---------------------------------------------------------------------


def two_class_logits(logits: Tensor) -> Tensor:
    """Per-label logits (B, L) as two-class logits [0, z] (B·L, 2), one row per (sample, label):
    their softmax is (1 − σ(z), σ(z)) and their argmax σ(z) > 0.5, the default decision."""
    flat = logits.reshape(-1, 1)
    return torch.cat([torch.zeros_like(flat), flat], dim=1)


def as_classes(logits: Tensor, labels: Tensor, *references: Tensor | None) -> tuple:
    """Single-label (labels (B,) class indices): everything unchanged. Multi-label (labels a
    0/1 matrix (B, L)): the logits and each reference (old model's, ensemble's; None stays
    None) as `two_class_logits` and the labels as (B·L,) indices, so that cross-entropy is the
    per-label binary cross-entropy averaged over (sample, label) pairs and a distillation term
    acts on each label's logit."""
    if labels.dim() == 1:
        return logits, labels, *references
    return (two_class_logits(logits), labels.reshape(-1).long(),
            *(None if reference is None else two_class_logits(reference)
              for reference in references))


# --- losses ----------------------------------------------------------------------------------


class KnowledgeDistillation(nn.Module):
    """Hinton KD: CE + lam * T^2 * KL(softmax(z_t/T) || softmax(z/T)), KL averaged per sample."""

    def __init__(self, lam: float = KD.lam, temperature: float = KD.temperature) -> None:
        super().__init__()
        self.lam = _at_least("lam", lam, 0.0)
        self.temperature = _positive("temperature", temperature)

    def forward(self, logits: Tensor, labels: Tensor, teacher_logits: Tensor) -> Tensor:
        """Return the KD loss of student ``logits`` against a (detached) teacher."""
        divergence = _tempered_kl(teacher_logits, logits, self.temperature).mean()
        return F.cross_entropy(logits, labels) + self.lam * divergence


class FocalDistillation(nn.Module):
    """Focal Distillation (paper 001): CE + lam * mean(w * D), w = alpha + beta * 1[old correct]."""

    def __init__(
        self,
        alpha: float = FD.alpha,
        beta: float = FD.beta,
        temperature: float = FD.temperature,
        lam: float = FD.lam,
        divergence: FocalDivergence = FD.divergence,
    ) -> None:
        super().__init__()
        self.alpha = _at_least("alpha", alpha, 0.0)
        self.beta = _at_least("beta", beta, 0.0)
        self.temperature = _positive("temperature", temperature)
        self.lam = _at_least("lam", lam, 0.0)
        self.divergence = _one_of("divergence", divergence, get_args(FocalDivergence))

    def _per_sample_divergence(self, logits: Tensor, old_logits: Tensor) -> Tensor:
        """FD-KL: T^2 * KL(old || new) at temperature T; FD-LM: 0.5 * ||z - z_old||^2."""
        if self.divergence == "kl":
            return _tempered_kl(old_logits, logits, self.temperature)
        return 0.5 * (logits - old_logits.detach()).pow(2).sum(dim=1)

    def forward(self, logits: Tensor, labels: Tensor, old_logits: Tensor) -> Tensor:
        """Return the FD loss of ``logits`` towards the (detached) old model's logits."""
        old_correct = (old_logits.argmax(dim=1) == labels).to(logits.dtype)
        weights = self.alpha + self.beta * old_correct
        focal = (weights * self._per_sample_divergence(logits, old_logits)).mean()
        return F.cross_entropy(logits, labels) + self.lam * focal


class LogitDifferenceInhibition(nn.Module):
    """LDI (paper 002, eq. 8): mean over samples of sum_{k in K(x)} max(|z_k - r_k| - m, 0)^p.

    K(x) holds each sample's own top-k classes (top-k along the class axis), ranked by the
    reference logits, the student logits or the union of both; k=None or k >= C keeps all classes
    (eq. 7). ``margin`` (0 by default, i.e. the paper's loss) leaves differences below it free.
    """

    def __init__(
        self,
        k: int | None = 10,
        p: float = 2.0,
        select: Selection = "reference",
        margin: float = 0.0,
    ) -> None:
        super().__init__()
        self.k = _optional_integer("k", k, minimum=1)
        self.p = _at_least("p", p, 1.0)
        self.select = _one_of("select", select, get_args(Selection))
        self.margin = _at_least("margin", margin, 0.0)

    def _support(self, logits: Tensor, reference: Tensor) -> Tensor | None:
        """The selected classes K(x) as a (B, C) mask, or None for all classes."""
        if self.select == "reference":
            return _top_k_support(reference, self.k)
        if self.select == "student":
            return _top_k_support(logits, self.k)
        return _union(_top_k_support(reference, self.k), _top_k_support(logits, self.k))

    def forward(self, logits: Tensor, reference: Tensor) -> Tensor:
        """Return the LDI loss of student ``logits`` against (detached) ``reference`` logits."""
        reference = reference.detach()
        excess = ((logits - reference).abs() - self.margin).clamp(min=0.0)
        return _sum_over(excess.pow(self.p), self._support(logits, reference)).mean()


class ELODILoss(nn.Module):
    """ELODI (paper 002): (1 - alpha) * CE + alpha * LDI(z, r), r = mean ensemble logits.

    With ``legacy_weight`` = lam, the LDI term becomes lam * LDI(z, r) + (1 - lam) * LDI(z, z_old)
    (paper 002, eq. 9) for an old model that was not trained with ELODI. With p = 1 this pulls
    each logit towards the weighted *median* of r and z_old, not their mean: to z_old for any
    lam < 0.5 (a new architecture then copies the old model and loses its accuracy), to r for
    lam > 0.5, and at lam = 0.5 (the default) nowhere between them, where cross-entropy decides.
    """

    def __init__(
        self,
        alpha: float = Elodi.alpha,
        k: int | None = Elodi.k,
        p: float = Elodi.p,
        select: Selection = Elodi.select,
        legacy_weight: float | None = None,
    ) -> None:
        super().__init__()
        self.alpha = _fraction("alpha", alpha)
        self.legacy_weight = (
            None if legacy_weight is None else _fraction("legacy_weight", legacy_weight)
        )
        self.ldi = LogitDifferenceInhibition(k=k, p=p, select=select)

    def _inhibition(self, logits: Tensor, ensemble: Tensor, old: Tensor | None) -> Tensor:
        """The LDI term, mixed with the legacy-model term when ``legacy_weight`` is set."""
        if self.legacy_weight is None:
            if old is not None:
                raise ValueError("old_logits were given but legacy_weight is None")
            return self.ldi(logits, ensemble)
        if old is None:
            raise ValueError("legacy_weight is set, so old_logits are required")
        lam = self.legacy_weight
        return lam * self.ldi(logits, ensemble) + (1 - lam) * self.ldi(logits, old)

    def forward(
        self,
        logits: Tensor,
        labels: Tensor,
        ensemble_logits: Tensor,
        old_logits: Tensor | None = None,
    ) -> Tensor:
        """Return the ELODI loss; ``old_logits`` is required iff ``legacy_weight`` is set."""
        inhibition = self._inhibition(logits, ensemble_logits, old_logits)
        return (1 - self.alpha) * F.cross_entropy(logits, labels) + self.alpha * inhibition


class MinimumEntropy(nn.Module):
    """Minimum-entropy regulariser (paper 004): (1 - alpha) * CE + alpha * R(p).

    R is H(p) for kind="entropy" (eq. 6) or -SKL(p, Uniform) for kind="skl_uniform" (eq. 7);
    with ``top_k`` it is computed on p renormalised over the sample's top-k classes.
    """

    def __init__(
        self,
        alpha: float = Entropy.alpha,
        top_k: int | None = Entropy.top_k,
        kind: ConfidenceKind = Entropy.kind,
    ) -> None:
        super().__init__()
        self.alpha = _fraction("alpha", alpha)
        self.top_k = _optional_integer("top_k", top_k, minimum=2)
        self.kind = _one_of("kind", kind, get_args(ConfidenceKind))

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Return the regularised loss of ``logits``."""
        support = _top_k_support(logits, self.top_k)
        penalty = _confidence_penalty(_log_softmax_over(logits, support), support, self.kind)
        return (1 - self.alpha) * F.cross_entropy(logits, labels) + self.alpha * penalty.mean()


class SymmetricKLCodistillation(nn.Module):
    """Co-distillation with symmetric KL (paper 004, eq. 9): CE1 + CE2 + beta_t * SKL(p1, p2).

    Joint updates (paper 004, App. C): neither model is detached, so both receive gradient
    through SKL. beta_t = beta * min(step / ramp_steps, 1) (ramp_steps=0: beta at once). With
    ``entropy_weight`` = a, adds a_t * (R(p1) + R(p2)), R as in MinimumEntropy, ramped like beta
    (paper 004, §3.2 "Regularized co-distillation"). With ``top_k`` both SKL and R use the two
    distributions renormalised over the union of the two models' top-k classes per sample.
    """

    def __init__(
        self,
        beta: float = Codistill.beta,
        ramp_steps: int = Codistill.ramp_steps,
        top_k: int | None = Codistill.top_k,
        entropy_weight: float = Codistill.entropy_weight,
        entropy_kind: ConfidenceKind = Codistill.entropy_kind,
    ) -> None:
        super().__init__()
        self.beta = _at_least("beta", beta, 0.0)
        self.ramp_steps = _integer("ramp_steps", ramp_steps, minimum=0)
        self.top_k = _optional_integer("top_k", top_k, minimum=1)
        self.entropy_weight = _at_least("entropy_weight", entropy_weight, 0.0)
        self.entropy_kind = _one_of("entropy_kind", entropy_kind, get_args(ConfidenceKind))

    def ramp(self, step: int) -> float:
        """Warm-up factor min(step / ramp_steps, 1) that scales beta and entropy_weight."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return 1.0 if not self.ramp_steps else min(step / self.ramp_steps, 1.0)

    def forward(self, logits_1: Tensor, logits_2: Tensor, labels: Tensor, step: int) -> Tensor:
        """Return the joint loss of the two models at training step ``step``."""
        support = _union(_top_k_support(logits_1, self.top_k), _top_k_support(logits_2, self.top_k))
        log_p1 = _log_softmax_over(logits_1, support)
        log_p2 = _log_softmax_over(logits_2, support)
        penalty = self.entropy_weight * (
            _confidence_penalty(log_p1, support, self.entropy_kind)
            + _confidence_penalty(log_p2, support, self.entropy_kind)
        )
        agreement = self.beta * _symmetric_kl(log_p1, log_p2)
        ce = F.cross_entropy(logits_1, labels) + F.cross_entropy(logits_2, labels)
        return ce + self.ramp(step) * (agreement + penalty).mean()


def _centred(signals: Tensor) -> Tensor:
    """Subtract the mini-batch mean (last axis)."""
    return signals - signals.mean(dim=-1, keepdim=True)


def _standardised(signals: Tensor, eps: float) -> Tensor:
    """Centre over the mini-batch and divide by sqrt(variance + eps)."""
    centred = _centred(signals)
    return centred / (centred.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()


def _off_diagonal_penalty(signals: Tensor) -> Tensor:
    """Mean over classes of 0.5 * (||M||_F^2 - ||diag M||_F^2), M = signals signals^T / B."""
    matrix = signals @ signals.transpose(-1, -2) / signals.shape[-1]
    diagonal = matrix.diagonal(dim1=-2, dim2=-1)
    return 0.5 * (matrix.pow(2).sum(dim=(-2, -1)) - diagonal.pow(2).sum(dim=-1)).mean()


def _negative_squared_difference(member_logits: Tensor) -> Tensor:
    """-mean over ordered pairs i != j of ||z_i - z_j||^2, averaged over samples; 0 for J = 1."""
    members = member_logits.shape[0]
    if members < 2:
        return member_logits.new_zeros(())
    # sum_{i != j} ||z_i - z_j||^2 = 2 J sum_i ||z_i - mean_j z_j||^2
    spread = (member_logits - member_logits.mean(dim=0)).pow(2).sum(dim=(0, 2))
    return -(2.0 / (members - 1) * spread).mean()


class AntiDistillation(nn.Module):
    """Anti-distillation (paper 003): sum of members' CE + lam * decorrelation penalty.

    The penalty is eq. 5, 0.5 * (||M||_F^2 - ||diag M||_F^2), of a J x J matrix M estimated over
    the mini-batch for each class (one loss per logit, as in the paper's MNIST set-up), averaged
    over classes. M by ``variant``: "correlation", the Pearson correlation, i.e. eq. 3 divided by
    sqrt(var_i + eps) * sqrt(var_j + eps) (the paper's eq. 2 is the uncentred moment
    1/k sum z_i z_j; we centre and normalise); "covariance", the batch covariance (eq. 3);
    "residual_correlation", the Pearson correlation of the residuals z_j - mean_j z_j around
    the ensemble mean (eq. 4, likewise centred and normalised; for J = 2 the two residuals are
    negatives of each other, so it is nearly constant: use J >= 3).
    "negative_squared_difference" is the squared-difference loss given after eq. 5:
    -mean over ordered pairs i != j of ||z_i - z_j||^2, averaged over samples.
    """

    def __init__(
        self,
        lam: float = AntiDistill.lam,
        variant: AntiDistillationVariant = AntiDistill.variant,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.lam = _at_least("lam", lam, 0.0)
        self.variant = _one_of("variant", variant, get_args(AntiDistillationVariant))
        self.eps = _positive("eps", eps)

    def penalty(self, member_logits: Tensor) -> Tensor:
        """The anti-distillation penalty of (J, B, C) member logits."""
        if self.variant == "negative_squared_difference":
            return _negative_squared_difference(member_logits)
        signals = member_logits.permute(2, 0, 1)  # (C, J, B): one J x B block per class
        if self.variant == "covariance":
            return _off_diagonal_penalty(_centred(signals))
        if self.variant == "residual_correlation":
            signals = signals - signals.mean(dim=1, keepdim=True)
        return _off_diagonal_penalty(_standardised(signals, self.eps))

    def forward(self, member_logits: Tensor, labels: Tensor) -> Tensor:
        """Return the members' summed CE plus lam times the penalty; logits are (J, B, C) (or
        (J, B, L) with labels (B, L): per-label BCE, the penalty per label's logit)."""
        if member_logits.dim() != 3:
            raise ValueError(f"member_logits must be (J, B, C), got {tuple(member_logits.shape)}")
        members = member_logits.shape[0]
        stacked_labels = torch.cat([labels] * members)
        ce = F.cross_entropy(*as_classes(member_logits.flatten(0, 1), stacked_labels))
        return members * ce + self.lam * self.penalty(member_logits)
