"""Projects and roles: creating projects, granting roles, and the project a request acts in.

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

from service.auth.models import ApiToken
from service.db import insert_or_conflict
from service.errors import InvalidInput, NotFound
from service.names import check_name
from service.projects.models import DEFAULT_PROJECT, Person, Project, ProjectMember

ROLES: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "maintainer": frozenset({"read", "write"}),
    "gatekeeper": frozenset({"read", "gate"}),
    "admin": frozenset({"read", "write", "gate", "admin"}),
}
PROJECT_SCOPES = ROLES["admin"]


def is_server_admin(token: ApiToken) -> bool:
    """The bootstrap admin token, or a stored token bound to no project with `admin`."""
    return token.project_id is None and "admin" in token.scopes


def held_scopes(token: ApiToken) -> frozenset[str]:
    """The project scopes `token` holds where it acts: all of them with `admin` (the server
    admin's in every project), else its own (`metrics` is no project's)."""
    return PROJECT_SCOPES if "admin" in token.scopes else PROJECT_SCOPES & set(token.scopes)


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


def acting_project(*, session: Session, token: ApiToken, named: str | None) -> Project:
    """The project a request of `token` acts in: a bound token's own (naming another, even
    one that exists, is 404 project_not_found, as a name of none is); a server-level token's
    `named` one, `default` when it names none."""
    if token.project_id is None:
        return get_project(session=session, name=named or DEFAULT_PROJECT)
    own = session.get_one(Project, token.project_id)
    if named is not None and named != own.name:
        raise project_not_found(named)
    return own


def visible_projects(*, session: Session, token: ApiToken) -> list[Project]:
    """The projects a token can act in: all for a server admin, else its own."""
    statement = select(Project).order_by(Project.name)
    if not is_server_admin(token):
        statement = statement.where(Project.id == token.project_id)
    return list(session.scalars(statement))


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


def person_roles(*, session: Session, person: Person) -> dict[str, frozenset[str]]:
    """The scopes a signed-in person holds in each project they belong to (by name): the
    union of the roles granted to their subject and to each of their groups."""
    grants = session.execute(
        select(Project.name, ProjectMember.role).join(Project,
                                                      Project.id == ProjectMember.project_id)
        .where(or_(_principal_is("subject", [person.subject]),
                   _principal_is("group", person.groups)))).all()
    held: dict[str, frozenset[str]] = {}
    for project, role in grants:
        held[project] = held.get(project, frozenset()) | ROLES[role]
    return held


def _principal_is(kind: str, principals: Iterable[str]):
    return (ProjectMember.kind == kind) & ProjectMember.principal.in_(list(principals))
