"""docs/reproduction.md: the experiment's table, its targets and an ER–NFR scatter plot."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from flipgate.train.experiment import COLUMNS, target_results

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
    """Write the markdown page and its scatter plot (same stem, .svg) beside it."""
    plot = scatter_plot(table, path.with_suffix(".svg"))
    sections = [header, "## Targets", targets_section(table)]
    for setting, rows in table.items():
        sections += [f"## Update with {setting}", markdown_table(rows)]
    sections += ["## ER vs. NFR", f"![ER–NFR scatter]({plot.name})"]
    path.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    return path
