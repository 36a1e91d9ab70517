"""The training methods and their options, without torch: what the CLI parses and records.

The recipes that run them live in flipgate.train.recipes.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

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
class Method:
    """A method's options type, whether it uses an old model, how options are resolved, and
    how many training phases (progress bars) it runs."""

    options: type
    old: str = "unused"  # "required", "optional" or "unused"
    phases: int = 1
    resolve: Callable[[Any, bool], Any] = lambda options, has_old: options


METHODS: dict[str, Method] = {
    "baseline": Method(Baseline),
    "kd": Method(KD, old="required"),
    "fd": Method(FD, old="required"),
    "elodi": Method(Elodi, old="optional", phases=2,
                    resolve=lambda options, has_old: options.for_old_model(has_old)),
    "codistill": Method(Codistill),
    "entropy": Method(Entropy),
    "anti_distill": Method(AntiDistill),
    "paragon": Method(Paragon),
}


def resolve_options(method: str, options: Any, *, has_old: bool) -> Any:
    """The method's options (defaults when None) as training will use them; checks --old."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    spec = METHODS[method]
    if spec.old == "required" and not has_old:
        raise ValueError(f"method {method!r} needs the old model (--old OLD.onnx)")
    if spec.old == "unused" and has_old:
        raise ValueError(f"method {method!r} does not use an old model; drop --old")
    return spec.resolve(spec.options() if options is None else options, has_old)
