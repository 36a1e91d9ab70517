"""`flipgate repair interpolate` and `flipgate repair ensemble`: arguments and command bodies."""

import argparse
import json
from pathlib import Path

from flipgate.commands import Parser
from flipgate.progress import progress_bars
from flipgate.repair.search import DEFAULT_LIMITS, Limits, RepairResult


def add_repair_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate repair` subcommand and its two methods."""
    repair = commands.add_parser(
        "repair", help="repair a flipping update on its ONNX files alone (no retraining)")
    methods = repair.add_subparsers(dest="repair_method", required=True, parser_class=Parser)
    interpolate = methods.add_parser(
        "interpolate", help="blend the weights of two versions of one architecture",
        description="θ(α) = α·θ_old + (1 − α)·θ_new over the float initializers; α is the "
                    "smallest share of the old model meeting the limits on CAL.npz. Meant for a "
                    "new model fine-tuned from the old one; inference costs one model.")
    _add_pair_arguments(interpolate)
    interpolate.add_argument("--calibration", type=Path, required=True, metavar="CAL.npz",
                             help="labeled samples to choose α on (not the gate's eval sets)")
    _add_limit_arguments(interpolate)
    interpolate.set_defaults(run=run_interpolate)
    ensemble = methods.add_parser(
        "ensemble", help="run both models in one graph and mix their outputs",
        description="Outputs w·z_old + (1 − w)·z_new for any two models with the same input and "
                    "classes; inference costs both models.")
    _add_pair_arguments(ensemble)
    chosen = ensemble.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--weight", type=float, metavar="W", help="the old model's weight w")
    chosen.add_argument("--calibration", type=Path, metavar="CAL.npz",
                        help="choose the smallest w meeting the limits on these samples")
    _add_limit_arguments(ensemble)
    ensemble.add_argument("--probabilities", action="store_true",
                          help="mix softmax probabilities (the output is their log); for "
                               "multi-label models each label's sigmoid probability (the "
                               "output is its logit)")
    ensemble.add_argument("--multilabel", action="store_true",
                          help="the models score labels (one sigmoid logit each); implied "
                               "by a multi-label calibration set")
    ensemble.set_defaults(run=run_ensemble)


def _add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=Path, metavar="OLD.onnx")
    parser.add_argument("new", type=Path, metavar="NEW.onnx")
    parser.add_argument("--out", type=Path, required=True, metavar="FIXED.onnx")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-nfr", type=float, default=DEFAULT_LIMITS.max_nfr, metavar="X",
                        help="NFR against the old model, as a fraction (default %(default)s)")
    parser.add_argument("--max-er-increase", type=float, metavar="Y",
                        default=DEFAULT_LIMITS.max_er_increase,
                        help="error rate above the old model's, as a fraction "
                             "(default %(default)s)")


def run_interpolate(args: argparse.Namespace) -> int:
    """Choose α on the calibration set and write the interpolated model."""
    from flipgate.repair.interpolate import interpolate

    with progress_bars(enabled=not args.json) as bar:
        result = interpolate(args.old, args.new, args.calibration, args.out, _limits(args),
                             progress=bar("searching α"))
    _report(result, args.json)
    return 0


def run_ensemble(args: argparse.Namespace) -> int:
    """Write the ensemble with the given weight or the one chosen on the calibration set."""
    from flipgate.repair.ensemble import ensemble

    with progress_bars(enabled=not args.json) as bar:
        result = ensemble(args.old, args.new, args.out, weight=args.weight,
                          calibration=args.calibration, limits=_limits(args),
                          probabilities=args.probabilities, multilabel=args.multilabel,
                          progress=bar("searching w"))
    _report(result, args.json)
    return 0


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(max_nfr=args.max_nfr, max_er_increase=args.max_er_increase)


def _report(result: RepairResult, as_json: bool) -> None:
    """Print the result as JSON, or the curve as a table and a summary line."""
    if as_json:
        print(json.dumps(result.to_dict()))
        return
    from rich.console import Console
    from rich.table import Table

    symbol = "α" if result.method == "interpolate" else "w"
    console = Console()
    if result.curve:
        table = Table(symbol, "ER %", "NFR %", "churn %", "ER − ER_old (pt)",
                      title="on the calibration set, against the old model")
        for point in result.curve:
            table.add_row(f"{point.share:.4f}", f"{100 * point.er:.2f}", f"{100 * point.nfr:.2f}",
                          f"{100 * point.churn:.2f}", f"{100 * point.er_increase:+.2f}")
        console.print(table)
    console.print(f"{result.method}: {symbol} = {result.share:.4f}; wrote {result.out}")
