"""Personal tokens follow their owner's grants (docs/access.md).

A person signed in with OpenID Connect mints a personal token on the dashboard
(service.ui.people) with scopes they hold in its project; the token keeps its `owner` (their
subject) and `owner_groups` (their groups then). When a grant of the project is removed or
its role changed, the personal tokens whose scopes their owner no longer all holds through
the remaining grants (to their subject, to one of owner_groups, or the server's admin
group) are revoked in the same transaction; the rest stay active. Authentication reads
nothing of this: a revoked token is refused as any other."""

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.auth.access import granted_scopes
from service.auth.models import ApiToken
from service.db import utcnow
from service.projects.models import Person, Project
from service.projects.service import members

REVOKE = "revoke_personal_token"  # the action of a personal token's revocation
GRANT_REMOVED, ROLE_LOWERED = "grant_removed", "role_lowered"  # why a grant's change revoked one


def set_owner(token: ApiToken, person: Person) -> None:
    """Make `token` the personal token of `person`, with the groups they hold now."""
    token.owner, token.owner_groups = person.subject, list(person.groups)


def owned_tokens(session: Session, subject: str) -> list[tuple[ApiToken, str]]:
    """The personal tokens of the person `subject`, the newest first, each with its
    project's name: revoked and expired ones too, in every project."""
    return [(row, project) for row, project in session.execute(
        select(ApiToken, Project.name).join(Project, Project.id == ApiToken.project_id)
        .where(ApiToken.owner == subject).order_by(ApiToken.id.desc()))]


def revoke_unheld_tokens(*, session: Session, project: Project,
                         admin_group: str | None) -> list[ApiToken]:
    """Revoke the active personal tokens in `project` with a scope their owner no longer
    holds there (see the module); the ones revoked, oldest first."""
    granted = members(session=session, project=project)
    unheld = [token for token in _active_personal_tokens(session, project)
              if not set(token.scopes) <= granted_scopes(
                  granted, subject=token.owner, groups=token.owner_groups or [],
                  admin_group=admin_group)]
    now = utcnow()
    for token in unheld:
        token.revoked_at = now
    session.flush()
    return unheld


def _active_personal_tokens(session: Session, project: Project) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).where(
        ApiToken.project_id == project.id, ApiToken.owner.is_not(None),
        ApiToken.revoked_at.is_(None),
        or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > utcnow()))
        .order_by(ApiToken.id)))
