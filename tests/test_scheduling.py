"""The suite's file order on pytest-xdist's workers (tests/scheduling.py): longest first."""

import json
from dataclasses import dataclass

import pytest

from tests import scheduling


@dataclass
class Item:
    """What the ordering reads of a pytest item: its node id and whether it is marked slow."""

    nodeid: str
    slow: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """tests/durations.json replaced by a file of the test's own."""
    path = tmp_path / "durations.json"
    monkeypatch.setattr(scheduling, "DURATIONS", path)
    return path


def test_files_run_longest_first_and_keep_their_tests_order(recorded):
    recorded.write_text(json.dumps({"tests/a.py": 2.0, "tests/b.py": 40.0, "tests/c.py": 9.0}))
    items = [Item("tests/a.py::one"), Item("tests/a.py::two"), Item("tests/b.py::one"),
             Item("tests/c.py::one"), Item("tests/b.py::two"), Item("tests/new.py::one")]
    scheduling.longest_files_first(items)
    assert [item.nodeid for item in items] == [
        "tests/b.py::one", "tests/b.py::two", "tests/c.py::one", "tests/a.py::one",
        "tests/a.py::two", "tests/new.py::one"]


def test_a_file_never_timed_counts_as_long_when_it_has_a_slow_test(recorded):
    recorded.write_text(json.dumps({"tests/a.py": 20.0}))
    items = [Item("tests/a.py::one"), Item("tests/quick.py::one"),
             Item("tests/new.py::one"), Item("tests/new.py::two", slow=True)]
    assert scheduling.estimated_seconds(items) == {
        "tests/a.py": 20.0, "tests/quick.py": scheduling.PER_TEST_SECONDS,
        "tests/new.py": scheduling.UNKNOWN_SLOW_SECONDS}
    scheduling.longest_files_first(items)
    assert [item.nodeid.split("::")[0] for item in items] == [
        "tests/new.py", "tests/new.py", "tests/a.py", "tests/quick.py"]


def test_stored_durations_add_up_each_files_phases_and_keep_the_others(recorded):
    recorded.write_text(json.dumps({"tests/a.py": 5.0, "tests/old.py": 7.0}))
    recorder = scheduling.DurationRecorder()
    for nodeid, duration in (("tests/a.py::one", 1.25), ("tests/a.py::one", 0.5),
                             ("tests/a.py::two", 2.0), ("tests/b.py::one", 0.25)):
        recorder.pytest_runtest_logreport(pytest.TestReport(
            nodeid, ("tests/a.py", 0, nodeid), {}, "passed", None, "call", duration=duration))
    recorder.pytest_sessionfinish()
    assert json.loads(recorded.read_text()) == {"tests/a.py": 3.8, "tests/b.py": 0.2,
                                                "tests/old.py": 7.0}
