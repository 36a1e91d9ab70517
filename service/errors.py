"""Typed errors of the service layer; the API renders each as JSON with its status and code."""

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.responses import JSONResponse

import flipgate.errors


class ServiceError(Exception):
    """A refusal with an HTTP status, a machine-readable `code` and a message for people."""

    status_code: ClassVar[int] = 500

    def __init_subclass__(cls, status_code: int) -> None:
        super().__init_subclass__()
        cls.status_code = status_code

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class InvalidInput(ServiceError, status_code=422):
    """The request is well-formed but its content is refused."""


class Unauthorized(ServiceError, status_code=401):
    """No valid credentials were presented."""


class Forbidden(ServiceError, status_code=403):
    """The credentials lack the permission the action needs."""


class NotFound(ServiceError, status_code=404):
    """The named thing does not exist."""


class Conflict(ServiceError, status_code=409):
    """The action clashes with what is already stored."""


class UnsupportedMediaType(ServiceError, status_code=415):
    """The request body is not of the type the route takes."""


class PayloadTooLarge(ServiceError, status_code=413):
    """An upload exceeds the size limit."""


class StorageUnavailable(ServiceError, status_code=503):
    """The artifact store cannot be reached, refuses the server's credentials or does not
    answer in time (`storage_unavailable`), or handed back bytes that are not the artifact
    (`artifact_corrupt`); nothing of the request was kept: retry later (Retry-After)."""

    retry_after_seconds: ClassVar[int] = 5


def describe_problems(problems: list[dict]) -> str:
    """Pydantic's validation errors as one line: "where: what; where: what"."""
    return "; ".join(f"{'.'.join(map(str, problem['loc'])) or 'body'}: {problem['msg']}"
                     for problem in problems)


@contextmanager
def library_input() -> Iterator[None]:
    """Re-raise the library's InputError (flipgate.errors) as the service's InvalidInput."""
    try:
        yield
    except flipgate.errors.InputError as error:
        raise InvalidInput(error.code, error.message) from error


def error_response(status: int, code: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The body of every refusal: {"error": {"code": ..., "message": ...}}."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def storage_full_refusal(error: BaseException | None) -> JSONResponse | None:
    """507 `storage_full` when `error`, or what caused it (the form parser answers 400 for
    any failure of its spool in TMPDIR), is the server's storage refusing a write: full
    (ENOSPC), over a quota (EDQUOT) or over a file-size limit (EFBIG); None otherwise."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in STORAGE_FULL_ERRNOS:
            return error_response(507, "storage_full", "the server's storage is full; nothing "
                                  "of this request was kept", headers={"Retry-After": "60"})
        error = error.__cause__
    return None


def database_refusal(error: OperationalError | PoolTimeout) -> JSONResponse:
    """503 with Retry-After: the database is locked by other writers for too long
    (`database_busy`), every pooled connection is taken (the same), or it cannot be reached
    (`database_unavailable`)."""
    busy = isinstance(error, PoolTimeout) or "database is locked" in str(error.orig)
    return error_response(503, "database_busy" if busy else "database_unavailable",
                          "the database is busy; retry shortly" if busy else
                          f"the database cannot be reached: {type(error.orig).__name__}",
                          headers={"Retry-After": "1"})
