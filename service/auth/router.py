"""Token endpoints: revoking a stored token (admin scope). Tokens are minted with
`flipgate token create`, so their plaintext never crosses the API."""

from fastapi import APIRouter, Response

from service.auth.service import revoke_token
from service.deps import ADMIN, CommittingRoute, SessionDep

router = APIRouter(prefix="/tokens", tags=["auth"], route_class=CommittingRoute)


@router.delete("/{name}", status_code=204, dependencies=[ADMIN],
               responses={404: {"description": "no token has this name"}})
def delete_token(name: str, session: SessionDep) -> Response:
    """Revoke the token `name` at once; its row stays for the audit trail. Repeating it is
    harmless."""
    revoke_token(session=session, name=name)
    return Response(status_code=204)
