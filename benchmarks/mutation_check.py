"""Mutation check of the gate's rules and the metrics core (not part of CI: it takes long).

    python benchmarks/mutation_check.py [--target rules|flips|all] [--max-children N]

Copies the repository's tracked files to a scratch folder, configures mutmut there (so
nothing in the checkout changes), mutates service/gate/rules.py and/or
flipgate/metrics/flips.py, runs the tests that guard each (the gate's API tests on SQLite,
the metrics tests) against every mutant, and prints the mutants that survived: each is a
change to the code that no test noticed. Kill the ones that matter with a test.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {
    "rules": ("service/gate/rules.py",
              ["tests/service/api/test_gate_api.py", "tests/service/api/test_gate_rules.py",
               "tests/service/api/test_policies_api.py", "-k", "sqlite"]),
    "flips": ("flipgate/metrics/flips.py", ["tests/metrics"]),
}


def scratch_copy(folder: Path) -> None:
    """The tracked files of the checkout (no .venv, no data) under `folder`."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                             capture_output=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, target)


def configure(folder: Path, path: str, tests: list[str]) -> None:
    """mutmut's settings in the scratch copy: what to mutate and which tests to run."""
    selection = "\n    ".join([*tests, "-p", "no:cacheprovider", "-x", "-q"])
    (folder / "setup.cfg").write_text(
        f"[mutmut]\nonly_mutate = {path}\nsource_paths =\n    flipgate\n    service\n"
        f"    worker\nalso_copy =\n    tests\n    migrations\n    benchmarks\n    alembic.ini\n"
        f"pytest_add_cli_args_test_selection =\n    {selection}\n", encoding="utf-8")


def survivors(folder: Path) -> list[str]:
    """The lines of `mutmut results` naming mutants that survived."""
    listed = subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=folder,
                            capture_output=True, text=True, check=False).stdout
    return [line.strip() for line in listed.splitlines() if "survived" in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=[*TARGETS, "all"], default="all")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    chosen = list(TARGETS) if args.target == "all" else [args.target]
    for name in chosen:
        path, tests = TARGETS[name]
        with tempfile.TemporaryDirectory(prefix=f"mutation-{name}-") as scratch:
            folder = Path(scratch)
            scratch_copy(folder)
            configure(folder, path, tests)
            started = time.monotonic()
            print(f"mutating {path} (tests: {' '.join(tests)})", flush=True)
            subprocess.run([sys.executable, "-m", "mutmut", "run",
                            "--max-children", str(args.max_children)], cwd=folder, check=False)
            left = survivors(folder)
            print(f"\n{path}: {len(left)} surviving mutants after "
                  f"{time.monotonic() - started:.0f} s")
            for line in left:
                shown = subprocess.run([sys.executable, "-m", "mutmut", "show",
                                        line.split(":")[0]], cwd=folder, capture_output=True,
                                       text=True, check=False).stdout
                print(f"--- {line}\n{shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
