"""Single sign-on for the dashboard: OpenID Connect's authorization code flow with PKCE
(S256), `state` and `nonce`, through Authlib (the exchange) and joserfc (the ID token).

`start` makes the provider's address and the flow's state (state, nonce, PKCE verifier, the
page to return to), which the browser keeps in a short-lived signed cookie of its own
(SameSite=Lax: the provider's redirect back is a cross-site navigation, on which the
Strict session cookie is not sent). `finish` checks the state, exchanges the code, and
validates the ID token (signature by the provider's JWKS, issuer, audience = our client id,
expiry, nonce) before it upserts the Person. The provider's addresses are discovered at
{issuer}/.well-known/openid-configuration; nothing else is reached.
"""

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from authlib.integrations.base_client import OAuthError
from authlib.oauth2.rfc6749 import OAuth2Error
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry
from sqlalchemy.orm import Session

from service.audit.service import Caller
from service.config import Settings
from service.db import utcnow
from service.errors import ServiceError
from service.projects.models import Person
from service.ui.session import SignInRequired, signed, unsigned

if TYPE_CHECKING:  # httpx is imported where a provider is called: its package loads rich
    from authlib.integrations.httpx_client import OAuth2Client

FLOW_COOKIE = "flipgate_oidc"
FLOW_SECONDS = 600  # a sign-in must come back from the provider within this
LEEWAY_SECONDS = 60  # clock skew allowed on the ID token's times
TIMEOUT_SECONDS = 10.0
SCOPES = "openid email profile"
AUTH = "oidc"  # how a signed-in person authenticated, for the audit trail


class SignInRefused(ServiceError, status_code=400):
    """A sign-in that is not accepted (400 with a machine-readable code); no session is
    made."""


class ProviderUnreachable(ServiceError, status_code=502):
    """The OpenID provider did not answer as one does (502)."""


@dataclass(frozen=True)
class Started:
    """Where to send the browser, and the flow cookie's value."""

    url: str
    cookie: str


def enabled(settings: Settings) -> bool:
    return bool(settings.oidc_issuer)


def start(settings: Settings, redirect_uri: str, next_page: str) -> Started:
    """The provider's authorization address for a new flow, and that flow's state."""
    state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
    with _client(settings, redirect_uri) as client:
        url, _ = client.create_authorization_url(
            _metadata(client, settings)["authorization_endpoint"], state=state, nonce=nonce,
            code_verifier=verifier)
    return Started(url, signed(settings, {"state": state, "nonce": nonce, "verifier": verifier,
                                          "next": next_page,
                                          "exp": int(time.time()) + FLOW_SECONDS}))


def flow_next(settings: Settings, cookie: str | None) -> str | None:
    """The page a flow cookie returns to, if it is well signed."""
    try:
        return str(unsigned(settings, cookie).get("next", ""))
    except SignInRequired:
        return None


def finish(settings: Settings, redirect_uri: str, cookie: str | None,
           params: dict[str, str]) -> dict[str, Any]:
    """The validated ID token claims of the provider's answer `params` to the flow in
    `cookie`; SignInRefused when the flow is missing or expired, the state differs, the
    provider refused, the code is refused, or the ID token is not valid for us."""
    import httpx

    flow = _flow(settings, cookie)
    if not secrets.compare_digest(params.get("state", "").encode(), flow["state"].encode()):
        raise SignInRefused("oidc_state_mismatch", "the sign-in's state is not the one this "
                            "browser started with; start again")
    if "error" in params or "code" not in params:
        raise SignInRefused("oidc_provider_refused", f"the provider refused the sign-in: "
                            f"{params.get('error', 'no code')}")
    with _client(settings, redirect_uri) as client:
        metadata = _metadata(client, settings)
        try:
            token = client.fetch_token(metadata["token_endpoint"], code=params["code"],
                                       code_verifier=flow["verifier"])
        except (OAuthError, OAuth2Error, httpx.HTTPError) as error:
            raise SignInRefused("oidc_code_refused", f"the provider did not exchange the "
                                f"code: {error}") from error
        keys = _get(client, metadata["jwks_uri"])
    return _claims(settings, token, keys, flow["nonce"],
                   metadata.get("id_token_signing_alg_values_supported"))


def upsert_person(session: Session, settings: Settings, claims: dict[str, Any]) -> Person:
    """The Person the claims name, with their e-mail, name and groups as of now."""
    person = session.get(Person, claims["sub"]) or Person(subject=claims["sub"], groups=[])
    person.email = _text(claims.get("email"))
    person.display_name = _text(claims.get("name") or claims.get("preferred_username"))
    person.groups = _groups(claims.get(settings.oidc_groups_claim))
    person.signed_in_at = utcnow()
    session.add(person)
    session.flush()
    return person


def caller(person: Person) -> Caller:
    """A person signing in, as the audit trail's caller: their subject and e-mail, acting in
    no project."""
    return Caller(actor=person.subject, auth=AUTH, project_id=None, email=person.email)


def _flow(settings: Settings, cookie: str | None) -> dict[str, str]:
    try:
        flow = unsigned(settings, cookie)
        if int(flow["exp"]) > time.time():
            return {key: str(flow[key]) for key in ("state", "nonce", "verifier")}
    except (SignInRequired, KeyError, TypeError, ValueError):
        pass
    raise SignInRefused("oidc_flow_missing", "this browser has no sign-in under way (it "
                        "expired, or cookies are blocked); start again")


def _claims(settings: Settings, token: dict[str, Any], keys: dict[str, Any], nonce: str,
            algorithms: list[str] | None) -> dict[str, Any]:
    """The ID token's claims, checked: signature, issuer, audience, expiry, nonce."""
    client_id = settings.oidc_client_id
    try:
        decoded = jwt.decode(token["id_token"], KeySet.import_key_set(keys),
                             registry=JWSRegistry(algorithms=algorithms))
        claims = CodeIDToken(decoded.claims, decoded.header,
                             {"iss": {"essential": True, "value": settings.oidc_issuer},
                              "aud": {"essential": True, "value": client_id}},
                             {"nonce": nonce, "client_id": client_id,
                              "access_token": token.get("access_token")})
        claims.validate(leeway=LEEWAY_SECONDS)
    except (JoseError, KeyError, ValueError) as error:
        raise SignInRefused("oidc_invalid_id_token", f"the provider's ID token is not valid "
                            f"for this server: {error}") from error
    return dict(claims)


def _client(settings: Settings, redirect_uri: str) -> "OAuth2Client":
    from authlib.integrations.httpx_client import OAuth2Client

    secret = settings.oidc_client_secret
    return OAuth2Client(settings.oidc_client_id,
                        secret.get_secret_value() if secret else None,
                        scope=SCOPES, redirect_uri=redirect_uri,
                        code_challenge_method="S256", timeout=TIMEOUT_SECONDS,
                        trust_env=False)


def _metadata(client: "OAuth2Client", settings: Settings) -> dict[str, Any]:
    """The provider's discovery document; it must name the configured issuer."""
    issuer = (settings.oidc_issuer or "").rstrip("/")
    metadata = _get(client, f"{issuer}/.well-known/openid-configuration")
    if metadata.get("issuer") != settings.oidc_issuer:
        raise ProviderUnreachable("oidc_issuer_mismatch", f"the provider's discovery document "
                            f"names the issuer {metadata.get('issuer')!r}, not "
                            f"FLIPGATE_OIDC_ISSUER {settings.oidc_issuer!r}")
    return metadata


def _get(client: "OAuth2Client", url: str) -> dict[str, Any]:
    import httpx

    try:
        response = client.request("GET", url, withhold_token=True)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as error:
        raise ProviderUnreachable("oidc_provider_unreachable", f"the OpenID provider did not "
                            f"answer {url}: {error}") from error


def _text(value: Any) -> str | None:
    return value[:255] if isinstance(value, str) and value else None


def _groups(value: Any) -> list[str]:
    """The groups claim as a list of names (a provider may send one name as a string)."""
    if isinstance(value, str):
        value = [value]
    return [group for group in value or [] if isinstance(group, str)]
