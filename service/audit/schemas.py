"""Wire schemas of the audit trail."""

from typing import Any

from pydantic import BaseModel

from service.audit.models import AuditEvent
from service.schemas import RecordRead


class AuditEventRead(RecordRead):
    """One event: who (actor, actor_email, auth: token, admin_token, webhook, session, oidc,
    cli), where (project: null for the server's own), what (action, resource), how it ended
    (outcome ok or denied, with the refusal's reason) and the request's id and client."""

    actor: str
    actor_email: str | None
    auth: str
    project: str | None
    action: str
    resource: str
    outcome: str
    reason: str | None
    request_id: str | None
    client: str | None
    details: dict[str, Any] | None

    @classmethod
    def of(cls, row: AuditEvent, project: str | None) -> "AuditEventRead":
        """The event `row` of the project named `project`."""
        return cls.model_validate({name: getattr(row, name) for name in cls.model_fields
                                   if name != "project"} | {"project": project})


class AuditPage(BaseModel):
    """A page of events, newest first; `next_cursor` (null on the last page) asks for the
    next one."""

    events: list[AuditEventRead]
    next_cursor: str | None
