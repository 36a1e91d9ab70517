"""Token endpoints: revoking a stored token (admin scope). Tokens are minted with
`flipgate token create`, so their plaintext never crosses the API."""

from fastapi import APIRouter, Response

from service.auth.service import revoke_token
from service.deps import AdminAccess, CommittingRoute, SessionDep

router = APIRouter(prefix="/tokens", tags=["auth"], route_class=CommittingRoute)


@router.delete("/{name}", status_code=204,
               responses={404: {"description": "the project has no token of this name"}})
def delete_token(name: str, session: SessionDep, acting: AdminAccess) -> Response:
    """Revoke the token `name` of the project the request acts in at once; its row stays
    for the audit trail. Repeating it is harmless."""
    revoke_token(session=session, name=name, project=acting.project.name)
    return Response(status_code=204)
