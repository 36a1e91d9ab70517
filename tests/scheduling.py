"""The order the suite's files run in on pytest-xdist's workers: longest first.

pytest-xdist (`--dist loadfile --no-loadscope-reorder`, as scripts/dev.py runs it) hands each
idle worker the next file in collection order. Sorted by how long each file took last time
(tests/durations.json), the long files start early and the short ones fill the end, so the
workers finish close together: the greedy longest-first schedule. A file with no recorded
time counts as UNKNOWN_SLOW_SECONDS when it has a `slow` test, else PER_TEST_SECONDS a test.
`pytest --store-durations` records the seconds of the files it ran.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_SLOW_SECONDS, PER_TEST_SECONDS = 30.0, 0.1


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def recorded_seconds() -> dict[str, float]:
    return json.loads(DURATIONS.read_text(encoding="utf-8")) if DURATIONS.exists() else {}


def estimated_seconds(items: list[pytest.Item]) -> dict[str, float]:
    """Each collected file's expected seconds: recorded, or estimated from its tests."""
    recorded, tests, slow = recorded_seconds(), Counter(), set()
    for item in items:
        tests[file_of(item.nodeid)] += 1
        if item.get_closest_marker("slow"):
            slow.add(file_of(item.nodeid))
    return {name: recorded.get(name, UNKNOWN_SLOW_SECONDS if name in slow
                               else PER_TEST_SECONDS * count) for name, count in tests.items()}


def longest_files_first(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: files by expected seconds, longest first; each file's tests
    keep their order."""
    seconds = estimated_seconds(items)
    items.sort(key=lambda item: -seconds[file_of(item.nodeid)])  # a stable sort


class DurationRecorder:
    """Adds up each file's set-up, call and tear-down seconds from the test reports, and
    writes them into tests/durations.json at the end (files not run keep their time)."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        merged = recorded_seconds() | {name: round(value, 1)
                                       for name, value in self.seconds.items()}
        DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n",
                             encoding="utf-8")
