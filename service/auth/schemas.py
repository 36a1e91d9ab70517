"""Wire schemas of API tokens (never their hashes)."""

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

MAX_EXPIRY_DAYS = 3650


class TokenCreate(BaseModel):
    name: str = Field(description="unique in its project: letters, digits and . _ -")
    project: str | None = Field(None, description=(
        "the project the token is bound to (default: the project the request acts in); "
        "`null`, sent explicitly by the server admin, mints a server-level token (scopes "
        "admin or metrics)"))
    scopes: list[str] = Field(min_length=1, description="read, write, gate, admin (metrics: "
                              "server-level tokens, minted by the server admin)")
    expires_in_days: int | None = Field(None, ge=1, le=MAX_EXPIRY_DAYS,
                                        description="default: never expires")

    def server_level(self) -> bool:
        """Whether the body asks for a token bound to no project (`"project": null`)."""
        return "project" in self.model_fields_set and self.project is None


class TokenRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(BaseModel):
    """A minted token: its plaintext `token` is shown this once and never again."""

    name: str
    project: str | None
    scopes: list[str]
    expires_at: datetime | None
    token: str
