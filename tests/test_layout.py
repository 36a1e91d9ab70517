"""Dependencies point one way, flipgate <- service <- worker (DESIGN §1): the library's CLI
reaches the server's subcommands through entry points, never by importing them."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


@pytest.mark.slow
def test_flipgate_compare_help_loads_no_server_module():
    result = run_python(f"""
        import sys
        from flipgate.cli import main
        try:
            main(["compare", "--help"])
        except SystemExit as exit_:
            assert exit_.code == 0, exit_.code
        loaded = {{name.split(".")[0] for name in sys.modules}}
        print(sorted(loaded & set({SERVER_MODULES!r})))
    """)
    assert result.returncode == 0, result.stderr
    assert "usage: flipgate compare" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_the_server_commands_come_from_entry_points():
    result = subprocess.run([sys.executable, "-m", "flipgate.cli", "--help"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    for command in ("compare", "gate", "serve", "worker", "migrate", "token"):
        assert command in result.stdout


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
