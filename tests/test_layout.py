"""Dependencies point one way, flipgate <- service <- worker (docs/architecture.md): the
library's CLI reaches the server's subcommands through entry points, never by importing them."""

import ast
import re
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

from flipgate.commands import COMMAND_GROUP
from tests.conftest import linear_onnx

ROOT = Path(__file__).resolve().parent.parent
SERVER_MODULES = ("fastapi", "sqlalchemy", "celery", "service", "worker")


def imported_modules(package: str) -> dict[str, set[str]]:
    """file -> every module an import statement names in it (top level or nested)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def importing(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """The files of `package` that import one of `forbidden` (or a module inside one)."""
    return {path: sorted(name for name in names if name.split(".")[0] in forbidden)
            for path, names in imported_modules(package).items()
            if any(name.split(".")[0] in forbidden for name in names)}


def test_the_library_imports_neither_the_server_nor_the_worker():
    assert importing("flipgate", ("service", "worker")) == {}


def test_the_server_does_not_import_the_worker():
    assert importing("service", ("worker",)) == {}


def test_the_package_graph_keeps_its_contracts():
    """import-linter's contracts (pyproject.toml, [tool.importlinter]): flipgate <- service <-
    worker, and inside service the entry points, the HTTP layer, the flows, the domains in
    their order and the helpers; a failure names each import that points up a layer."""
    result = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command as main; main()",
         "--no-cache", "--no-logo"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


DOMAINS = tuple(sorted(f"service.{path.name}" for path in (ROOT / "service").iterdir()
                      if (path / "__init__.py").exists()))


@pytest.mark.parametrize("module", ["service/celery_app.py", "service/outbox.py"])
def test_the_task_infrastructure_imports_no_domain(module):
    """The broker's configuration and the after-commit sender know no domain: the domains
    call them (job kinds name their tasks in service.jobs.models)."""
    assert "service.jobs" in DOMAINS
    names = imported_modules("service")[module]
    assert sorted(name for name in names if name.startswith(DOMAINS)) == []


def test_the_artifact_store_is_used_through_its_interface():
    """Outside service/storage/, the server and the worker import the package
    service.storage (the interface and open_store), never a back-end or its helpers."""
    reaching_in = {path: sorted(name for name in names if name.startswith("service.storage."))
                   for package in ("service", "worker")
                   for path, names in imported_modules(package).items()
                   if not path.startswith("service/storage/")}
    assert {path: names for path, names in reaching_in.items() if names} == {}


def test_only_entry_points_read_the_settings():
    """Service code and tasks take Settings as an argument (the worker's from its context)."""
    entry_points_ = {"service/main.py", "service/cli.py", "service/config.py",
                     "worker/cli.py", "worker/runtime.py", "worker/sweeper.py",
                     "worker/celeryconfig.py"}
    readers = {str(path.relative_to(ROOT)) for package in ("service", "worker")
               for path in (ROOT / package).rglob("*.py")
               if "get_settings()" in path.read_text(encoding="utf-8")}
    assert readers - entry_points_ == set()


GATE_RULES = {("service.gate.decisions", "gate"), ("service.gate.decisions", "gate_request"),
              ("service.gate.schemas", "GateRequest"), ("service.gate.rules", "check"),
              ("service.jobs.service", "list_shards"), ("service.jobs.enqueue", "create_job")}


def imported_names(package: str) -> dict[str, set[tuple[str, str]]]:
    """file -> every (module, name) a `from module import name` statement names in it."""
    return {str(path.relative_to(ROOT)): {
        (node.module, alias.name) for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.ImportFrom) for alias in node.names}
        for path in sorted((ROOT / package).rglob("*.py"))}


def test_the_worker_holds_no_gate_or_shard_rule():
    """A task calls service functions with ids: what follows a repair's training is
    service.flows.repair_trained, a connector's gating the MLflow integration's, a shard's
    merge service.jobs; no task builds a gate request, checks a policy or creates jobs."""
    assert {path: sorted(names & GATE_RULES)
            for path, names in imported_names("worker").items() if names & GATE_RULES} == {}


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


SERVER_STACK = ("fastapi", "uvicorn", "sqlalchemy", "celery")
LIBRARY_COMMANDS = {"compare", "train", "experiment", "demo", "gate", "repair", "policy",
                    "mlflow", "upload", "traffic"}


def modules_loaded_by(argv: list[str], watched: tuple[str, ...]) -> list[str]:
    """Run `flipgate ARGV` in a fresh interpreter; the watched top-level modules it imported."""
    result = run_python(f"""
        import sys
        from flipgate.cli import main
        try:
            main({argv!r})
        except SystemExit as exit_:
            assert exit_.code == 0, exit_.code
        loaded = {{name.split(".")[0] for name in sys.modules}}
        print(sorted(loaded & set({watched!r})))
    """)
    assert result.returncode == 0, result.stderr
    assert "usage: flipgate" in result.stdout
    return ast.literal_eval(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", ["compare", "gate", "policy", "repair"])
def test_library_command_help_loads_neither_torch_nor_the_server(command):
    """Nor scipy, nor httpx, which only a call to a server needs (60 ms to import)."""
    assert modules_loaded_by([command, "--help"], ("torch", "scipy", "httpx", *SERVER_STACK,
                                                   "service", "worker")) == []


def test_the_top_level_help_loads_neither_torch_nor_the_server_stack():
    assert modules_loaded_by(["--help"], ("torch", "scipy", "httpx", *SERVER_STACK)) == []


def test_the_server_and_the_worker_start_without_torch():
    """torch (over a second to import) loads with the first repair request or retraining job,
    not with every `flipgate serve` and `flipgate worker`."""
    result = run_python("""
        import sys
        import service.main
        from worker.app import TASK_MODULES
        for module in TASK_MODULES:
            __import__(module)
        print("torch" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_the_server_starts_without_rich():
    """The gate's messages are formatted by flipgate.reporting.rows, which needs no rich (the
    terminal's tables); httpx, whose package loads rich for its own CLI, is imported where a
    callback or a sign-in calls out."""
    result = run_python("""
        import sys
        import service.main
        print("rich" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_without_an_otlp_endpoint_nothing_of_opentelemetry_is_imported(tmp_path):
    """Traces are opt-in: an app that serves a request and scrapes its metrics, and the
    worker's tasks, import none of flipgate's tracing, OpenTelemetry's exporters or
    instrumentations unless OTEL_EXPORTER_OTLP_ENDPOINT is set (service.observability.tracing
    is the one module that imports them). OpenTelemetry's API and SDK may load without it
    where they are installed (here with mlflow): FastAPI 0.165 imports the API for its native
    telemetry, and redis-py 8 the SDK for its own."""
    result = run_python(f"""
        import os, sys
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        from fastapi.testclient import TestClient
        from service.config import Settings
        from service.main import create_app
        from service.migrate import upgrade
        from worker.app import TASK_MODULES
        for module in TASK_MODULES:
            __import__(module)
        TRACING = ("opentelemetry.instrumentation", "opentelemetry.exporter",
                   "service.observability.tracing")
        settings = Settings(database_url="sqlite:///{tmp_path}/db.sqlite",
                            data_dir="{tmp_path}/data", admin_token="layout-token-0123456789")
        upgrade(settings)
        with TestClient(create_app(settings)) as client:
            answer = client.get("/metrics", headers={{"Authorization":
                                                      "Bearer layout-token-0123456789"}})
            assert answer.status_code == 200, answer.text
        print(sorted(name for name in sys.modules if name.startswith(TRACING)))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    importers = {path for path, names in imported_modules("service").items()
                 if any(name.startswith("opentelemetry") for name in names)}
    assert importers == {"service/observability/tracing.py"}


def test_a_pair_report_with_its_statistics_loads_no_scipy():
    """Its Wilson intervals and McNemar p come from the standard library: scipy would add
    about 0.13 s to every `flipgate compare`."""
    result = run_python("""
        import sys
        import numpy as np
        from flipgate.metrics import compare_logits
        rng = np.random.default_rng(0)
        report = compare_logits(rng.normal(size=(60, 3)), rng.normal(size=(60, 3)),
                                rng.integers(0, 3, 60))
        assert 0 < report["mcnemar_p"] <= 1 and report["nfr_ci"][0] <= report["nfr"], report
        print("scipy" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def listed_commands(help_text: str) -> set[str]:
    """The subcommands argparse lists in braces on the usage line."""
    return set(re.search(r"\{([a-z,-]+)\}", help_text).group(1).split(","))


def test_the_server_commands_come_from_entry_points():
    result = subprocess.run([sys.executable, "-m", "flipgate.cli", "--help"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    contributed = {entry.name for entry in entry_points(group=COMMAND_GROUP)}
    assert {"serve", "worker", "migrate", "token", "store"} <= contributed
    assert listed_commands(result.stdout) == LIBRARY_COMMANDS | contributed


BLOCK_SERVER_PACKAGES = """
    import importlib.abc
    import sys

    class WithoutServer(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("service", "worker"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, WithoutServer())
    from flipgate.cli import main
"""


@pytest.mark.slow
def test_without_the_server_packages_the_server_commands_say_so():
    result = run_python(BLOCK_SERVER_PACKAGES + """
    sys.exit(main(["serve", "--port", "8001"]))
    """)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("flipgate serve: error: `flipgate serve` needs flipgate's "
                                    "server packages")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_without_the_server_packages_the_library_commands_still_work(tmp_path):
    result = run_python(BLOCK_SERVER_PACKAGES + """
    try:
        main(["compare", "--help"])
    except SystemExit as exit_:
        sys.exit(exit_.code)
    """)
    assert result.returncode == 0, result.stderr
    assert "usage: flipgate compare" in result.stdout


def test_a_library_command_loads_no_other_commands_modules():
    """`flipgate compare` imports neither training's options nor the clients of a server nor
    the repairs (15 ms); `flipgate --help` still lists every command (tested above)."""
    others = ("flipgate.train.methods", "flipgate.mlflow_gate", "flipgate.policy_client",
              "flipgate.upload_client", "flipgate.repair")
    result = run_python(f"""
        import sys
        from flipgate.cli import main
        try:
            main(["compare", "--help"])
        except SystemExit:
            pass
        print(sorted(set(sys.modules) & set({others!r})))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_compare_of_logits_loads_no_onnx(tmp_path):
    """The onnx package (45 ms to import) is loaded to read an ONNX model: neither .npy
    logits nor the pair report's kernel (whose graph flipgate.onnx_bytes writes) need it."""
    rng = np.random.default_rng(0)
    for name in ("old", "new"):
        np.save(tmp_path / f"{name}.npy", rng.normal(size=(30, 3)).astype(np.float32))
    np.savez(tmp_path / "eval.npz", x=np.zeros((30, 1), np.float32), y=np.arange(30) % 3)
    result = run_python(f"""
        import sys
        from flipgate.cli import main
        main(["compare", {str(tmp_path / "old.npy")!r}, {str(tmp_path / "new.npy")!r},
              "--evalset", {str(tmp_path / "eval.npz")!r}, "--json"])
        print("onnx" in {{name.split(".")[0] for name in sys.modules}})
    """)
    assert result.returncode == 0, result.stderr
    assert '"nfr"' in result.stdout and result.stdout.strip().endswith("False")


def compare_loading(tmp_path: Path, flags: list[str]) -> tuple[str, list[str]]:
    """Run `flipgate compare` on two small ONNX models with `flags`: its stdout and which of
    matplotlib and rich it imported."""
    rng = np.random.default_rng(0)
    models = [linear_onnx(tmp_path / f"{name}.onnx", rng.normal(size=(4, 3)), np.zeros(3),
                          ("N", 4)) for name in ("old", "new")]
    np.savez(tmp_path / "eval.npz", x=rng.normal(size=(20, 4)).astype(np.float32),
             y=np.arange(20) % 3)
    result = run_python(f"""
        import sys
        from flipgate.cli import main
        main(["compare", {str(models[0])!r}, {str(models[1])!r}, "--evalset",
              {str(tmp_path / "eval.npz")!r}, *{flags!r}])
        print(sorted({{"matplotlib", "rich"}} & {{name.split(".")[0] for name in sys.modules}}))
    """)
    assert result.returncode == 0, result.stderr
    *output, loaded = result.stdout.strip().splitlines()
    return "\n".join(output), ast.literal_eval(loaded)


def test_a_compare_without_html_loads_no_rich(tmp_path):
    """rich (20 ms to import) is loaded only for the terminal's report and its progress bars,
    not for --json."""
    output, loaded = compare_loading(tmp_path, ["--json"])
    assert '"nfr"' in output and loaded == []


def test_an_html_report_loads_no_matplotlib(tmp_path):
    """The HTML report draws its four plots as SVG itself: `compare --html` does not import
    matplotlib (0.4 s) at all, nor rich (the page's rows are flipgate.reporting.rows)."""
    output, loaded = compare_loading(tmp_path, ["--json", "--html", str(tmp_path / "r.html")])
    assert '"nfr"' in output and loaded == []
    assert (tmp_path / "r.html").read_text().count("<svg") == 4


def test_only_the_experiment_figure_imports_matplotlib():
    """matplotlib draws `flipgate experiment`'s reproduction.svg and nothing else: the pair
    report (which every API server and worker imports) has its own SVG charts."""
    found = {package: importing(package, ("matplotlib",))
             for package in ("flipgate", "service", "worker")}
    assert found == {"flipgate": {"flipgate/reporting/experiment.py": ["matplotlib",
                                                                       "matplotlib.pyplot"]},
                     "service": {}, "worker": {}}
