"""Shared fixtures: small ONNX graphs built by hand, and real MNIST models trained once."""

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from flipgate.cli import main
from flipgate.datasets import mnist_digits, save_evalset, split
from flipgate.export import export_onnx
from flipgate.formats.evalsets import EvalSet
from flipgate.train.config import TrainConfig
from flipgate.train.recipes import train
from tests.s3server import S3Server, s3_server, unique_prefix
from tests.scheduling import DurationRecorder, longest_files_first


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help="write each file's seconds into tests/durations.json, the order "
                          "pytest-xdist's workers take the files in (tests/scheduling.py)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "flipgate-durations")


# The suites that test the HTTP layer (answers, pages, parsers) run on PostgreSQL alone, the
# production store and the stricter dialect; their SQL runs on SQLite too in the store tests
# (tests/service/test_*.py) and in every test of the embedded server (e2e, CLI, demo). A module
# whose subject differs between the two (a dialect's own branch) is marked `both_backends`.
ONE_BACKEND_SUITES = ("tests/service/api/", "tests/ui/", "tests/fuzz/")
ONE_BACKEND = "postgresql"


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `database_url` with ONE_BACKEND alone in ONE_BACKEND_SUITES (a direct
    parametrization, which replaces the fixture's own params) unless the module chose."""
    definition = metafunc.definition
    chosen = any("database_url" in mark.args[0] for mark in definition.iter_markers("parametrize"))
    if "database_url" not in metafunc.fixturenames or chosen or \
            definition.get_closest_marker("both_backends"):
        return
    path = Path(definition.path).relative_to(Path(__file__).parent.parent).as_posix()
    if path.startswith(ONE_BACKEND_SUITES):
        definition.add_marker(
            pytest.mark.parametrize("database_url", [ONE_BACKEND], indirect=True, scope="session"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_files_first(items)


def pytest_deselected(items) -> None:
    """In scripts/dev.py's parallel run, the first worker writes the ids of the `serial`
    tests it leaves out to $FLIPGATE_SERIAL_TESTS (one per line), so that the serial run
    collects their files only."""
    listed = os.environ.get("FLIPGATE_SERIAL_TESTS")
    if not listed or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    serial = [item.nodeid for item in items if item.get_closest_marker("serial")]
    with Path(listed).open("a", encoding="utf-8") as out:
        out.writelines(f"{nodeid}\n" for nodeid in serial)


def linear_onnx(path: Path, weight: np.ndarray, bias: np.ndarray,
                input_shape: tuple[int | str, ...]) -> Path:
    """An ONNX classifier logits = flatten(x) @ weight + bias, written with onnx.helper."""
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["flat"], axis=1),
         helper.make_node("MatMul", ["flat", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["logits"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", weight.shape[1]])],
        [numpy_helper.from_array(weight.astype(np.float32), "w"),
         numpy_helper.from_array(bias.astype(np.float32), "b")],
    )
    return save_graph(graph, path)


def numpy_mlp(state: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The zoo's one-hidden-layer mlp (Flatten, Linear, ReLU, Linear) in plain numpy: its
    logits from its weights (a state dict, or the initializers of its ONNX export)."""
    hidden = np.maximum(x.reshape(len(x), -1) @ state["1.weight"].T + state["1.bias"], 0.0)
    return hidden @ state["3.weight"].T + state["3.bias"]


def save_graph(graph: onnx.GraphProto, path: Path) -> Path:
    """Save a graph as a model that the installed ONNX Runtime reads (opset 17, IR 10)."""
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), path)
    return path


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def run_cli(capsys):
    """Run `flipgate ARGS` in this process; returns the exit code and what it printed."""

    def run(*args: str | Path) -> CliResult:
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:
            code = exit_.code
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@dataclass(frozen=True)
class MnistPair:
    """Two real MNIST classifiers (torch and ONNX) and the eval set they are compared on."""

    old_torch: torch.nn.Module
    new_torch: torch.nn.Module
    old_onnx: Path
    new_onnx: Path
    evalset: EvalSet
    evalset_path: Path


@pytest.fixture(scope="session")
def mnist_pair(tmp_path_factory) -> MnistPair:
    folder = tmp_path_factory.mktemp("mnist")
    train_set, evalset = split(mnist_digits(), 2500, seed=0)
    old = train("baseline", "mlp:hidden=32", EvalSet(train_set.x[:800], train_set.y[:800]), 10,
                TrainConfig(epochs=4, seed=0)).module
    new = train("baseline", "mlp:hidden=128", train_set, 10, TrainConfig(epochs=4, seed=1)).module
    return MnistPair(old, new, export_onnx(old, (28, 28), folder / "old.onnx"),
                     export_onnx(new, (28, 28), folder / "new.onnx"), evalset,
                     save_evalset(evalset, folder / "eval.npz"))


@pytest.fixture(scope="session")
def toolchain_folder(tmp_path_factory) -> Path:
    """Where tests/toolchains.py's builders export their models and eval sets."""
    return tmp_path_factory.mktemp("toolchains")


@dataclass(frozen=True)
class TorchExportPair:
    """Two torch classifiers of scikit-learn's digits, each exported by torch.onnx.export's
    defaults (weights in model.onnx.data beside model.onnx), their logits on the eval set
    computed by torch itself, and the eval set."""

    old_onnx: Path
    new_onnx: Path
    old_logits: np.ndarray
    new_logits: np.ndarray
    evalset: EvalSet
    evalset_path: Path


def export_with_torch_defaults(model: torch.nn.Module, features: int, path: Path) -> Path:
    """torch.onnx.export with its defaults, as a user writes it; only the batch is dynamic."""
    path.parent.mkdir(parents=True)
    torch.onnx.export(model, (torch.zeros(2, features),), path, input_names=["x"],
                      output_names=["logits"], dynamic_shapes=({0: torch.export.Dim("batch")},))
    return path


@pytest.fixture(scope="session")
def torch_export_pair(tmp_path_factory) -> TorchExportPair:
    from sklearn.datasets import load_digits

    folder = tmp_path_factory.mktemp("torch_export")
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    evalset = EvalSet(x[1200:], y[1200:])
    models, logits = [], []
    for seed, hidden, samples in ((0, 8, 150), (1, 32, 1200)):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(hidden, 10))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(60):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x[:samples])),
                                                     torch.from_numpy(y[:samples]))
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            logits.append(model(torch.from_numpy(evalset.x)).numpy())
        models.append(export_with_torch_defaults(model, 64, folder / f"m{seed}" / "model.onnx"))
    return TorchExportPair(*models, *logits, evalset, save_evalset(evalset, folder / "eval.npz"))


@pytest.fixture(scope="session")
def s3(tmp_path_factory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS) shared by the tests of a session (of a pytest-xdist
    worker): each keeps its objects under its own prefix (`s3_prefix`). Tests that stop or
    freeze a server start their own with tests.s3server.s3_server."""
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def s3_prefix() -> str:
    """A key prefix in the shared bucket that no other test uses."""
    return unique_prefix()
