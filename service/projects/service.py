"""Projects and roles: creating projects and granting roles (what a caller may do with them:
service.auth.access).

A role is a set of today's scopes, so every documented rule keeps its meaning:

| role       | scopes                     |
|------------|----------------------------|
| viewer     | read                       |
| maintainer | read, write                |
| gatekeeper | read, gate                 |
| admin      | read, write, gate, admin   |
"""

from collections.abc import Iterable

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from service.db import insert_or_conflict
from service.errors import InvalidInput, NotFound
from service.names import check_name
from service.projects.models import Project, ProjectMember

ROLES: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "maintainer": frozenset({"read", "write"}),
    "gatekeeper": frozenset({"read", "gate"}),
    "admin": frozenset({"read", "write", "gate", "admin"}),
}
PROJECT_SCOPES = ROLES["admin"]


def create_project(*, session: Session, name: str) -> Project:
    """A new, empty project (409 project_exists if the name is taken)."""
    check_name(name, "project_name")
    return insert_or_conflict(session, Project(name=name), code="project_exists",
                              message=f"a project named {name!r} exists")


def project_not_found(name: str) -> NotFound:
    return NotFound("project_not_found", f"no project named {name!r}")


def get_project(*, session: Session, name: str) -> Project:
    found = session.scalars(select(Project).where(Project.name == name)).one_or_none()
    if found is None:
        raise project_not_found(name)
    return found


def check_role(role: str) -> frozenset[str]:
    if role not in ROLES:
        raise InvalidInput("invalid_role", f"role must be one of {sorted(ROLES)}, not {role!r}")
    return ROLES[role]


def grant(*, session: Session, project: Project, kind: str, principal: str,
          role: str) -> ProjectMember:
    """Give the group or subject `principal` the role `role` in `project` (replacing the
    role it had)."""
    check_role(role)
    found = _member(session, project, kind, principal)
    if found is None:
        found = ProjectMember(project_id=project.id, kind=kind, principal=principal, role=role)
        session.add(found)
    found.role = role
    session.flush()
    return found


def revoke(*, session: Session, project: Project, kind: str, principal: str) -> None:
    """Take the grant of `principal` in `project` back (404 member_not_found if none)."""
    if _member(session, project, kind, principal) is None:
        raise NotFound("member_not_found", f"{kind} {principal!r} has no role in project "
                       f"{project.name!r}")
    session.execute(delete(ProjectMember).where(
        ProjectMember.project_id == project.id, ProjectMember.kind == kind,
        ProjectMember.principal == principal))


def members(*, session: Session, project: Project) -> list[ProjectMember]:
    return list(session.scalars(select(ProjectMember)
                                .where(ProjectMember.project_id == project.id)
                                .order_by(ProjectMember.kind, ProjectMember.principal)))


def _member(session: Session, project: Project, kind: str,
            principal: str) -> ProjectMember | None:
    return session.scalars(select(ProjectMember).where(
        ProjectMember.project_id == project.id, ProjectMember.kind == kind,
        ProjectMember.principal == principal)).one_or_none()


def grants(*, session: Session, subject: str,
           groups: Iterable[str]) -> list[tuple[str, str]]:
    """The (project name, role) of every grant to the subject `subject` or to one of
    `groups`."""
    return [(project, role) for project, role in session.execute(
        select(Project.name, ProjectMember.role)
        .join(Project, Project.id == ProjectMember.project_id)
        .where(or_(_principal_is("subject", [subject]), _principal_is("group", groups))))]


def _principal_is(kind: str, principals: Iterable[str]):
    return (ProjectMember.kind == kind) & ProjectMember.principal.in_(list(principals))
