"""A session bound to one project sees only that project's rows.

`scope_session(session, project_id)` binds it: from then on every ORM statement it runs
(selects, lazy loads, ORM updates and deletes) gets `project_id = :project` on each
ProjectOwned table it touches (SQLAlchemy's with_loader_criteria, the documented recipe for
a global filter), and a ProjectOwned row it adds without a project gets the session's. A
request's session is bound by its access check (service.deps.require), a worker's to its
job's project; a session left unbound (the CLI, the sweeper, migrations) sees every row.
Lines and data sets are looked up by name and versions, jobs and decisions by id only
through such a session, so a name of another project answers exactly as a name of none,
and a row loaded by a raw id is filtered whatever route loads it.
"""

import functools
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, with_loader_criteria

from service.projects.models import ProjectOwned

PROJECT_KEY = "project_id"
CRITERIA_KEY = "project_criteria"  # the bound project's option (project_criteria)


def scope_session(session: Session, project_id: int) -> Session:
    """Bind `session` to the project `project_id` (see the module)."""
    session.info[PROJECT_KEY] = project_id
    session.info[CRITERIA_KEY] = project_criteria(project_id)
    return session


@functools.lru_cache(maxsize=1024)
def project_criteria(project_id: int) -> Any:
    """The option that filters every ProjectOwned table to the project `project_id`, built
    once per process and project (an immutable option, shared by its sessions)."""
    return with_loader_criteria(ProjectOwned, lambda cls: cls.project_id == project_id,
                                include_aliases=True)


def session_project(session: Session) -> int | None:
    """The project `session` is bound to, if any."""
    return session.info.get(PROJECT_KEY)


@event.listens_for(Session, "do_orm_execute")
def _only_the_project(state: ORMExecuteState) -> None:
    criteria = state.session.info.get(CRITERIA_KEY)
    if criteria is None or not (state.is_select or state.is_update or state.is_delete):
        return
    if state.is_column_load or state.is_relationship_load:
        return  # the parent row was loaded through the filter already
    state.statement = state.statement.options(criteria)


@event.listens_for(Session, "before_flush")
def _stamp_project(session: Session, _context: Any, _instances: Any) -> None:
    project_id = session.info.get(PROJECT_KEY)
    if project_id is None:
        return
    for row in session.new:
        if isinstance(row, ProjectOwned) and row.project_id is None:
            row.project_id = project_id
