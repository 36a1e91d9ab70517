"""Request dependencies: settings, the artifact store, one session per request, and auth."""

import secrets
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.artifacts import ArtifactStore
from service.auth.models import ApiToken
from service.auth.service import authenticate, require_scope
from service.config import Settings
from service.db import session_scope
from service.errors import Unauthorized
from service.jobs.enqueue import enqueue_after_commit

bearer = HTTPBearer(auto_error=False, description="an API token, or FLIPGATE_ADMIN_TOKEN")


def get_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    return request.app.state.settings


def get_store(request: Request) -> ArtifactStore:
    """The app's artifact store."""
    return request.app.state.store


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request: committed when the endpoint returns, rolled back if it raises;
    the jobs it created are sent to the workers after the commit.

    An async dependency, so the commit runs on the event loop as soon as the endpoint
    returns: a request that holds SQLite's write lock never waits for a free thread of the
    pool (which the requests waiting for that lock may all occupy) to release it.
    """
    with session_scope(request.app.state.sessions) as session:
        enqueue_after_commit(session=session, celery=request.app.state.celery)
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ArtifactStore, Depends(get_store)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def current_token(session: SessionDep, settings: SettingsDep,
                  credentials: Credentials) -> ApiToken:
    """The token the request presents: the bootstrap admin token or a stored one."""
    if credentials is None:
        raise Unauthorized("missing_token", "send an 'Authorization: Bearer <token>' header")
    admin = settings.admin_token
    if admin is not None and secrets.compare_digest(credentials.credentials.encode(),
                                                    admin.get_secret_value().encode()):
        return ApiToken(name="admin", scopes=["admin"])
    return authenticate(session=session, token=credentials.credentials)


TokenDep = Annotated[ApiToken, Depends(current_token)]


def require(scope: str, *alternatives: str) -> Any:
    """A route dependency that admits tokens with `scope`, one of `alternatives`, or admin."""

    def check(token: TokenDep) -> None:
        require_scope(token, scope, *alternatives)

    return Depends(check)


READ = require("read")
WRITE = require("write")
ADMIN = require("admin")
