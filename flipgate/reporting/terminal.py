"""Terminal report of one old/new comparison (rich tables of flipgate.reporting.rows and, for a
traffic set, of flipgate.reporting.traffic), and the tables of the server's matrix and
decisions that `flipgate demo` prints.
"""

from rich.console import Console
from rich.table import Table
from rich.text import Text

from flipgate.reporting.multilabel import (
    TERMINAL_GROUP_HEADER,
    TERMINAL_LABEL_HEADER,
    multilabel_headline_rows,
    multilabel_hints,
    terminal_group_row,
    terminal_label_row,
    worst_labels_first,
)
from flipgate.reporting.rows import (
    CLASS_HEADER,
    class_row,
    flip_severity,
    fmt_pct,
    fmt_points,
    headline_rows,
    verdict_hints,
    worst_class,
)
from flipgate.reporting.traffic import (
    change_section,
    group_churn_table,
    traffic_note,
    traffic_rows,
)

MAX_TERMINAL_CLASSES = 20


def _headline_table(report: dict, old_name: str, new_name: str) -> Table:
    table = Table(title=Text(f"{old_name} → {new_name}"), title_justify="left")
    table.add_column("Metric")
    table.add_column("Value", justify="right")
    for label, value in headline_rows(report):
        table.add_row(Text(label), Text(value))
    return table


def _shown_classes(report: dict) -> tuple[list[dict], str | None]:
    entries = report.get("per_class") or []
    if len(entries) <= MAX_TERMINAL_CLASSES:
        return entries, None
    shown = sorted(entries, key=flip_severity, reverse=True)[:MAX_TERMINAL_CLASSES]
    return shown, f"{len(shown)} of {len(entries)} classes, highest NFR first"


def _class_table(report: dict, class_names: list[str] | None) -> Table:
    entries, caption = _shown_classes(report)
    worst = worst_class(report)
    table = Table(title="Per class", title_justify="left", caption=caption)
    for i, name in enumerate(CLASS_HEADER):
        table.add_column(name, justify="left" if i == 0 else "right")
    for entry in entries:
        cells = [Text(cell) for cell in class_row(entry, class_names)]
        if entry is worst:
            cells[0].append("  ◀ worst NFR")
        table.add_row(*cells, style="bold red" if entry is worst else None)
    return table


def render_report(
    report: dict,
    console: Console,
    *,
    old_name: str,
    new_name: str,
    class_names: list[str] | None = None,
) -> None:
    """Print the headline table, the per-class table and the verdict hints to `console` (a
    traffic report's own tables for a traffic set)."""
    if report.get("traffic"):
        render_traffic(report, console, old_name=old_name, new_name=new_name)
        return
    if report.get("multilabel"):
        render_multilabel(report, console, old_name=old_name, new_name=new_name)
        return
    console.print(_headline_table(report, old_name, new_name))
    console.print(_class_table(report, class_names))
    console.print(Text("Verdict hints", style="bold"))
    hints = verdict_hints(report, old_name=old_name, new_name=new_name, class_names=class_names)
    for hint in hints:
        console.print(Text(f"• {hint}"))


def _rows_table(title: str, header: list[str], rows) -> Table:
    """A table of formatted rows, the first column left-aligned, the others right."""
    table = Table(title=Text(title), title_justify="left")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def render_multilabel(report: dict, console: Console, *, old_name: str, new_name: str) -> None:
    """Print a multi-label report's headline, its per-label table (the worst labels first,
    at most MAX_TERMINAL_CLASSES of them), its per-group table and its hints."""
    console.print(_rows_table(f"{old_name} → {new_name} (multi-label)", ["Metric", "Value"],
                              multilabel_headline_rows(report)))
    labels = worst_labels_first(report)
    shown = labels[:MAX_TERMINAL_CLASSES]
    table = _rows_table("Per label, highest NFR first (pos: samples with the label)",
                        TERMINAL_LABEL_HEADER, map(terminal_label_row, shown))
    if len(shown) < len(labels):
        table.caption = f"{len(shown)} of {len(labels)} labels"
    console.print(table)
    if groups := report.get("per_group"):
        console.print(_rows_table("Per group (NFR, churn: per sample; HL: Hamming loss)",
                                  TERMINAL_GROUP_HEADER, map(terminal_group_row, groups)))
    console.print(Text("Verdict hints", style="bold"))
    for hint in multilabel_hints(report, old_name=old_name, new_name=new_name):
        console.print(Text(f"• {hint}"))


def render_traffic(report: dict, console: Console, *, old_name: str, new_name: str) -> None:
    """Print a traffic report's headline, its changed predictions, churn per group and why
    the entries that need labels are null."""
    console.print(_rows_table(f"{old_name} → {new_name} on traffic", ["Metric", "Value"],
                              traffic_rows(report)))
    console.print(_rows_table(*change_section(report)))
    if report.get("per_group_churn"):
        console.print(_rows_table("Churn per group", *group_churn_table(report)))
    if note := traffic_note(report):
        console.print(Text(f"• {note}"))


def render_matrix(matrix: dict, console: Console, *, title: str) -> None:
    """A line's pairwise NFR matrix (row: old version, column: new version), with churn."""
    table = Table(title=title, title_justify="left")
    table.add_column("old ↓ / new →")
    for version in matrix["versions"]:
        table.add_column(str(version), justify="right")
    for i, version in enumerate(matrix["versions"]):
        cells = [f"{fmt_pct(nfr)} ({fmt_pct(churn)})"
                 for nfr, churn in zip(matrix["nfr"][i], matrix["churn"][i], strict=True)]
        table.add_row(str(version), *cells)
    console.print(table)


def render_decisions(decisions: list[dict], console: Console, *, title: str) -> None:
    """The gate's decisions (the JSON of GET /gate/decisions/{id}) as one table."""
    table = Table(title=title, title_justify="left")
    for column in ("candidate", "baseline", "verdict", "NFR", "ER change", "why"):
        table.add_column(column)
    for decision in decisions:
        numbers = next(iter(decision["metrics"].values()), {})
        style = {"approve": "green", "block": "red"}.get(decision["verdict"], "yellow")
        why = [reason["message"] for reason in decision["reasons"]]
        if decision["repair_of"] is not None:
            why.insert(0, f"repair of decision {decision['repair_of']}")
        table.add_row(decision["candidate"], decision["baseline"] or "—",
                      Text(decision["verdict"], style=style), fmt_pct(numbers.get("nfr")),
                      fmt_points(numbers.get("er_old"), numbers.get("er_new")),
                      "; ".join(why) or "within the policy")
    console.print(table)
