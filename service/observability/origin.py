"""Where work came from: every row with a `request_id` column (a job, a gate decision) is
stamped, when it is inserted, with the request id under way, and a job with the trace
context under way (with tracing on); the worker that runs the job works under both again
(`job_origin`)."""

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from sqlalchemy import event

from service.db import Base
from service.observability.context import current_request_id, request_id_bound

_hooks: dict[str, Any] = {}  # with tracing on: service.observability.tracing's functions


def stamp_origin(_mapper: Any, _connection: Any, row: Any) -> None:
    """SQLAlchemy's before_insert: the request id (and trace context) under way, on a row
    that has the column and none yet."""
    if hasattr(row, "request_id") and row.request_id is None:
        row.request_id = current_request_id()
    if hasattr(row, "traceparent") and row.traceparent is None and "traceparent" in _hooks:
        row.traceparent = _hooks["traceparent"]()


def install_origin_stamps() -> None:
    """Stamp every row of every model inserted from now on in this process (once)."""
    if not event.contains(Base, "before_insert", stamp_origin):
        event.listen(Base, "before_insert", stamp_origin, propagate=True)


def use_tracing(**hooks: Any) -> None:
    """With tracing on: how to read the trace context under way (`traceparent`), open a job's
    span (`job_span`) and link to a reused job (`job_reused`)."""
    _hooks.update(hooks)


def job_reused(job: Any) -> None:
    """The work under way reuses an open job queued earlier (with tracing on: a link to the
    job's trace)."""
    if "job_reused" in _hooks:
        _hooks["job_reused"](job)


@contextmanager
def job_origin(*, request_id: str | None, traceparent: str | None, kind: str,
               job_id: int) -> Iterator[None]:
    """Run a job's work under the request id that queued it and, with tracing on, in a span
    of that request's trace."""
    span = _hooks.get("job_span")
    with (request_id_bound(request_id),
          span(traceparent=traceparent, kind=kind, job_id=job_id) if span else nullcontext()):
        yield
