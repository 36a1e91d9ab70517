"""The `flipgate` command."""

import argparse
import json
import os
import sys
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flipgate.commands import (
    COMMAND_GROUP,
    TOKEN_ENV,
    Parser,
    add_server_flags,
    add_wait_flags,
    check_wait_flags,
    comma_list,
    positive_int,
    server_credentials,
)
from flipgate.errors import InputError
from flipgate.progress import progress_bars

if TYPE_CHECKING:  # numpy and ONNX Runtime (0.16 s) load where a command needs them
    import numpy as np

    from flipgate.demo import DemoFiles
    from flipgate.formats.evalsets import EvalSet

AddCommand = Callable[[argparse._SubParsersAction], None]
SECRET_ENV = "FLIPGATE_WEBHOOK_SECRET"  # `flipgate gate`'s default --secret


def data_dir() -> Path:
    return Path(os.environ.get("FLIPGATE_DATA_DIR", "flipgate-data"))


def run_compare(args: argparse.Namespace) -> int:
    """Compare OLD and NEW on the eval set and print or write the report."""
    from flipgate.compare import ReadAs
    from flipgate.comparison import TrafficOutputs

    reads = tuple(ReadAs(getattr(args, f"{side}_output") or args.output,
                         getattr(args, f"{side}_scores") or args.scores,
                         read_thresholds(getattr(args, f"{side}_thresholds") or args.thresholds))
                  for side in ("old", "new"))
    traffic = TrafficOutputs(args.labels, args.disagreements, args.format, args.label_config,
                             args.multilabel)
    compare_and_print(args.old, args.new, args.evalset, html=args.html, as_json=args.json,
                      batch_size=args.batch_size, device=args.device,
                      gallery=not args.no_gallery, reads=reads, traffic=traffic)
    return 0


def read_thresholds(given: str | None) -> tuple[float, ...] | None:
    """A multi-label version's thresholds: numbers separated by commas, or a .json file
    holding their list."""
    from flipgate.onnx_io import check_thresholds

    if given is None:
        return None
    if given.endswith(".json"):
        try:
            values = json.loads(Path(given).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise InputError("invalid_thresholds", f"cannot read thresholds from {given}: "
                             f"{error}") from error
    else:
        try:
            values = [float(value) for value in given.split(",")]
        except ValueError:
            values = given
    return check_thresholds(values, f"thresholds {given}")


def compare_and_print(old: Path, new: Path, evalset: Path, *, as_json: bool = False,
                      **options: Any) -> None:
    """Compare OLD and NEW on the eval set (flipgate.comparison.compare_files, with
    `options`), write the files it made and print its report: JSON, or the terminal's."""
    from flipgate.comparison import compare_files

    with progress_bars(enabled=not as_json) as bars:
        comparison = compare_files(old, new, evalset, progress=bars, **options)
    for path, data in comparison.files.items():
        write_bytes(path, data)
    report = comparison.report
    if as_json:
        print(json.dumps(report, allow_nan=False))
    else:
        from rich.console import Console

        from flipgate.reporting.terminal import render_report

        render_report(report, Console(), old_name=str(old), new_name=str(new),
                      class_names=report.get("class_names"))


def write_bytes(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as error:
        raise InputError("cannot_write", f"cannot write {path}: {error.strerror}") from error
    print(f"wrote {path}", file=sys.stderr)


def run_demo(args: argparse.Namespace) -> int:
    """Train an old and a new MNIST model, export them to ONNX, compare them here and then
    through a real server (registration, queued inference on a worker, compare, matrix)."""
    from flipgate.demo import prepare_demo

    folder = args.data_dir / "demo"
    with progress_bars() as bar:
        files = prepare_demo(folder, bar)
    compare_and_print(files.old_model, files.new_model, files.evalset,
                      html=folder / "report.html")
    print(f"\nRun it yourself: flipgate compare {files.old_model} {files.new_model} "
          f"--evalset {files.evalset} [--json] [--html FILE]")
    return 0 if args.local_only else demo_through_server(files, folder / "server", args.serve)


def demo_through_server(files: "DemoFiles", folder: Path, serve: bool = False) -> int:
    """The demo's models through `flipgate serve` and its gate: print the server's report of
    the same update, the gate's decisions, the line's matrix and its dashboard's URL."""
    from rich.console import Console

    from flipgate.demo_server import (
        LINE,
        POLICY,
        ServerDemoError,
        run_through_server,
        show_dashboard,
    )
    from flipgate.reporting.terminal import render_decisions, render_matrix, render_report

    console = Console()
    console.rule(f"The same update through flipgate serve (data in {folder})")
    try:
        with run_through_server(files, folder) as served:
            render_report(served.report, console, old_name=f"{LINE}:1", new_name=f"{LINE}:3")
            render_decisions(served.decisions, console, title=f"The deploy gate on {LINE} "
                             f"(policy {POLICY}); 2 is trained with FD towards 1, 3 plainly")
            render_matrix(served.matrix, console,
                          title=f"{LINE}: NFR (churn) for every pair of versions")
            show_dashboard(served, serve=serve)
    except ServerDemoError as error:
        print(f"flipgate demo: error: {error}", file=sys.stderr)
        return 1
    return 0


def run_train(args: argparse.Namespace) -> int:
    """Train a model with a recipe and export it as ONNX with its record beside it; a training
    set whose y is a 0/1 matrix (N, L) trains a multi-label model (one logit per label)."""
    from flipgate.formats.evalsets import check_labels, load_training_set
    from flipgate.train import recipes
    from flipgate.train.loop import TrainConfig
    from flipgate.train.options import method_options

    if args.out.suffix != ".onnx":
        raise InputError("invalid_output", f"--out must name an .onnx file, got {args.out}")
    data = load_training_set(args.train, multilabel=True)
    old_logits, num_classes = old_model_logits(args, data)
    if not data.multilabel:
        check_labels(data.y, num_classes, source=str(args.train))
    settings = {k: v for k in ("epochs", "batch_size", "lr", "weight_decay", "seed")
                if (v := getattr(args, k)) is not None}
    try:
        options, config = method_options(args, args.method), TrainConfig(**settings)
        with progress_bars() as bar:
            trained = recipes.train(args.method, args.arch, data, num_classes, config, options,
                                    old_logits, progress=bar, init=args.init)
    except InputError:
        raise
    except ValueError as error:
        raise InputError("invalid_option", str(error)) from error
    path = trained.save(args.out, data.sample_shape)
    record = trained.record
    kind = f"; {num_classes} labels, multi-label" if data.multilabel else ""
    print(f"trained {record['method']} ({record['arch']}) on {record['samples']} samples in "
          f"{record['seconds']:.1f} s on {record['device']}{kind}; wrote {path} and "
          f"{path.with_suffix('.json')}")
    return 0


def old_model_logits(args: argparse.Namespace,
                     data: "EvalSet") -> "tuple[np.ndarray | None, int]":
    """The old model's logits on the training set and the class count it implies."""
    from flipgate.inference import OnnxClassifier

    if data.multilabel:
        return old_label_logits(args, data)
    num_classes = args.num_classes or int(data.y.max()) + 1
    if args.old is None:
        return None, num_classes
    old = OnnxClassifier(args.old)
    if args.num_classes and args.num_classes != old.num_classes:
        raise InputError("class_count_mismatch", f"--num-classes {args.num_classes} but "
                           f"{args.old} has {old.num_classes} classes")
    old.check_evalset(data)
    with progress_bars() as bar:
        return old.predict(data.x, progress=bar("old model on the training set")), old.num_classes


def old_label_logits(args: argparse.Namespace,
                     data: "EvalSet") -> "tuple[np.ndarray | None, int]":
    """On a multi-label training set: the old model's logit of each label (from its
    probabilities, as the server's retraining reads it) and the model's output count (the
    labels', which recipes.train checks --num-classes against)."""
    from flipgate.inference import MultiLabelOnnx
    from flipgate.scores import label_logits

    num_outputs = args.num_classes or data.y.shape[1]
    if args.old is None:
        return None, num_outputs
    old = MultiLabelOnnx(args.old)
    old.check_evalset(data)
    with progress_bars() as bar:
        probabilities = old.predict(old.feeds(data),
                                    progress=bar("old model on the training set"))
    return label_logits(probabilities), num_outputs


def run_experiment(args: argparse.Namespace) -> int:
    """Train every treatment on MNIST over several seeds and write docs/reproduction.md."""
    from flipgate.reporting.experiment import run_and_write

    with progress_bars() as bar:
        path = run_and_write(args.seeds, args.epochs, args.out, args.settings,
                             progress=bar("old → new updates"))
    print(path.read_text(encoding="utf-8"))
    return 0


def run_gate(args: argparse.Namespace) -> int:
    """Ask the server's deploy gate whether CANDIDATE may replace BASELINE and wait for the
    verdict: exit 0 approve, 1 block, 2 refused or unreachable, 3 still pending at --timeout,
    4 pending until people label a traffic set's disagreements (printed: how many, where)."""
    from flipgate import gate_client

    credentials = server_credentials(args, secret=args.secret or os.environ.get(SECRET_ENV))
    if not (credentials.token or credentials.secret):
        raise InputError("missing_credentials", f"give --token (or {TOKEN_ENV}) or --secret "
                           f"(or {SECRET_ENV})")
    given_ci = {key.removeprefix("ci_"): value for key, value in vars(args).items()
                if key.startswith("ci_")}
    request = {"model": args.model, "candidate": args.candidate, "baseline": args.baseline,
               "evalsets": args.evalset, "ci": gate_client.ci_context(given_ci, os.environ),
               "callback_url": args.callback_url}
    check_wait_flags(args)
    try:
        decision = gate_client.ask(args.server, request, credentials, delivery=args.delivery,
                                   timeout=args.timeout, poll=args.poll,
                                   on_pending=gate_client.status_printer(sys.stderr))
    except gate_client.GateTimeout as timeout:
        print(f"flipgate gate: error: {timeout}", file=sys.stderr)
        return 3
    print(json.dumps(decision) if args.json else "\n".join(gate_client.describe(decision)))
    return gate_client.exit_code(decision)


def add_read_as_flags(parser: argparse.ArgumentParser) -> None:
    """--output/--scores for both ONNX models, --old-*/--new-* for one of them."""
    from flipgate.scores import SCORE_KINDS

    for side, whose in (("", "both models"), ("old-", "OLD"), ("new-", "NEW")):
        parser.add_argument(f"--{side}output", metavar="NAME", help="the ONNX output that "
                            f"holds the scores of {whose} (default: chosen from the graph)")
        parser.add_argument(f"--{side}scores", choices=SCORE_KINDS, help=f"what {whose}'s "
                            "scores are (default: detected from the graph)")


def add_compare_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate compare` subcommand."""
    from flipgate.inference import DEFAULT_BATCH_SIZE, DEVICES
    from flipgate.traffic import EXPORT_FORMATS

    compare = commands.add_parser(
        "compare", help="compare two models sample by sample on a labeled eval set",
        description="OLD and NEW are ONNX classifiers (.onnx) or precomputed logits (.npy).")
    compare.add_argument("old", type=Path, metavar="OLD")
    compare.add_argument("new", type=Path, metavar="NEW")
    compare.add_argument("--evalset", type=Path, required=True, metavar="E.npz",
                         help="eval set: .npz with x (float32, N first) and y (int labels, "
                              "or a 0/1 matrix (N, L) of labels for multi-label models)")
    compare.add_argument("--json", action="store_true", help="print one JSON object")
    compare.add_argument("--html", type=Path, metavar="FILE", help="write an HTML report")
    compare.add_argument("--no-gallery", action="store_true",
                         help="leave the gallery of negatively flipped samples out of --html")
    compare.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE)
    traffic = compare.add_argument_group("traffic sets (eval sets without y; docs/traffic.md)")
    traffic.add_argument("--labels", type=Path, metavar="FILE", help="labels known so far: "
                         ".npz of index (or ids) and y, or a Label Studio JSON export")
    traffic.add_argument("--disagreements", type=Path, metavar="FILE",
                         help="write every sample whose prediction changed, in export order")
    traffic.add_argument("--format", choices=EXPORT_FORMATS, default="json",
                         help="the disagreements' format (default: json)")
    traffic.add_argument("--label-config", type=Path, metavar="FILE.xml",
                         help="write the Label Studio labelling configuration of the export")
    traffic.add_argument("--multilabel", action="store_true",
                         help="the traffic of multi-label models: each side scores every "
                              "label (.onnx, .npy scores (N, L) or 0/1 decisions (N, L))")
    add_read_as_flags(compare)
    for side, whose in (("", "both models"), ("old-", "OLD"), ("new-", "NEW")):
        compare.add_argument(f"--{side}thresholds", metavar="T,T,…|FILE.json",
                             help=f"multi-label eval sets: the decision threshold of each label "
                                  f"for {whose} (default: the model's metadata, else 0.5)")
    compare.add_argument("--device", choices=DEVICES, default="auto",
                         help="where ONNX Runtime runs the models (default: CUDA if usable)")
    compare.set_defaults(run=run_compare)


def add_train_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate train` subcommand."""
    from flipgate.train.methods import METHODS
    from flipgate.train.options import add_method_flags

    train = commands.add_parser(
        "train", help="train a classifier with a flip-reducing recipe and export it as ONNX",
        description="Trains on DATA.npz (same format as an eval set; y a 0/1 matrix (N, L) "
                    "trains a multi-label model) and writes MODEL.onnx and MODEL.json "
                    "(method, options, seeds, time).")
    train.add_argument("--method", required=True, choices=list(METHODS))
    train.add_argument("--arch", required=True,
                       help="mlp, cnn, resnet, options as mlp:hidden=256,256, or "
                            "package.module:factory")
    train.add_argument("--train", type=Path, required=True, metavar="DATA.npz")
    train.add_argument("--out", type=Path, required=True, metavar="MODEL.onnx")
    train.add_argument("--old", type=Path, metavar="OLD.onnx",
                       help="the deployed model (kd and fd need it; elodi adds a legacy term)")
    train.add_argument("--init", type=Path, metavar="OLD.onnx",
                       help="start from this model's weights (a flipgate export of --arch)")
    train.add_argument("--num-classes", type=positive_int)
    train.add_argument("--epochs", type=positive_int)
    train.add_argument("--batch-size", type=positive_int)
    train.add_argument("--lr", type=float)
    train.add_argument("--weight-decay", type=float)
    train.add_argument("--seed", type=int)
    add_method_flags(train)
    train.set_defaults(run=run_train)


def add_experiment_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate experiment` subcommand."""
    experiment = commands.add_parser(
        "experiment", help="reproduce the papers' comparison of treatments on MNIST")
    experiment.add_argument("--seeds", type=positive_int, default=3)
    experiment.add_argument("--epochs", type=positive_int, default=10)
    experiment.add_argument("--out", type=Path, default=Path("docs/reproduction.md"))
    experiment.add_argument("--settings", type=comma_list, metavar="NAME,NAME",
                            help="re-run only these settings; the others' runs are kept from "
                                 "the raw runs beside --out (default: all)")
    experiment.set_defaults(run=run_experiment)


def add_demo_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate demo` subcommand."""
    demo = commands.add_parser(
        "demo", help="train two MNIST models and compare them, locally and through a server")
    demo.add_argument("--data-dir", type=Path, default=data_dir(),
                      help="where the demo writes its models, eval set and report "
                           "(default: $FLIPGATE_DATA_DIR or ./flipgate-data)")
    demo.add_argument("--local-only", action="store_true",
                      help="skip the second half, which runs the same update through a "
                           "flipgate serve started for the demo")
    demo.add_argument("--serve", action="store_true",
                      help="keep the demo's server running (until Ctrl-C) to browse its "
                           "dashboard")
    demo.set_defaults(run=run_demo)


def add_gate_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate gate` subcommand."""
    gate = commands.add_parser(
        "gate", help="ask a server's deploy gate whether a candidate version may ship",
        description="POSTs /gate and waits for the final verdict. Exit codes: 0 approve, "
                    "1 block, 2 usage or HTTP error, 3 still pending at --timeout. CI fields "
                    "default to GitHub Actions or GitLab CI variables when present.")
    add_server_flags(gate, token_needs="scope gate")
    gate.add_argument("--model", required=True, help="the model line")
    gate.add_argument("--candidate", required=True, metavar="VERSION")
    gate.add_argument("--baseline", metavar="VERSION", help="default: the line's production")
    gate.add_argument("--evalset", action="append", default=[], metavar="NAME",
                      help="an eval set to measure besides the policy's (repeatable)")
    gate.add_argument("--secret", help="the line's webhook secret, to sign the request "
                                       f"(default: ${SECRET_ENV})")
    gate.add_argument("--delivery", metavar="ID",
                      help="idempotency key: a retry with the same id gets the same decision "
                           "(default: a random UUID)")
    gate.add_argument("--callback-url", metavar="URL",
                      help="where the server POSTs the final status")
    for field in ("provider", "repo", "sha", "ref", "run-url"):
        gate.add_argument(f"--ci-{field}", help="default: from the CI's environment")
    add_wait_flags(gate)
    gate.set_defaults(run=run_gate)


def imported_when_added(module: str, function: str) -> AddCommand:
    """The `function` of `module` that adds a command's parser, imported when called."""
    return lambda commands: getattr(import_module(module), function)(commands)


LIBRARY_COMMANDS: dict[str, AddCommand] = {  # in the order --help lists them
    "compare": add_compare_command, "train": add_train_command,
    "experiment": add_experiment_command, "demo": add_demo_command, "gate": add_gate_command,
    "repair": imported_when_added("flipgate.repair.cli", "add_repair_command"),
    "policy": imported_when_added("flipgate.policy_client", "add_policy_command"),
    "mlflow": imported_when_added("flipgate.mlflow_gate", "add_mlflow_command"),
    "upload": imported_when_added("flipgate.upload_client", "add_upload_command"),
    "traffic": imported_when_added("flipgate.capture", "add_traffic_command"),
}
SERVER_MISSING = ("; the server's commands (serve, worker, migrate, token) come with flipgate's "
                  "server packages, which are not installed")


def build_parser(argv: list[str]) -> Parser:
    """The `flipgate` parser: the library's commands, then those other installed packages
    contribute (flipgate.commands), loaded only when `argv` may need them."""
    parser = Parser(prog="flipgate", description="Regression gate for classifier updates.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_library_commands(commands, argv)
    if requested_command(argv) not in commands.choices and not add_contributed_commands(commands):
        parser.hint = SERVER_MISSING
    return parser


def add_library_commands(commands: argparse._SubParsersAction, argv: list[str]) -> None:
    """The parser of the library command that `argv` starts with (the others' modules cost
    15 ms to import); of them all when it starts with none (--help, a server's command)."""
    names = argv[:1] if argv[:1] and argv[0] in LIBRARY_COMMANDS else LIBRARY_COMMANDS
    for name in names:
        LIBRARY_COMMANDS[name](commands)


def requested_command(argv: list[str]) -> str | None:
    """The subcommand `argv` names (the first word that is not an option), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def add_contributed_commands(commands: argparse._SubParsersAction) -> int:
    """Add the subcommands of the entry-point group flipgate.commands and count them; one
    whose package cannot be imported is still listed and says why when it runs."""
    from importlib.metadata import entry_points  # 20 ms that a library command never needs

    contributed = entry_points(group=COMMAND_GROUP)
    for entry in contributed:
        try:
            add_command = entry.load()
        except ImportError as error:
            add_unavailable_command(commands, entry.name, error)
        else:
            add_command(commands)
    return len(contributed)


def add_unavailable_command(commands: argparse._SubParsersAction, name: str,
                            error: ImportError) -> None:
    """A placeholder for a contributed command whose package does not import."""
    reason = (f"`flipgate {name}` needs flipgate's server packages, which cannot be imported "
              f"here ({error}); install flipgate with its server dependencies")

    def refuse(_args: argparse.Namespace) -> int:
        raise InputError("server_not_installed", reason)

    # no option prefix: whatever follows the name, --help included, reaches `refuse`
    unavailable = commands.add_parser(name, help="(not available: server packages missing)",
                                      add_help=False, prefix_chars="\0")
    unavailable.add_argument("ignored", nargs="*")
    unavailable.set_defaults(run=refuse)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return args.run(args)
    except InputError as error:
        if getattr(args, "json", False):  # the one JSON object a --json caller parses
            print(json.dumps({"error": {"code": error.code, "message": error.message}}))
        print(f"flipgate {args.command}: error: {error.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
