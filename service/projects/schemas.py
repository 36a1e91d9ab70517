"""Wire schemas of projects and their members."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from service.errors import InvalidInput
from service.projects.models import PRINCIPAL_LENGTH
from service.schemas import RecordRead

Principal = Annotated[str | None, Field(min_length=1, max_length=PRINCIPAL_LENGTH)]


class ProjectCreate(BaseModel):
    name: str = Field(description="letters, digits and . _ -, starting with a letter or digit")


class ProjectRead(RecordRead):
    name: str
    scopes: list[str] = Field(description="the scopes the caller holds in the project")


class MemberName(BaseModel):
    """A group name or a person's OpenID subject: exactly one of the two."""

    group: Principal = None
    subject: Principal = None

    def principal(self) -> tuple[str, str]:
        """(kind, name) of the one principal named (422 invalid_member otherwise)."""
        named = [(kind, name) for kind, name in (("group", self.group),
                                                 ("subject", self.subject)) if name is not None]
        if len(named) != 1:
            raise InvalidInput("invalid_member", "name exactly one of `group` and `subject`")
        return named[0]


class MemberGrant(MemberName):
    role: str = Field(description="viewer, maintainer, gatekeeper or admin")


class MemberRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    kind: str = Field(description="group or subject")
    principal: str
    role: str
