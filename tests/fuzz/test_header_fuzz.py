"""Every header, cookie and signature field the server reads, fuzzed with any bytes an HTTP
server passes on (HTAB, visible ASCII and obs-text 0x80-0xFF): the bearer token, the
dashboard's session cookie and its Origin check, the gate's and MLflow's signature headers,
Content-Type and Content-Length. Every answer is a 4xx (or the success the request would be)
with a machine-readable code on the API, never a 500, a traceback or a server path, and a
refusal leaves the database and the artifact store as they were.

Requests go straight to the ASGI app: an HTTP client would normalise the header bytes."""

import base64
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import hypothesis
import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from pydantic import SecretStr

from flipgate.signing import HEADER, signature
from service.ui.session import COOKIE
from tests.fuzz.test_hand_cases import row_counts, stored_files
from tests.service.api.conftest import ADMIN_TOKEN

FUZZ = hypothesis.settings(max_examples=40, derandomize=True, deadline=None, database=None,
                           suppress_health_check=list(HealthCheck),
                           phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate])
FIELD_BYTES = [9, *range(0x20, 0x7F), *range(0x80, 0x100)]  # what h11 and httptools pass on
CODE = re.compile(r"^[a-z][a-z0-9_]*$")
MLFLOW_SECRET = "mlflow-fuzz-secret"
GATE_BODY = json.dumps({"model": "digits", "candidate": "1"}).encode()

field = st.lists(st.sampled_from(FIELD_BYTES), max_size=80).map(bytes)
text = st.text(st.characters(codec="utf-8", exclude_categories=["Cc", "Cs"]), max_size=40) \
    .map(str.encode)
odd = st.one_of(field, text, st.sampled_from([b"", b" ", b" " * 300, b"\t", "²".encode(
    "latin-1"), "١٢٣".encode(), b"-1", b"+5", b"0x10", b"1e3", b"9" * 40, b"\xff" * 3]))


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


def call(client, method: str, path: str, headers: list[tuple[bytes, bytes]],
         body: bytes = b"", host: bytes = b"testserver") -> Answer:
    """One request straight to the app, header values as raw bytes."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
             "server": ("testserver", 80), "headers": [(b"host", host), *headers]}
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return pending.pop() if pending else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    client.portal.call(client.app, scope, receive, send)
    start = next(message for message in sent if message["type"] == "http.response.start")
    return Answer(start["status"], dict(start["headers"]),
                  b"".join(message.get("body", b"") for message in sent[1:]))


def snapshot(client) -> tuple:
    return row_counts(client), stored_files(client)


def check(client, answer: Answer, before: tuple, *, ok: set[int], api: bool = True) -> None:
    """A success from `ok`, or a 4xx (with the API's error shape) that changed nothing; no
    traceback or server path either way."""
    text = answer.body.decode("utf-8", "replace")
    assert answer.status < 500, text
    assert "Traceback" not in text and 'File "' not in text
    assert str(client.app.state.settings.data_dir) not in text
    if answer.status in ok:
        return
    assert 400 <= answer.status < 500 or (not api and answer.status == 303), text
    if api:
        error = json.loads(answer.body)["error"]
        assert set(error) == {"code", "message"} and CODE.match(error["code"]), text
    assert snapshot(client) == before


@pytest.fixture
def world(client, upload_model, upload_evalset, npz_file) -> dict:
    """The line `digits` (version 1, a webhook secret), an eval set, MLflow's secret set."""
    assert upload_model("digits", "1").status_code == 201
    assert upload_evalset("eval", npz_file(n=12)).status_code == 201
    secret = client.post("/models/digits/webhook-secret").json()["secret"]
    client.app.state.settings.mlflow_webhook_secret = SecretStr(MLFLOW_SECRET)
    return {"secret": secret, "npz": npz_file(n=12, seed=3).read_bytes()}


tokens = st.one_of(odd, st.builds(lambda cut: ADMIN_TOKEN.encode()[:cut],
                                  st.integers(0, len(ADMIN_TOKEN) - 1)),
                   st.builds(lambda tail: ADMIN_TOKEN.encode() + tail, odd))
authorization = st.one_of(odd, st.builds(lambda scheme, token: scheme + token, st.sampled_from(
    [b"Bearer ", b"bearer  ", b"Bearer\t", b"Basic ", b"Bearer " + b" " * 50]), tokens))


def session_cookie(key: str, payload: bytes) -> bytes:
    """A cookie of the dashboard's form, `payload` signed with `key`."""
    encoded = base64.urlsafe_b64encode(payload)
    return encoded + b"." + hmac.new(key.encode(), encoded, hashlib.sha256).hexdigest().encode()


payloads = st.one_of(odd, st.builds(lambda sub, exp, sid: json.dumps(
    {"sub": sub, "exp": exp, "sid": sid}).encode(),
    st.one_of(st.text(max_size=20), st.integers(), st.none(), st.just("admin")),
    st.one_of(st.integers(-2**70, 2**70), st.floats(), st.just(time.time() + 3600),
              st.text(max_size=5)),
    st.one_of(st.text(max_size=40), st.integers(), st.lists(st.integers(), max_size=2))))


def cookies(session_key: str):
    """Garbage, a cookie signed with another key, and one signed with the server's key over
    any payload (other subjects, session ids and expiries)."""
    return st.one_of(odd, st.builds(session_cookie, st.just("another key"), payloads),
                     st.builds(session_cookie, st.just(session_key), payloads),
                     st.builds(lambda cookie, cut: cookie[:cut],
                               st.builds(session_cookie, st.just(session_key), payloads),
                               st.integers(0, 100)))


def case(cookie: bytes, origin: bytes | None, target: tuple[str, str], *,
         source: bytes = b"origin", host: bytes = b"testserver") -> example:
    """An explicit example of the session test (the sources and hosts have defaults)."""
    return example(cookie=cookie, origin=origin, target=target, source=source, host=host)


def test_the_session_cookie_and_origin(client, world):
    key = client.app.state.settings.session_key.get_secret_value()

    def signed(payload: dict) -> bytes:
        return session_cookie(key, json.dumps(payload).encode())

    @FUZZ
    @given(cookie=cookies(key), origin=st.one_of(st.none(), odd, st.sampled_from(
        [b"http://[", b"http://testserver", b"http://[::1", b"http://a:99999"])),
           target=st.sampled_from([("GET", "/ui"), ("GET", "/ui/jobs"),
                                   ("POST", "/ui/signout"), ("POST", "/ui/signin")]),
           source=st.sampled_from([b"origin", b"referer"]),
           host=st.one_of(st.just(b"testserver"), odd, st.just(b"[")))
    @case(b"", None, ("GET", "/ui/jobs"), host=b"[")
    @case(b"e30=.\xe9", None, ("GET", "/ui"))
    @case(signed({"sub": "9" * 40, "exp": 2**40, "sid": ""}), None, ("GET", "/ui"))
    @case(session_cookie(key, b'{"sub": "1", "exp": 1e400, "sid": ""}'), None, ("GET", "/ui"))
    @case(signed({"sub": "1", "exp": 10**20, "sid": ""}), None, ("POST", "/ui/signout"))
    @case(b"", b"http://[", ("POST", "/ui/signin"))
    @case(b"", b"http://[", ("POST", "/ui/signout"), source=b"referer")
    def send(cookie: bytes, origin: bytes | None, target: tuple[str, str], source: bytes,
             host: bytes) -> None:
        before = snapshot(client)
        body = b"token=" + cookie[:20] if target[1] == "/ui/signin" else b""
        headers = [(b"cookie", COOKIE.encode() + b"=" + cookie),
                   (b"content-type", b"application/x-www-form-urlencoded"),
                   (b"content-length", str(len(body)).encode())]
        headers += [] if origin is None else [(source, origin)]
        answer = call(client, *target, headers, body, host)
        # a sign-out records the session it ended; a sign-in is throttled after failures
        changes = target[1] == "/ui/signout" and answer.status == 303
        check(client, answer, snapshot(client) if changes else before, ok={200}, api=False)

    send()


def signature_headers(secret: str):
    """Signature headers: garbage, fields of any bytes, a stale or wrong digest, a valid one."""
    now = int(time.time())
    return st.one_of(
        odd,
        st.builds(lambda t, v: b"t=" + t + b",v1=" + v, odd, odd),
        st.builds(lambda t, v: f"t={t},v1=".encode() + v, st.just(now), odd),
        st.just(signature(secret, GATE_BODY, now - 10_000).encode()),
        st.just(signature(secret, GATE_BODY).encode()),
        st.builds(lambda extra: signature(secret, GATE_BODY).encode() + extra, odd))


def test_the_gate_signature_and_delivery(client, world):
    @FUZZ
    @given(value=signature_headers(world["secret"]), delivery=st.one_of(st.none(), odd))
    @example(value=b"t=\xb2,v1=00", delivery=None)
    def send(value: bytes, delivery: bytes | None) -> None:
        before = snapshot(client)
        headers = [(HEADER.lower().encode(), value), (b"content-type", b"application/json"),
                   (b"content-length", str(len(GATE_BODY)).encode())]
        headers += [] if delivery is None else [(b"x-flipgate-delivery", delivery)]
        check(client, call(client, "POST", "/gate", headers, GATE_BODY), before,
              ok={200, 202})

    send()


def mlflow_signature(delivery: bytes, timestamp: bytes, body: bytes) -> bytes:
    digest = hmac.new(MLFLOW_SECRET.encode(), delivery + b"." + timestamp + b"." + body,
                      hashlib.sha256).digest()
    return b"v1," + base64.b64encode(digest)


def test_the_mlflow_webhook_headers(client, world):
    body = json.dumps({"entity": "webhook", "action": "test"}).encode()
    now = str(int(time.time())).encode()

    @FUZZ
    @given(delivery=odd, timestamp=st.one_of(odd, st.just(now)), signed=st.booleans(),
           junk=odd)
    @example(delivery=b"d", timestamp=b"\xb2", signed=False, junk=b"v1,x")  # '²' isdigit()
    def send(delivery: bytes, timestamp: bytes, signed: bool, junk: bytes) -> None:
        before = snapshot(client)
        value = mlflow_signature(delivery, timestamp, body) if signed else junk
        headers = [(b"x-mlflow-delivery-id", delivery), (b"x-mlflow-timestamp", timestamp),
                   (b"x-mlflow-signature", value), (b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        check(client, call(client, "POST", "/integrations/mlflow/webhook", headers, body),
              before, ok={200})

    send()


content_types = st.one_of(odd, st.sampled_from([
    b"application/octet-stream", b"APPLICATION/OCTET-STREAM; x=y", b"application/octet-stream;",
    b"multipart/form-data", b"multipart/form-data; boundary=", b"multipart/form-data; boundary="
    + b"x" * 300, b"application/json", b"application/x-www-form-urlencoded", b";;;", b"/"]))
lengths = st.one_of(odd, st.integers(0, 10**6).map(lambda n: str(n).encode()))


def test_content_type_and_length(client, world):
    targets: dict[str, Callable[[bytes, bytes], Answer]] = {
        "PUT an eval set": lambda kind, length: call(client, "PUT", "/evalsets/fuzzed", [
            (b"authorization", b"Bearer " + ADMIN_TOKEN.encode()), (b"content-type", kind),
            (b"content-length", length)], world["npz"]),
        "POST a model": lambda kind, length: call(client, "POST", "/models", [
            (b"authorization", b"Bearer " + ADMIN_TOKEN.encode()), (b"content-type", kind),
            (b"content-length", length)], b"name=x&version=1"),
        "POST /gate signed": lambda kind, length: call(client, "POST", "/gate", [
            (HEADER.lower().encode(), signature(world["secret"], GATE_BODY).encode()),
            (b"content-type", kind), (b"content-length", length)], GATE_BODY),
    }

    @FUZZ
    @given(target=st.sampled_from(sorted(targets)), kind=content_types, length=lengths)
    @example(target="POST a model", kind=b"application/octet-stream", length=b"\xb2")
    def send(target: str, kind: bytes, length: bytes) -> None:
        before = snapshot(client)
        check(client, targets[target](kind, length), before, ok={200, 201, 202})

    send()


def test_the_bearer_token(client, world):
    @FUZZ
    @given(value=authorization, method=st.sampled_from(["GET", "POST"]))
    def send(value: bytes, method: str) -> None:
        before = snapshot(client)
        body = b"name=x" if method == "POST" else b""
        answer = call(client, method, "/models", [
            (b"authorization", value), (b"content-type", b"application/x-www-form-urlencoded"),
            (b"content-length", str(len(body)).encode())], body)
        check(client, answer, before, ok={200})

    send()
