"""Who may do what (docs/access.md): every decision about a caller's scopes, the project it
acts in, the server admin, and the roles a dashboard session gets. No other module tests a
token's scopes; the request dependencies (service.deps.require) and the dashboard's session
(service.ui.session) ask here.

A token holds its scopes in its own project; `admin` there is the project's admin role,
which holds every project scope (read, write, gate, admin), in the API and the dashboard
alike. The server admin (the bootstrap token, or a stored token bound to no project with
`admin`) holds every project scope in every project.
"""

from collections.abc import Collection, Iterable, Mapping

from sqlalchemy import inspect, select
from sqlalchemy.orm import Session

from service.auth.models import ApiToken
from service.errors import Forbidden
from service.projects.models import DEFAULT_PROJECT, Person, Project, ProjectMember
from service.projects.service import PROJECT_SCOPES, ROLES, get_project, grants, project_not_found

ADMIN = "admin"
Roles = Mapping[str, frozenset[str]]  # the scopes held in each project, by project name


def bootstrap_admin() -> ApiToken:
    """The caller FLIPGATE_ADMIN_TOKEN authenticates: the server admin, stored nowhere."""
    return ApiToken(name=ADMIN, scopes=[ADMIN], project_id=None)


def is_server_admin(token: ApiToken) -> bool:
    """The bootstrap admin token, or a stored token bound to no project with `admin`."""
    return token.project_id is None and ADMIN in token.scopes


def held_scopes(token: ApiToken) -> frozenset[str]:
    """The project scopes `token` holds where it acts: all of them with `admin` (a project's
    admin role; the server admin's in every project), else its own (`metrics` is no
    project's)."""
    return PROJECT_SCOPES if ADMIN in token.scopes else PROJECT_SCOPES & set(token.scopes)


def require_scope(token: ApiToken, scope: str, *alternatives: str) -> None:
    """Refuse a token that has none of `scope`, the `alternatives` and `admin`."""
    if not {scope, *alternatives} & held_scopes(token):
        wanted = " or ".join(repr(name) for name in (scope, *alternatives))
        raise Forbidden("missing_scope", f"token {token.name!r} lacks the {wanted} scope")


def require_server_scope(token: ApiToken, scope: str | None = None) -> None:
    """Refuse a token unless it is the server admin or (with `scope`) holds `scope`, a scope
    of no project (`metrics`), wherever it is bound."""
    if is_server_admin(token) or scope in token.scopes:
        return
    lacking = f"lacks the {scope!r} scope" if scope else "is not the server admin"
    raise Forbidden("missing_scope", f"token {token.name!r} {lacking}")


def require_force(token: ApiToken) -> None:
    """Refuse to force a promotion (past the gate) for a token without `admin`."""
    if ADMIN not in held_scopes(token):
        raise Forbidden("missing_scope", "forcing a promotion needs the 'admin' scope")


def require_grantable(token: ApiToken, scopes: Collection[str], project: Project | None) -> None:
    """Refuse to mint a token with `scopes` in `project` (None: a server-level one) unless
    `token` may: the server admin mints anything, a project's admin only the project scopes
    it holds, in its project."""
    if project is None and not is_server_admin(token):
        raise Forbidden("missing_scope", "only the server admin mints server-level tokens")
    lacking = set(scopes) - held_scopes(token)
    if lacking and not is_server_admin(token):
        raise Forbidden("missing_scope", f"token {token.name!r} cannot grant scopes it does "
                        f"not hold: {sorted(lacking)}")


def acting_project(*, session: Session, token: ApiToken, named: str | None) -> Project:
    """The project a request of `token` acts in: a bound token's own (naming another, even
    one that exists, is 404 project_not_found, as a name of none is); a server-level token's
    `named` one, `default` when it names none."""
    if token.project_id is None:
        return get_project(session=session, name=named or DEFAULT_PROJECT)
    own = _loaded_project(token)
    own = session.get_one(Project, token.project_id) if own is None else _attached(session, own)
    if named is not None and named != own.name:
        raise project_not_found(named)
    return own


def knows_project(token: ApiToken) -> bool:
    """Whether acting_project answers for `token` without reading the database: a bound
    token whose project was loaded with it (service.auth.service.authenticate)."""
    return token.project_id is not None and _loaded_project(token) is not None


def _attached(session: Session, project: Project) -> Project:
    """`project`, loaded with its token, as `session`'s own without a query: the row itself
    when it belongs to no session and `session` holds no copy of it (a token just looked up),
    else a copy merged in."""
    state = inspect(project)
    if state.detached and state.key not in session.identity_map:
        session.add(project)
        return project
    return session.merge(project, load=False)


def _loaded_project(token: ApiToken) -> Project | None:
    return inspect(token).dict.get("project")


def held_projects(*, session: Session, token: ApiToken) -> list[tuple[Project, frozenset[str]]]:
    """The projects `token` can act in (the server admin: all; a bound token: its own), by
    name, each with the scopes it holds there: GET /projects and a token's dashboard
    session answer with these."""
    statement = select(Project).order_by(Project.name)
    if not is_server_admin(token):
        statement = statement.where(Project.id == token.project_id)
    return [(project, held_scopes(token)) for project in session.scalars(statement)]


def token_roles(*, session: Session, token: ApiToken) -> Roles:
    """The roles of a dashboard session signed in with `token` (see held_projects)."""
    return {project.name: scopes for project, scopes in held_projects(session=session,
                                                                        token=token)}


def person_roles(*, session: Session, person: Person, admin_group: str | None) -> Roles:
    """The roles of a person signed in with OpenID Connect: every project, as its admin, for
    a member of `admin_group`; else in each project the union of the roles granted to their
    subject and to each of their groups."""
    if in_admin_group(person.groups, admin_group):
        return {name: PROJECT_SCOPES
                for name in session.scalars(select(Project.name).order_by(Project.name))}
    held: dict[str, frozenset[str]] = {}
    for project, role in grants(session=session, subject=person.subject, groups=person.groups):
        held[project] = held.get(project, frozenset()) | ROLES[role]
    return held


def granted_scopes(members: Iterable[ProjectMember], *, subject: str, groups: Collection[str],
                   admin_group: str | None) -> frozenset[str]:
    """The scopes a person with `subject` and `groups` holds in the project whose grants are
    `members`, by the rule of person_roles."""
    if in_admin_group(groups, admin_group):
        return PROJECT_SCOPES
    return frozenset().union(*(ROLES[member.role] for member in members
                               if (member.kind, member.principal) == ("subject", subject)
                               or (member.kind == "group" and member.principal in groups)))


def in_admin_group(groups: Collection[str], admin_group: str | None) -> bool:
    """Whether a person of `groups` is the server's admin (FLIPGATE_OIDC_ADMIN_GROUP)."""
    return bool(admin_group) and admin_group in groups


def not_held(roles: Roles, project: str | None, scopes: Collection[str]) -> set[str]:
    """The `scopes` a dashboard session with `roles` does not hold in `project` (a person
    mints a personal token with scopes they hold only)."""
    return set(scopes) - roles.get(project or "", frozenset())


def may_see(roles: Roles, project: str) -> bool:
    """Whether a dashboard session with `roles` may see `project`'s pages."""
    return holds(roles, project, "read")


def holds(roles: Roles, project: str | None, scope: str) -> bool:
    """Whether a dashboard session with `roles` holds `scope` in `project`."""
    return not not_held(roles, project, [scope])
