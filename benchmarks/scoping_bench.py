"""What binding a session to a project costs a look-up (issues 35 and 47), on a SQLite and a
PostgreSQL store (127.0.0.1:5432, database `test`, a schema of its own, dropped afterwards)
of many projects that hold the same line names, each line with a few versions:

- a line by name, through a session bound with service.projects.scoping (the filter added
  by with_loader_criteria) against the same statement with `project_id = :p` written by
  hand (what a per-route check would cost);
- a version by its id, through a bound session, which filters versions by their own
  project_id (0019), against an unbound session (the query every look-up ran before 0019,
  when nothing filtered versions), the same statement with `project_id = :p` written by
  hand, and the look-up filtered through the version's line (`EXISTS`, the first attempt of
  issue 47).

    python benchmarks/scoping_bench.py [--projects 20] [--lines 50] [--lookups 2000]

Each kind's look-ups are interleaved (benchmarks/serving.py `interleaved`); printed per
backend: the median microseconds of each and their ratio to the baseline, against the goal
bound <= 1.10x.
"""

import argparse
import itertools
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session, sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving import interleaved

from service.config import Settings
from service.db import create_db_engine, create_session_factory, session_scope
from service.migrate import upgrade
from service.projects.scoping import scope_session
from service.projects.service import create_project
from service.registry.models import ModelLine, ModelVersion
from service.registry.service import get_line
from tests.service.conftest import postgres_schema  # the suite's: a schema of its own

GOAL = 1.10
VERSIONS = 4  # of each line


def fill(sessions: sessionmaker[Session], projects: int, lines: int) -> list[int]:
    """`projects` projects of `lines` lines of VERSIONS versions each, every project with the
    same line names; their ids."""
    ids = []
    with session_scope(sessions) as session:
        for number in range(projects):
            project = create_project(session=session, name=f"team-{number}")
            for line_number in range(lines):
                line = ModelLine(name=f"line-{line_number}", num_classes=10,
                                 project_id=project.id)
                session.add_all(ModelVersion(line=line, version=str(version), num_classes=10)
                                for version in range(VERSIONS))
            ids.append(project.id)
    return ids


def line_by_hand(session: Session, name: str, project_id: int) -> ModelLine:
    return session.scalars(select(ModelLine).where(ModelLine.project_id == project_id,
                                                   ModelLine.name == name)).one()


def version_where(session: Session, version_id: int, *criteria: Any) -> ModelVersion:
    """The version with this id that meets `criteria` (and the session's filter, if bound)."""
    return session.scalars(select(ModelVersion).where(ModelVersion.id == version_id,
                                                      *criteria)).one()


def through_its_line(project_id: int) -> Any:
    """A version's line is of the project (EXISTS), the first attempt of issue 47."""
    return exists().where(ModelLine.id == ModelVersion.line_id,
                          ModelLine.project_id == project_id)


def lookups(bound: Session, unbound: Session, project_id: int, lines: int
            ) -> dict[str, dict[str, Callable[[], object]]]:
    """Per comparison, its look-ups by label, the baseline first (`bound`: a session bound
    to `project_id`)."""
    names = itertools.cycle([f"line-{number}" for number in range(lines)])
    version_ids = list(unbound.scalars(select(ModelVersion.id)
                                       .where(ModelVersion.project_id == project_id)))
    ids = itertools.cycle(version_ids)
    return {
        "a line by name": {
            "project_id by hand": lambda: line_by_hand(unbound, next(names), project_id),
            "bound session": lambda: get_line(session=bound, name=next(names))},
        "a version by id": {
            "unbound (before 0019)": lambda: version_where(unbound, next(ids)),
            "bound session (0019)": lambda: version_where(bound, next(ids)),
            "project_id by hand": lambda: version_where(
                unbound, next(ids), ModelVersion.project_id == project_id),
            "EXISTS through the line": lambda: version_where(
                unbound, next(ids), through_its_line(project_id))},
    }


def report(backend: str, url: str, folder: Path, args: argparse.Namespace) -> bool:
    """Fill a store of `backend`, time each comparison and print it; whether every bound
    look-up is within the goal."""
    settings = Settings(data_dir=folder / backend, database_url=url)
    upgrade(settings)
    engine = create_db_engine(settings)
    sessions = create_session_factory(engine, writes=False)
    project_ids = fill(create_session_factory(engine), args.projects, args.lines)
    project_id, within = project_ids[len(project_ids) // 2], True
    with sessions() as bound, sessions() as unbound:
        for kind, calls in lookups(scope_session(bound, project_id), unbound, project_id,
                                   args.lines).items():
            within &= print_times(f"{backend} {kind}", interleaved(calls, args.lookups))
    engine.dispose()
    return within


def print_times(title: str, times: dict[str, list[float]]) -> bool:
    """Print each look-up's median and its ratio to the first's; whether the bound session's
    is within the goal."""
    medians = {label: statistics.median(each) for label, each in times.items()}
    baseline = next(iter(medians.values()))
    print(f"{title}:")
    for label, median in medians.items():
        print(f"  {label:<25} {median * 1e6:8.1f} us  {median / baseline:6.3f}x")
    bound = next(median for label, median in medians.items() if label.startswith("bound"))
    return bound / baseline <= GOAL


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--projects", type=int, default=20)
    parser.add_argument("--lines", type=int, default=50)
    parser.add_argument("--lookups", type=int, default=2000)
    args = parser.parse_args()
    print(f"{args.projects} projects x {args.lines} lines x {VERSIONS} versions, "
          f"{args.lookups} look-ups of each kind, interleaved (median; goal bound <= {GOAL:.2f}x)")
    with tempfile.TemporaryDirectory() as folder, postgres_schema() as postgres_url:
        within = all([report(backend, url, Path(folder), args) for backend, url in
                      (("sqlite", ""), ("postgresql", postgres_url))])
    print("within the goal" if within else "OVER the goal")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
