"""The worker's sweeper supervision (worker.sweeper.SupervisedSweeper) on real processes: a
sweeper that keeps dying is restarted after a growing pause, and `stop` ends the one that
runs without starting another. tests/faults/test_worker_faults.py kills a real worker's."""

import itertools
import os
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import alive, wait_for
from worker.sweeper import FIRST_RESTART_SECONDS, SupervisedSweeper

pytestmark = pytest.mark.slow


class Starts:
    """Starts `python -c CODE` and remembers when and what it started."""

    def __init__(self, code: str) -> None:
        self.code, self.times, self.processes = code, [], []

    def __call__(self) -> subprocess.Popen:
        self.times.append(time.monotonic())
        self.processes.append(subprocess.Popen([sys.executable, "-c", self.code]))
        return self.processes[-1]


def test_a_sweeper_that_dies_at_once_is_restarted_after_growing_pauses():
    starts = Starts("pass")
    supervised = SupervisedSweeper(starts)
    time.sleep(4.5 * FIRST_RESTART_SECONDS)  # pauses of 1, 2, then 4: three starts by now
    supervised.stop()
    pauses = [later - earlier for earlier, later in itertools.pairwise(starts.times)]
    assert len(starts.times) == 3, pauses
    assert pauses[0] >= FIRST_RESTART_SECONDS and pauses[1] >= 2 * FIRST_RESTART_SECONDS


def test_stop_ends_the_running_sweeper_and_starts_no_other():
    starts = Starts("import time; time.sleep(60)")
    supervised = SupervisedSweeper(starts)
    supervised.stop()
    time.sleep(2 * FIRST_RESTART_SECONDS)
    assert len(starts.processes) == 1
    assert starts.processes[0].poll() is not None


def test_a_sweeper_whose_starter_ended_before_it_looked_stops_by_itself(tmp_path):
    """The starter ends at once, so its sweeper is an orphan before its first look at its
    parent: it must end anyway, not sweep for ever."""
    starter = subprocess.Popen(
        [sys.executable, "-c", "from worker.sweeper import start_sweeper; "
                               "print(start_sweeper().pid, flush=True)"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "FLIPGATE_DATA_DIR": str(tmp_path), "FLIPGATE_SWEEP_SECONDS": "0.2"})
    sweeper = int(starter.stdout.readline())
    starter.wait(30)
    starter.stdout.close()
    wait_for(lambda: not alive(sweeper), "the orphaned sweeper's end", timeout=30)
