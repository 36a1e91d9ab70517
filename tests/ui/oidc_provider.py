"""A real OpenID provider on loopback for the suite: oidc-provider-mock's (Authlib's
authorization server) in a thread, started as PostgreSQL and Redis are (unavailable: the
tests skip, and fail in CI). A test sets a person's claims (`set_user`), drives the
provider's consent form (`authorize`), and, for the hostile cases, has the token endpoint
answer with an ID token the provider issued to another client (`substitute_id_token`).
"""

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

CLIENT_ID, CLIENT_SECRET = "flipgate-dashboard", "flipgate-client-secret-0123456789"
StartResponse = Callable[..., Any]


@dataclass
class Provider:
    """The provider at `issuer`; its token endpoint's next answers carry `id_token` instead
    of the one it issued, while that is set."""

    issuer: str
    id_token: str | None = field(default=None, repr=False)

    def set_user(self, sub: str, **claims: Any) -> None:
        """The claims the provider issues for `sub` from now on."""
        httpx.put(f"{self.issuer}/users/{sub}", json=claims).raise_for_status()

    def authorize(self, url: str, sub: str) -> str:
        """Sign `sub` in on the provider's consent form at `url` (the authorization request):
        the address it sends the browser back to, with the code and state."""
        answer = httpx.post(url, data={"sub": sub})
        assert answer.status_code == 302, answer.text
        return answer.headers["location"]

    def token_for_another_client(self, sub: str, nonce: str, client_id: str) -> str:
        """An ID token the provider issues to `client_id` for `sub` with `nonce` (through the
        whole code flow of that client)."""
        redirect = "http://other-client.invalid/callback"
        query = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect,
                 "scope": "openid email profile", "state": "s", "nonce": nonce}
        back = self.authorize(str(httpx.URL(f"{self.issuer}/oauth2/authorize", params=query)),
                              sub)
        code = parse_qs(urlsplit(back).query)["code"][0]
        answer = httpx.post(f"{self.issuer}/oauth2/token", auth=(client_id, "other-secret"),
                            data={"grant_type": "authorization_code", "code": code,
                                  "redirect_uri": redirect})
        answer.raise_for_status()
        return answer.json()["id_token"]


class SubstitutingTokens:
    """WSGI middleware: the token endpoint's JSON answer with the provider's id_token swapped
    for `provider.id_token` while that is set (a provider that hands out the wrong token)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], provider: Provider) -> None:
        self.app, self.provider = app, provider

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        if self.provider.id_token is None or environ["PATH_INFO"] != "/oauth2/token":
            return self.app(environ, start_response)
        kept: list[Any] = []
        body = b"".join(self.app(environ, lambda *args: kept.extend(args)))
        status, headers = kept[0], kept[1]
        if status.startswith("200"):
            body = json.dumps({**json.loads(body), "id_token": self.provider.id_token}).encode()
        headers = [(name, value) for name, value in headers if name.lower() != "content-length"]
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [body]


@contextmanager
def running_provider(**options: Any) -> Iterator[Provider]:
    """The provider (oidc_provider_mock.app's `options`) serving on a free loopback port."""
    import werkzeug.serving

    provider = Provider(issuer="")
    flask_app = provider_package().app(require_nonce=True, **options)
    server = werkzeug.serving.make_server("localhost", 0,
                                          SubstitutingTokens(flask_app, provider), threaded=True)
    provider.issuer = f"http://localhost:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def provider_package() -> Any:
    """oidc_provider_mock; missing skips the test (fails it in CI)."""
    try:
        import oidc_provider_mock
    except ImportError as error:
        message = f"the OpenID provider cannot start: {error} (pip install oidc-provider-mock)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI must test single sign-on", pytrace=False)
        pytest.skip(message)
    return oidc_provider_mock


@pytest.fixture(scope="session")
def oidc_provider() -> Iterator[Provider]:
    """The suite's OpenID provider (ID tokens live an hour)."""
    with running_provider() as provider:
        yield provider


@pytest.fixture(scope="session")
def expired_oidc_provider() -> Iterator[Provider]:
    """A provider whose ID tokens expired five minutes before they were issued."""
    with running_provider(access_token_max_age=timedelta(minutes=-5)) as provider:
        yield provider
