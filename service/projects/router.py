"""Endpoints of projects and their members (docs/access.md).

The routes under /projects/{project} check the caller's `admin` scope first and then the
project (service.deps.require): a token of another project gets exactly the 403,
then the 404 project_not_found, that a project existing nowhere gets."""

from typing import Annotated

from fastapi import APIRouter, Request, Response

from service import flows
from service.deps import (
    SERVER_ADMIN,
    Acting,
    CallerProjects,
    CommittingRoute,
    SessionDep,
    project_in_path,
    require,
)
from service.projects import service
from service.projects.models import Project, ProjectMember
from service.projects.schemas import MemberGrant, MemberName, MemberRead, ProjectCreate, ProjectRead

router = APIRouter(prefix="/projects", tags=["projects"], route_class=CommittingRoute)
ProjectAdmin = Annotated[Acting, require("admin", named_in=project_in_path)]
NOT_FOUND = {404: {"description": "no such project for this caller (project_not_found)"}}


def project_read(project: Project, scopes: frozenset[str]) -> ProjectRead:
    return ProjectRead(id=project.id, created_at=project.created_at, name=project.name,
                       scopes=sorted(scopes))


@router.post("", status_code=201, response_model=ProjectRead,
             responses={409: {"description": "the name is taken (project_exists)"}},
             dependencies=[SERVER_ADMIN])
def create_project(body: ProjectCreate, session: SessionDep) -> ProjectRead:
    """Create an empty project (the server admin only, who holds every scope in it); 422
    invalid_project_name for a name that is not one."""
    return project_read(service.create_project(session=session, name=body.name),
                        service.PROJECT_SCOPES)


@router.get("", response_model=list[ProjectRead])
def list_projects(held: CallerProjects) -> list[ProjectRead]:
    """The projects the caller can act in (the server admin: all; a project-bound token:
    its own), each with the scopes the caller holds there."""
    return [project_read(project, scopes) for project, scopes in held]


@router.get("/{project}/members", response_model=list[MemberRead], responses=NOT_FOUND)
def list_members(session: SessionDep, acting: ProjectAdmin) -> list[ProjectMember]:
    """The groups and subjects granted a role in the project (its admins and the server
    admin)."""
    return service.members(session=session, project=acting.project)


@router.put("/{project}/members", response_model=MemberRead, responses=NOT_FOUND)
def grant_member(body: MemberGrant, request: Request, session: SessionDep,
                 acting: ProjectAdmin) -> ProjectMember:
    """Grant a group or a subject a role in the project, replacing the one it had (422
    invalid_member unless exactly one of `group` and `subject` is given, invalid_role for
    a role that is none of viewer, maintainer, gatekeeper and admin); the personal tokens
    whose owner no longer holds their scopes are revoked."""
    kind, principal = body.principal()
    return flows.change_grant(session=session, request=request, project=acting.project,
                              kind=kind, principal=principal, role=body.role)


@router.delete("/{project}/members", status_code=204,
               responses={404: {"description": "no such project for this caller "
                                               "(project_not_found), or no such grant "
                                               "(member_not_found)"}})
def revoke_member(body: MemberName, request: Request, session: SessionDep,
                  acting: ProjectAdmin) -> Response:
    """Take a group's or a subject's role in the project back (the body of the PUT that
    granted it; its `role` is not needed); the personal tokens whose owner no longer holds
    their scopes are revoked."""
    kind, principal = body.principal()
    flows.remove_grant(session=session, request=request, project=acting.project, kind=kind,
                       principal=principal)
    return Response(status_code=204)
