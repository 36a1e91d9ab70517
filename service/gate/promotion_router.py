"""Endpoints that move a line's aliases: `production` only with the gate's approval."""

from fastapi import APIRouter

from service.auth.access import require_force
from service.deps import READ, WRITE, CommittingRoute, SessionDep, TokenDep
from service.gate import promotion
from service.gate.models import Promotion
from service.gate.schemas import AliasMove, PromotionRead
from service.registry.models import Alias
from service.registry.schemas import AliasRead
from service.registry.service import PRODUCTION, get_alias, set_alias

router = APIRouter(tags=["gate"], route_class=CommittingRoute)


@router.post("/models/{name}/aliases/{alias}", response_model=AliasRead, dependencies=[WRITE])
def move_alias(name: str, alias: str, body: AliasMove, session: SessionDep,
               token: TokenDep) -> Alias:
    """Point an alias at a version. `production` moves only to a version with an approving
    decision against the current production version, unless `force` (scope admin)."""
    if alias != PRODUCTION:
        return set_alias(session=session, line_name=name, alias=alias, version=body.version)
    if body.force:
        require_force(token)
    promotion.promote(session=session, line_name=name, version=body.version,
                      requested_by=token.name, force=body.force)
    return get_alias(session=session, line_name=name, alias=PRODUCTION)


@router.get("/models/{name}/promotions", response_model=list[PromotionRead],
            dependencies=[READ])
def list_promotions(name: str, session: SessionDep) -> list[Promotion]:
    """Every move of the line's production alias, with the decision that allowed it."""
    return promotion.list_promotions(session=session, line_name=name)
