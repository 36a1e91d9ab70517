"""Token endpoints: minting (shown once), listing and revoking the tokens of the project the
request acts in (docs/access.md). `flipgate token create` mints them on the server's
database too."""

from datetime import timedelta

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from service.auth.access import require_grantable, require_scope
from service.auth.models import ApiToken
from service.auth.schemas import TokenCreate, TokenCreated, TokenRead
from service.auth.service import create_token, project_tokens, revoke_token
from service.deps import AdminAccess, CommittingRoute, ProjectParam, SessionDep, TokenDep, act_in

router = APIRouter(prefix="/tokens", tags=["auth"], route_class=CommittingRoute)


@router.post("", status_code=201, response_model=TokenCreated,
             responses={409: {"description": "the project has a token of this name "
                                             "(token_exists)"}})
def mint_token(body: TokenCreate, request: Request, session: SessionDep, token: TokenDep,
               project: ProjectParam = None) -> TokenCreated:
    """Mint a token bound to `project` (default: the project the request acts in); its
    plaintext is in this answer only. The server admin mints in any project (and, with an
    explicit `"project": null`, server-level tokens); a project's admin only in its own, and
    only the project scopes read, write, gate and admin (403 missing_scope for others)."""
    require_scope(token, "admin")
    bound_to = mint_project(request, session, token, body, project)
    row, plaintext = create_token(
        session=session, name=body.name, scopes=body.scopes, project=bound_to,
        expires_in=None if body.expires_in_days is None else timedelta(days=body.expires_in_days))
    return TokenCreated(name=row.name, project=bound_to, scopes=row.scopes,
                        expires_at=row.expires_at, token=plaintext)


def mint_project(request: Request, session: Session, token: ApiToken, body: TokenCreate,
                 named: str | None) -> str | None:
    """The name of the project a new token is bound to (None: server-level), once `token`
    may mint `body` there."""
    project = (None if body.server_level()
               else act_in(request, session, token, body.project or named).project)
    require_grantable(token, body.scopes, project)
    return None if project is None else project.name


@router.get("", response_model=list[TokenRead])
def list_tokens(session: SessionDep, acting: AdminAccess) -> list[ApiToken]:
    """The tokens of the project the request acts in, revoked and expired ones included
    (their names, scopes and dates; never a secret or its hash)."""
    return project_tokens(session=session, project_id=acting.project.id)


@router.delete("/{name}", status_code=204,
               responses={404: {"description": "the project has no token of this name "
                                               "(token_not_found)"}})
def delete_token(name: str, session: SessionDep, acting: AdminAccess) -> Response:
    """Revoke the token `name` of the project the request acts in, at once; its row stays
    for the audit trail. Repeating it is harmless."""
    revoke_token(session=session, name=name, project=acting.project.name)
    return Response(status_code=204)
