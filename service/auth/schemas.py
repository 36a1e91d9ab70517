"""Read schema of an API token (without its hash)."""

from datetime import datetime

from service.schemas import RecordRead


class ApiTokenRead(RecordRead):
    name: str
    scopes: list[str]
    revoked_at: datetime | None
