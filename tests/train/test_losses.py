"""Tests for flipgate.train.losses: hand-computed values, gradients and hyperparameter checks."""

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from torch.autograd import gradcheck

from flipgate.train.losses import (
    AntiDistillation,
    ELODILoss,
    FocalDistillation,
    KnowledgeDistillation,
    LogitDifferenceInhibition,
    MinimumEntropy,
    SymmetricKLCodistillation,
)
from flipgate.train.methods import FD, KD, AntiDistill, Codistill, Elodi, Entropy

LN2, LN3 = math.log(2), math.log(3)
# KL([3/4, 1/4] || [1/2, 1/2]) and KL([1/2, 1/2] || [3/4, 1/4]), by hand
KL_QUARTER_HALF = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
KL_HALF_QUARTER = 0.5 * math.log(2 / 3) + 0.5 * math.log(2)
ENTROPY_QUARTER = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))


def t(rows: list) -> Tensor:
    """A float64 tensor from nested lists."""
    return torch.tensor(rows, dtype=torch.float64)


def labels(*values: int) -> Tensor:
    """A label tensor."""
    return torch.tensor(values)


def random_logits(*shape: int, seed: int = 0) -> Tensor:
    """Float64 logits that require grad, for gradcheck."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()


def assert_value(actual: Tensor, expected: float) -> None:
    """The loss is a scalar equal to ``expected``."""
    assert actual.shape == ()
    assert actual.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


# --- knowledge distillation and focal distillation ------------------------------------------


def test_kd_matches_hand_computation() -> None:
    # sample 0: teacher/T = [ln 3, 0] -> [3/4, 1/4], student uniform; sample 1: no divergence
    loss = KnowledgeDistillation(lam=0.5, temperature=2.0)
    value = loss(t([[0, 0], [0, 0]]), labels(0, 1), t([[2 * LN3, 0], [0, 0]]))
    assert_value(value, LN2 + 0.5 * 2.0**2 * (KL_QUARTER_HALF + 0) / 2)


@pytest.mark.parametrize(
    ("divergence", "temperature", "old", "d_right", "d_wrong"),
    [
        ("lm", 1.0, [[1, 0], [2, 0]], 0.5 * 1**2, 0.5 * 2**2),
        ("kl", 2.0, [[2 * LN3, 0], [0, 0]], 2.0**2 * KL_QUARTER_HALF, 0.0),
    ],
)
def test_fd_weights_samples_the_old_model_got_right(
    divergence: str, temperature: float, old: list, d_right: float, d_wrong: float
) -> None:
    # old predicts class 0 for both samples (argmax of a tie is the first class):
    # right on sample 0 (label 0, w = 1 + 5), wrong on sample 1 (label 1, w = 1)
    loss = FocalDistillation(alpha=1.0, beta=5.0, temperature=temperature, divergence=divergence)
    value = loss(t([[0, 0], [0, 0]]), labels(0, 1), t(old))
    assert_value(value, LN2 + 1.0 * ((1 + 5) * d_right + 1 * d_wrong) / 2)


def test_fd_lam_scales_only_the_distillation_term() -> None:
    old, z = t([[1, 0]]), t([[0, 0]])
    value = FocalDistillation(alpha=2.0, beta=0.0, lam=0.25, divergence="lm")(z, labels(1), old)
    assert_value(value, LN2 + 0.25 * 2.0 * 0.5)


# --- logit difference inhibition ------------------------------------------------------------

# |z - r| = [[3, 1, 4], [0, 0.5, 2]]; top-1 reference class: sample 0 -> 0, sample 1 -> 2;
# top-1 student class: sample 0 -> 2, sample 1 -> 1.
LDI_Z = [[0.0, 0.0, 4.0], [0.0, 1.0, 0.0]]
LDI_R = [[3.0, 1.0, 0.0], [0.0, 1.5, 2.0]]


@pytest.mark.parametrize(
    ("select", "expected"),
    [
        ("reference", (3**2 + 2**2) / 2),
        ("student", (4**2 + 0.5**2) / 2),
        ("union", ((3**2 + 4**2) + (0.5**2 + 2**2)) / 2),
    ],
)
def test_ldi_picks_top_k_classes_of_each_sample(select: str, expected: float) -> None:
    # Taking top-k along the sample axis (the official ELODI bug) would, for "reference", pick
    # sample 0 for class 0 and sample 1 for classes 1 and 2: (9 + 0.25 + 4) / 2 != 6.5.
    loss = LogitDifferenceInhibition(k=1, select=select)
    assert_value(loss(t(LDI_Z), t(LDI_R)), expected)


def test_ldi_top_k_is_independent_of_the_other_samples() -> None:
    loss = LogitDifferenceInhibition(k=1)
    both = loss(t(LDI_Z), t(LDI_R))
    each = [loss(t([z]), t([r])) for z, r in zip(LDI_Z, LDI_R, strict=True)]
    assert_value(both, (each[0].item() + each[1].item()) / 2)


@pytest.mark.parametrize("k", [None, 3, 50])
def test_ldi_all_classes_when_k_is_none_or_exceeds_c(k: int | None) -> None:
    loss = LogitDifferenceInhibition(k=k)
    assert_value(loss(t(LDI_Z), t(LDI_R)), ((9 + 1 + 16) + (0 + 0.25 + 4)) / 2)


def test_ldi_margin_and_power() -> None:
    # max(|z - r| - 1, 0) = [[2, 0, 3], [0, 0, 1]], cubed
    loss = LogitDifferenceInhibition(k=None, p=3.0, margin=1.0)
    assert_value(loss(t(LDI_Z), t(LDI_R)), ((2**3 + 3**3) + 1**3) / 2)


# --- ELODI ----------------------------------------------------------------------------------


def test_elodi_matches_hand_computation() -> None:
    # LDI([0, 0], [1, -1]) = 1 + 1, CE of uniform logits = ln 2
    value = ELODILoss(alpha=0.8, k=None)(t([[0, 0]]), labels(0), t([[1, -1]]))
    assert_value(value, 0.2 * LN2 + 0.8 * 2)


def test_elodi_legacy_term() -> None:
    # LDI to the ensemble = 2, LDI to the old model [2, 0] = 4
    loss = ELODILoss(alpha=0.8, k=None, p=2.0, legacy_weight=0.25)
    value = loss(t([[0, 0]]), labels(0), t([[1, -1]]), t([[2, 0]]))
    assert_value(value, 0.2 * LN2 + 0.8 * (0.25 * 2 + 0.75 * 4))


def legacy_gradient(z: Tensor, lam: float) -> Tensor:
    """d LDI-with-legacy-term / d z (p = 1), ensemble logits 0 and old logits 2 per class."""
    z = z.clone().requires_grad_(True)
    loss = ELODILoss(alpha=1.0, k=None, p=1.0, legacy_weight=lam)
    loss(z, labels(0), t([[0.0, 0.0]]), t([[2.0, 2.0]])).backward()
    return z.grad


def test_with_p_1_the_legacy_term_pulls_to_the_heavier_of_ensemble_and_old_model() -> None:
    # between the two targets, the gradient is lam * sign(z - 0) + (1 - lam) * sign(z - 2)
    for z in (0.2, 1.0, 1.8):
        torch.testing.assert_close(legacy_gradient(t([[z, z]]), 0.3), t([[-0.4, -0.4]]))
        torch.testing.assert_close(legacy_gradient(t([[z, z]]), 0.7), t([[0.4, 0.4]]))
        torch.testing.assert_close(legacy_gradient(t([[z, z]]), 0.5), t([[0.0, 0.0]]))


def test_elodi_legacy_weight_one_ignores_the_old_model() -> None:
    z, y, ens = t([[0, 0]]), labels(0), t([[1, -1]])
    with_legacy = ELODILoss(k=None, legacy_weight=1.0)(z, y, ens, t([[9, 9]]))
    assert_value(with_legacy, ELODILoss(k=None)(z, y, ens).item())


def test_elodi_legacy_weight_and_old_logits_go_together() -> None:
    z, y, ens = t([[0, 0]]), labels(0), t([[1, -1]])
    with pytest.raises(ValueError, match="old_logits are required"):
        ELODILoss(legacy_weight=0.5)(z, y, ens)
    with pytest.raises(ValueError, match="legacy_weight is None"):
        ELODILoss()(z, y, ens, t([[2, 0]]))


# --- minimum entropy and co-distillation ---------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "penalty"),
    [("entropy", ENTROPY_QUARTER), ("skl_uniform", -(KL_QUARTER_HALF + KL_HALF_QUARTER))],
)
@pytest.mark.parametrize(
    ("top_k", "logits", "ce"),
    [(None, [[LN3, 0]], math.log(4)), (2, [[LN3, 0, -4]], math.log(4 + math.exp(-4)))],
)
def test_minimum_entropy(
    kind: str, penalty: float, top_k: int | None, logits: list, ce: float
) -> None:
    # p = [3/4, 1/4] (renormalised over the top 2 of 3 classes); CE over all classes, label 1
    value = MinimumEntropy(alpha=0.5, top_k=top_k, kind=kind)(t(logits), labels(1))
    assert_value(value, 0.5 * ce + 0.5 * penalty)


# p1 = [3/4, 1/4], p2 = [1/2, 1/2], label 0: CE1 = ln(4/3), CE2 = ln 2
CODISTILL_CE = math.log(4 / 3) + LN2
CODISTILL_SKL = KL_QUARTER_HALF + KL_HALF_QUARTER


@pytest.mark.parametrize(("step", "beta_t"), [(0, 0.0), (1, 0.5), (2, 1.0), (4, 2.0), (100, 2.0)])
def test_codistillation_ramps_beta_linearly(step: int, beta_t: float) -> None:
    loss = SymmetricKLCodistillation(beta=2.0, ramp_steps=4)
    value = loss(t([[LN3, 0]]), t([[0, 0]]), labels(0), step)
    assert_value(value, CODISTILL_CE + beta_t * CODISTILL_SKL)


def test_codistillation_without_ramp_uses_full_beta_at_step_zero() -> None:
    loss = SymmetricKLCodistillation(beta=2.0, ramp_steps=0)
    value = loss(t([[LN3, 0]]), t([[0, 0]]), labels(0), 0)
    assert_value(value, CODISTILL_CE + 2.0 * CODISTILL_SKL)


def test_codistillation_top_k_renormalises_over_the_union() -> None:
    # Sample 0: the union of the top-1 classes is {0, 2}, p1 ~ e^[2, 0], p2 ~ e^[0, 2] there;
    # sample 1: both models rank class 1 first, so the support is {1} and SKL = 0.
    z1, z2 = t([[2, 1, 0], [0, 3, 0]]), t([[0, 1, 2], [0, 3, 1]])
    value = SymmetricKLCodistillation(beta=1.0, ramp_steps=0, top_k=1)(z1, z2, labels(0, 1), 0)
    s = 1 / (1 + math.exp(-2))  # p1 = [s, 1 - s], p2 = [1 - s, s]
    kl = s * math.log(s / (1 - s)) + (1 - s) * math.log((1 - s) / s)
    e = math.e
    ce1 = -math.log(e**2 / (e**2 + e + 1)) - math.log(e**3 / (e**3 + 2))
    ce2 = -math.log(1 / (1 + e + e**2)) - math.log(e**3 / (e**3 + 1 + e))
    assert_value(value, (ce1 + ce2) / 2 + (2 * kl + 0) / 2)


@pytest.mark.parametrize(
    ("kind", "penalties"),
    [
        ("entropy", ENTROPY_QUARTER + LN2),
        # p2 is uniform, so SKL(p2, U) = 0 and SKL(p1, U) = SKL(p1, p2)
        ("skl_uniform", -(CODISTILL_SKL + 0)),
    ],
)
def test_codistillation_entropy_regulariser(kind: str, penalties: float) -> None:
    loss = SymmetricKLCodistillation(beta=2.0, ramp_steps=4, entropy_weight=0.1, entropy_kind=kind)
    value = loss(t([[LN3, 0]]), t([[0, 0]]), labels(0), 2)
    assert_value(value, CODISTILL_CE + 0.5 * (2.0 * CODISTILL_SKL + 0.1 * penalties))


def test_codistillation_sends_gradient_to_both_models() -> None:
    def grads(beta: float) -> tuple[Tensor, Tensor]:
        z1, z2 = t([[LN3, 0]]).requires_grad_(), t([[0, 0]]).requires_grad_()
        SymmetricKLCodistillation(beta=beta, ramp_steps=0)(z1, z2, labels(0), 0).backward()
        return z1.grad, z2.grad

    (ce_1, ce_2), (full_1, full_2) = grads(0.0), grads(1.0)
    assert not torch.allclose(full_1, ce_1)
    assert not torch.allclose(full_2, ce_2)


def test_codistillation_rejects_negative_step() -> None:
    with pytest.raises(ValueError, match="step must be >= 0"):
        SymmetricKLCodistillation(ramp_steps=3)(t([[0, 0]]), t([[0, 0]]), labels(0), -1)


# --- anti-distillation ----------------------------------------------------------------------

# J = 3 members, B = 4 samples, C = 1 class (so the CE terms are 0).
# a is not centred, so a missing centring changes (a, c): 1/4 sum a c = 2, not 1.
A, B_, C_ = [2, 0, 2, 0], [1, 1, -1, -1], [3, 1, 1, -1]
AD_MEMBERS = t([A, B_, C_]).unsqueeze(-1)
AD_LABELS = labels(0, 0, 0, 0)


def pearson(cov: float, var_i: float, var_j: float, eps: float) -> float:
    """Correlation with the eps-regularised standard deviations."""
    return cov / math.sqrt((var_i + eps) * (var_j + eps))


@pytest.mark.parametrize("eps", [1e-6, 0.1])
def test_ad_correlation(eps: float) -> None:
    # variances 1, 1, 2; covariances (a, b) = 0, (a, c) = 1, (b, c) = 1
    off_diagonal = [pearson(0, 1, 1, eps), pearson(1, 1, 2, eps), pearson(1, 1, 2, eps)]
    value = AntiDistillation(lam=1.0, eps=eps)(AD_MEMBERS, AD_LABELS)
    assert_value(value, 0.5 * 2 * sum(c**2 for c in off_diagonal))


def test_ad_covariance() -> None:
    value = AntiDistillation(lam=0.5, variant="covariance")(AD_MEMBERS, AD_LABELS)
    assert_value(value, 0.5 * (0.5 * 2 * (0**2 + 1**2 + 1**2)))


def test_ad_residual_correlation() -> None:
    # residuals around the ensemble mean [2, 2/3, 2/3, -2/3], centred over the batch:
    # a: [-1/3, -1, 1, 1/3], b: [-1/3, 1, -1, 1/3], c: [2/3, 0, 0, -2/3]
    # variances 5/9, 5/9, 2/9; covariances (a, b) = -4/9, (a, c) = (b, c) = -1/9
    eps = 1e-3
    off_diagonal = [
        pearson(-4 / 9, 5 / 9, 5 / 9, eps),
        pearson(-1 / 9, 5 / 9, 2 / 9, eps),
        pearson(-1 / 9, 5 / 9, 2 / 9, eps),
    ]
    value = AntiDistillation(variant="residual_correlation", eps=eps)(AD_MEMBERS, AD_LABELS)
    assert_value(value, 0.5 * 2 * sum(c**2 for c in off_diagonal))


def test_ad_negative_squared_difference() -> None:
    # a - b = [1, -1, 3, 1], a - c = [-1, -1, 1, 1], b - c = [-2, 0, -2, 0]
    value = AntiDistillation(variant="negative_squared_difference")(AD_MEMBERS, AD_LABELS)
    mean_squares = [(1 + 1 + 9 + 1) / 4, (1 + 1 + 1 + 1) / 4, (4 + 0 + 4 + 0) / 4]
    assert_value(value, -sum(mean_squares) / 3)


def test_ad_averages_the_penalty_over_classes_and_sums_member_ce() -> None:
    # (J, B, C) = (2, 2, 2); class 1 is constant across the batch (zero covariance)
    members = t([[[2, 0], [0, 0]], [[1 + LN3, 0], [-1 + LN3, 0]]])
    value = AntiDistillation(variant="covariance")(members, labels(0, 0))
    ce_0 = (-math.log(math.exp(2) / (math.exp(2) + 1)) + LN2) / 2
    ce_1 = (
        -math.log(math.exp(1 + LN3) / (math.exp(1 + LN3) + 1))
        - math.log(math.exp(-1 + LN3) / (math.exp(-1 + LN3) + 1))
    ) / 2
    # class 0: both members are [1, -1] + const: covariance matrix all ones -> 0.5 * 2 * 1
    assert_value(value, ce_0 + ce_1 + (0.5 * 2 * 1**2 + 0) / 2)


@pytest.mark.parametrize(
    "variant",
    ["correlation", "covariance", "residual_correlation", "negative_squared_difference"],
)
def test_ad_single_member_has_no_penalty(variant: str) -> None:
    member = t([[[0.3, -1.2, 2.0], [1.0, 0.0, -0.5]]])  # J = 1
    value = AntiDistillation(lam=3.0, variant=variant)(member, labels(2, 0))
    ce = torch.nn.functional.cross_entropy(member[0], labels(2, 0))
    assert_value(value, ce.item())


@pytest.mark.parametrize("variant", ["residual_correlation", "negative_squared_difference"])
def test_ad_identical_members_have_no_penalty(variant: str) -> None:
    same = random_logits(3, 5).detach()
    assert_value(AntiDistillation(variant=variant).penalty(torch.stack([same] * 3)), 0.0)


def test_ad_identical_members_are_fully_correlated() -> None:
    # variance of [2, 0, 2, 0] is 1: every off-diagonal correlation is 1 / (1 + eps)
    eps = 0.01
    value = AntiDistillation(eps=eps).penalty(t([A] * 3).unsqueeze(-1))
    assert_value(value, 0.5 * 6 * (1 / (1 + eps)) ** 2)


# --- gradients ------------------------------------------------------------------------------

Y3 = labels(0, 2, 1)
TARGET = random_logits(3, 4, seed=1).detach()

LOSS_CALLS: dict[str, Callable[[Tensor], Tensor]] = {
    "kd": lambda z: KnowledgeDistillation(temperature=2.0)(z, Y3, TARGET),
    "fd_kl": lambda z: FocalDistillation(temperature=3.0)(z, Y3, TARGET),
    "fd_lm": lambda z: FocalDistillation(divergence="lm")(z, Y3, TARGET),
    "ldi_reference": lambda z: LogitDifferenceInhibition(k=2)(z, TARGET),
    "ldi_union_margin": lambda z: LogitDifferenceInhibition(k=2, select="union", margin=0.1)(
        z, TARGET
    ),
    "elodi_legacy": lambda z: ELODILoss(k=2, legacy_weight=0.3)(z, Y3, TARGET, 2 * TARGET),
    "min_entropy": lambda z: MinimumEntropy(top_k=3)(z, Y3),
    "skl_uniform": lambda z: MinimumEntropy(kind="skl_uniform")(z, Y3),
}


@pytest.mark.parametrize("name", sorted(LOSS_CALLS))
def test_gradcheck_single_model_losses(name: str) -> None:
    assert gradcheck(LOSS_CALLS[name], (random_logits(3, 4),))


@pytest.mark.parametrize(("top_k", "kind"), [(None, "entropy"), (2, "skl_uniform")])
def test_gradcheck_codistillation(top_k: int | None, kind: str) -> None:
    loss = SymmetricKLCodistillation(top_k=top_k, entropy_weight=0.2, entropy_kind=kind)
    assert gradcheck(
        lambda a, b: loss(a, b, Y3, 1), (random_logits(3, 4), random_logits(3, 4, seed=2))
    )


@pytest.mark.parametrize(
    "variant",
    ["correlation", "covariance", "residual_correlation", "negative_squared_difference"],
)
def test_gradcheck_anti_distillation(variant: str) -> None:
    loss = AntiDistillation(lam=0.7, variant=variant)
    assert gradcheck(lambda z: loss(z, labels(0, 1, 2, 1)), (random_logits(3, 4, 3),))


@pytest.mark.parametrize(
    "call",
    [
        lambda z, r: KnowledgeDistillation()(z, labels(0), r),
        lambda z, r: FocalDistillation()(z, labels(0), r),
        lambda z, r: ELODILoss(legacy_weight=0.5)(z, labels(0), r, r),
    ],
)
def test_targets_receive_no_gradient(call: Callable[[Tensor, Tensor], Tensor]) -> None:
    z, r = random_logits(1, 3), random_logits(1, 3, seed=4)
    call(z, r).backward()
    assert r.grad is None
    assert z.grad is not None


# --- hyperparameter validation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: KnowledgeDistillation(lam=-1.0), "lam must be"),
        (lambda: KnowledgeDistillation(temperature=0.0), "temperature must be"),
        (lambda: FocalDistillation(beta=-0.1), "beta must be"),
        (lambda: FocalDistillation(alpha=math.nan), "alpha must be"),
        (lambda: FocalDistillation(divergence="l2"), "divergence must be one of"),
        (lambda: LogitDifferenceInhibition(k=0), "k must be an integer >= 1"),
        (lambda: LogitDifferenceInhibition(k=2.5), "k must be"),
        (lambda: LogitDifferenceInhibition(p=0.5), "p must be"),
        (lambda: LogitDifferenceInhibition(select="teacher"), "select must be one of"),
        (lambda: LogitDifferenceInhibition(margin=-1.0), "margin must be"),
        (lambda: ELODILoss(alpha=1.5), "alpha must lie in"),
        (lambda: ELODILoss(legacy_weight=-0.1), "legacy_weight must lie in"),
        (lambda: ELODILoss(k=-3), "k must be"),
        (lambda: MinimumEntropy(alpha=2.0), "alpha must lie in"),
        (lambda: MinimumEntropy(top_k=1), "top_k must be"),
        (lambda: MinimumEntropy(kind="max"), "kind must be one of"),
        (lambda: SymmetricKLCodistillation(beta=-1.0), "beta must be"),
        (lambda: SymmetricKLCodistillation(ramp_steps=-1), "ramp_steps must be"),
        (lambda: SymmetricKLCodistillation(ramp_steps=True), "ramp_steps must be"),
        (lambda: SymmetricKLCodistillation(top_k=0), "top_k must be"),
        (lambda: SymmetricKLCodistillation(entropy_weight=-0.5), "entropy_weight must be"),
        (lambda: SymmetricKLCodistillation(entropy_kind="gini"), "entropy_kind must be one of"),
        (lambda: AntiDistillation(lam=-2.0), "lam must be"),
        (lambda: AntiDistillation(variant="cosine"), "variant must be one of"),
        (lambda: AntiDistillation(eps=0.0), "eps must be"),
    ],
)
def test_bad_hyperparameters_are_rejected(make: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_anti_distillation_needs_member_axis() -> None:
    with pytest.raises(ValueError, match=r"member_logits must be \(J, B, C\)"):
        AntiDistillation()(t([[0, 1]]), labels(0))


# --- defaults come from the method options ---------------------------------------------------


def test_elodi_with_no_arguments_uses_the_method_defaults() -> None:
    # Elodi(): alpha 0.5, p 1, all classes of 2 (k 10): LDI([0, 0], [1, -1]) = 1 + 1
    assert (Elodi.alpha, Elodi.p) == (0.5, 1.0)
    value = ELODILoss()(t([[0, 0]]), labels(0), t([[1, -1]]))
    assert_value(value, 0.5 * LN2 + 0.5 * 2)


def test_minimum_entropy_with_no_arguments_uses_the_method_defaults() -> None:
    assert Entropy.alpha == 0.1
    value = MinimumEntropy()(t([[LN3, 0]]), labels(1))
    assert_value(value, 0.9 * math.log(4) + 0.1 * ENTROPY_QUARTER)


def test_codistillation_with_no_arguments_uses_the_method_defaults() -> None:
    # Codistill(): beta 5 reached after a 200-step ramp
    assert (Codistill.beta, Codistill.ramp_steps) == (5.0, 200)
    loss = SymmetricKLCodistillation()
    z1, z2 = t([[LN3, 0]]), t([[0, 0]])
    assert_value(loss(z1, z2, labels(0), 0), CODISTILL_CE)
    assert_value(loss(z1, z2, labels(0), 100), CODISTILL_CE + 2.5 * CODISTILL_SKL)
    assert_value(loss(z1, z2, labels(0), 200), CODISTILL_CE + 5.0 * CODISTILL_SKL)


@pytest.mark.parametrize(
    ("loss", "options", "names"),
    [
        (KnowledgeDistillation(), KD(), ["lam", "temperature"]),
        (FocalDistillation(), FD(), ["alpha", "beta", "temperature", "lam", "divergence"]),
        (ELODILoss(), Elodi(), ["alpha", "legacy_weight"]),
        (MinimumEntropy(), Entropy(), ["alpha", "top_k", "kind"]),
        (SymmetricKLCodistillation(), Codistill(),
         ["beta", "ramp_steps", "top_k", "entropy_weight", "entropy_kind"]),
        (AntiDistillation(), AntiDistill(), ["lam", "variant"]),
    ],
)
def test_a_loss_built_with_no_arguments_has_its_methods_defaults(loss, options, names) -> None:
    assert {name: getattr(loss, name) for name in names} == {
        name: getattr(options, name) for name in names}
    if isinstance(loss, ELODILoss):
        assert (loss.ldi.k, loss.ldi.p, loss.ldi.select) == (options.k, options.p, options.select)
