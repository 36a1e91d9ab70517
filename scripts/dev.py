#!/usr/bin/env python3
"""Set up the project's virtual environment when needed, then run the demo or the tests.

    python3 scripts/dev.py demo [ARGS]   # end-to-end demo on real MNIST digits
    python3 scripts/dev.py test [ARGS]   # the whole test suite (ARGS go to pytest); installs
                                         # Debian's chromium and promtool for the tests
    python3 scripts/dev.py test -m "not slow"   # the fast loop: the tests under 5 s each

Needs nothing but Python 3.11+. The environment lives in .venv at the repository root and is
rebuilt only when pyproject.toml changes. torch is installed first, pinned, so that pip takes
the CPU build already on the machine instead of downloading CUDA packages.
"""

import hashlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".flipgate-install"
TORCH = "torch==2.13.0"

# Services the tests use for real, and how this machine starts them when they are down.
SERVICES = {
    "PostgreSQL": (5432, "pg_ctlcluster --skip-systemctl-redirect "
                         "$(ls /etc/postgresql) main start"),
    "Redis": (6379, "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' "
                    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log"),
}


def fingerprint() -> str:
    """What the installed environment was built from."""
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + TORCH.encode()).hexdigest()


def ensure_venv() -> None:
    """Create .venv and install flipgate with its dev extras unless that is already done."""
    if not (BIN / "python").exists():
        print("creating .venv", flush=True)
        venv.create(VENV, with_pip=True)
    if STAMP.exists() and STAMP.read_text() == fingerprint():
        return
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(fingerprint())


def reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def ensure_services() -> None:
    """Start PostgreSQL and Redis when they are down; under CI=true fail when they stay down."""
    for name, (port, start) in SERVICES.items():
        if reachable(port):
            continue
        if shutil.which(start.split()[0]):
            print(f"starting {name}", flush=True)
            subprocess.run(start, shell=True, check=False)
            deadline = time.monotonic() + 30
            while not reachable(port) and time.monotonic() < deadline:
                time.sleep(0.5)
        if reachable(port):
            continue
        message = f"{name} is not reachable on 127.0.0.1:{port} and could not be started"
        if os.environ.get("CI") == "true":
            sys.exit(f"error: {message}; CI needs it")
        print(f"warning: {message}; tests that need it will fail", file=sys.stderr)


# Debian's packages some tests drive: {command: (apt-get install's arguments, what needs it)}
DEBIAN_TOOLS = {
    "chromium": ("chromium", "the dashboard's browser tests"),
    # promtool alone: the server's recommended exporters are not needed
    "promtool": ("--no-install-recommends prometheus",
                 "the checks of deploy/prometheus (tests/test_deploy.py)"),
}


def ensure_debian_tool(command: str) -> None:
    """Install the Debian package of `command` when it is missing; under CI=true fail when
    that fails."""
    if shutil.which(command):
        return
    package, needed_by = DEBIAN_TOOLS[command]
    install = f"apt-get update -qq && apt-get install -y -qq {package}"
    if shutil.which("apt-get") and os.geteuid() == 0:
        print(f"installing {command} for {needed_by}", flush=True)
        subprocess.run(install, shell=True, check=False)
    if shutil.which(command):
        return
    message = f"{command} is not installed and could not be installed ({install})"
    if os.environ.get("CI") == "true":
        sys.exit(f"error: {message}; CI needs it")
    print(f"warning: {message}; {needed_by} will be skipped", file=sys.stderr)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        print(__doc__, file=sys.stderr)
        return 2
    ensure_venv()
    command, args = sys.argv[1], sys.argv[2:]
    os.chdir(ROOT)
    if command == "demo":
        return subprocess.call([str(BIN / "flipgate"), "demo", *args])
    ensure_services()
    for command in DEBIAN_TOOLS:
        ensure_debian_tool(command)
    return run_tests(args)


# The whole suite runs in two pytest processes: first every test not marked `serial` on
# pytest-xdist's workers (a file's tests stay together, so each module's fixtures are built
# once), then the `serial` ones (load holds, timing bounds) alone on a quiet machine. One
# worker more than the cores: a worker waiting on the servers, browsers and workers its tests
# start leaves its core to another (docs/development.md has the measurement).
PYTEST = [str(BIN / "python"), "-m", "pytest"]
WORKER_COUNT = min((os.cpu_count() or 1) + 1, 5)
WORKERS = ["-n", str(WORKER_COUNT), "--dist", "loadfile", "--no-loadscope-reorder"]
NO_TESTS_COLLECTED = 5  # pytest's exit code when a marker selects nothing
# The parallel run's processes compute on one thread each (unless OMP_NUM_THREADS is set):
# the workers are the parallelism, and torch's or OpenBLAS's threads in every worker and in
# the servers it starts would oversubscribe the cores, spinning while they wait for each other.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def run_tests(args: list[str]) -> int:
    """pytest with `args`. None: the whole suite, in its parallel and serial parts. `-m EXPR`
    (with other options, no -n): the same two parts, on the tests EXPR selects. Anything else:
    one pytest process with exactly `args`."""
    env = caching_bytecode(os.environ)
    if not args:
        return run_in_two_parts("", [], env)
    if "-m" in args and "-n" not in args:
        at = args.index("-m")
        return run_in_two_parts(args[at + 1], args[:at] + args[at + 2:], env)
    return subprocess.call([*PYTEST, *args], env=env)


def run_in_two_parts(marker: str, args: list[str], env: dict[str, str]) -> int:
    """The tests `marker` selects (all for ""): those not marked `serial` on pytest-xdist's
    workers, then the `serial` ones in one process. The parallel run lists the serial tests
    it left out, so the serial run collects only their files."""
    selected = f" and ({marker})" if marker else ""
    args = with_one_seed(args)
    with tempfile.TemporaryDirectory() as folder:
        listed = Path(folder) / "serial-tests.txt"
        parallel = subprocess.call(
            [*PYTEST, *WORKERS, "-m", f"not serial{selected}", *args],
            env={**ONE_THREAD, **env, "FLIPGATE_SERIAL_TESTS": str(listed)})
        serial_ids = listed.read_text(encoding="utf-8").split() if listed.exists() else []
        serial = subprocess.call([*PYTEST, "-m", f"serial{selected}", *args, *serial_ids],
                                 env=env)
    return parallel or (0 if serial == NO_TESTS_COLLECTED else serial)


def with_one_seed(args: list[str]) -> list[str]:
    """`args` with one pytest-randomly seed for both parts (a new one unless given), printed
    so that a failure of one order can be run again in that order."""
    if "no:randomly" in args or any(arg.startswith("--randomly-seed") for arg in args):
        return args
    seed = random.randrange(2**32)
    print(f"tests in a random order: rerun this one with --randomly-seed={seed}", flush=True)
    return [*args, f"--randomly-seed={seed}"]


def caching_bytecode(environment: Mapping[str, str]) -> dict[str, str]:
    """The environment without PYTHONDONTWRITEBYTECODE: the tests start hundreds of Python
    processes (servers, workers, CLI runs), and where that is set each one compiles the
    package again; the caches go to __pycache__ folders, which git ignores."""
    return {name: value for name, value in environment.items()
            if name != "PYTHONDONTWRITEBYTECODE"}


if __name__ == "__main__":
    sys.exit(main())
