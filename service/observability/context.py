"""The request id of the work under way: a request's (its X-Request-ID, checked, or a new
one), or in a worker the one stored on the job or decision it works on."""

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

HEADER = "X-Request-ID"
# what a caller's id may be: a UUID, a W3C trace id, a CI run's id; anything else (too long,
# spaces, quotes, control characters) is replaced by a new id, never refused
ACCEPTED = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_request_id: ContextVar[str | None] = ContextVar("flipgate_request_id", default=None)


def current_request_id() -> str | None:
    """The id of the request (or of the job's request) under way, if any."""
    return _request_id.get()


def request_id_from(presented: str | None) -> str:
    """The caller's id when it is acceptable, else a new random one."""
    if presented is not None and ACCEPTED.fullmatch(presented):
        return presented
    return uuid.uuid4().hex


@contextmanager
def request_id_bound(request_id: str | None) -> Iterator[None]:
    """Log lines (and rows created) inside the block carry `request_id`."""
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        _request_id.reset(token)
