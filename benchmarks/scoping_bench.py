"""What binding a session to a project costs a look-up (issue 35): the same look-ups of
lines by name and the list of a project's lines, on a SQLite store of many projects, through
a session bound with service.projects.scoping (the filter added by with_loader_criteria)
against the same statements with `project_id = :p` written by hand (the baseline: what a
per-route check would cost), interleaved in one run.

    python benchmarks/scoping_bench.py [--projects 20] [--lines 50] [--rounds 5]

Printed: the microseconds of each kind of look-up, bound and by hand, and their ratio
against the goal bound <= 1.10x by hand.
"""

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.config import Settings
from service.db import create_db_engine, create_session_factory, session_scope
from service.migrate import upgrade
from service.projects.scoping import scope_session
from service.projects.service import create_project
from service.registry.models import ModelLine
from service.registry.service import get_line, list_lines

GOAL = 1.10
LOOKUPS = 2000  # per round and kind


def fill(sessions: Callable[[], Session], projects: int, lines: int) -> list[int]:
    """`projects` projects of `lines` lines each, every project with the same line names;
    their ids."""
    ids = []
    with session_scope(sessions) as session:
        for number in range(projects):
            project = create_project(session=session, name=f"team-{number}")
            session.add_all(ModelLine(name=f"line-{line}", num_classes=10, project_id=project.id)
                            for line in range(lines))
            ids.append(project.id)
    return ids


def bound_lookups(session: Session, names: list[str], project_id: int) -> None:
    scope_session(session, project_id)
    for name in names:
        get_line(session=session, name=name)
    list_lines(session=session)


def lookups_by_hand(session: Session, names: list[str], project_id: int) -> None:
    for name in names:
        session.scalars(select(ModelLine).where(ModelLine.project_id == project_id,
                                                ModelLine.name == name)).one()
    list(session.scalars(select(ModelLine).where(ModelLine.project_id == project_id)
                         .order_by(ModelLine.name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--projects", type=int, default=20)
    parser.add_argument("--lines", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(data_dir=Path(folder))
        upgrade(settings)
        engine = create_db_engine(settings)
        sessions = create_session_factory(engine)
        project_ids = fill(sessions, args.projects, args.lines)
        names = [f"line-{number % args.lines}" for number in range(LOOKUPS)]
        timings: dict[str, list[float]] = {"bound": [], "by hand": []}
        for round_number in range(args.rounds):
            project_id = project_ids[round_number % len(project_ids)]
            runs = [("bound", bound_lookups), ("by hand", lookups_by_hand)]
            for label, work in runs if round_number % 2 == 0 else runs[::-1]:
                with sessions() as session:
                    started = time.perf_counter()
                    work(session, names, project_id)
                    timings[label].append((time.perf_counter() - started) / (LOOKUPS + 1))
        engine.dispose()
    bound, by_hand = (statistics.median(timings[label]) for label in ("bound", "by hand"))
    print(f"{args.projects} projects x {args.lines} lines, {LOOKUPS} look-ups by name and one "
          f"list a round, {args.rounds} rounds (median)")
    print(f"bound session (with_loader_criteria): {bound * 1e6:8.1f} us a look-up")
    print(f"project_id written by hand:           {by_hand * 1e6:8.1f} us a look-up")
    print(f"ratio bound / by hand: {bound / by_hand:.3f}x (goal <= {GOAL:.2f}x)")


if __name__ == "__main__":
    main()
