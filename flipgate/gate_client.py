"""The client side of the deploy gate: ask POST /gate, wait for a final verdict, describe it.

Torch-free on purpose: a CI job needs only httpx to call the gate.
"""

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO
from urllib.parse import urljoin

from flipgate.errors import InputError
from flipgate.reporting.rows import fmt_pct
from flipgate.signing import signature

if TYPE_CHECKING:
    import httpx

RETRIES = 3
BACKOFF_SECONDS = 0.5
REQUEST_TIMEOUT_SECONDS = 60.0
EXIT_CODES = {"approve": 0, "block": 1}
LABELS_NEEDED_EXIT = 4  # pending until people label a traffic set's disagreements
CI_FIELDS = ("provider", "repo", "sha", "ref", "run_url")

PendingCallback = Callable[[dict, float], None]


class GateTimeout(Exception):
    """The decision was still pending when the client stopped waiting."""

    def __init__(self, seconds: float, decision_id: int) -> None:
        super().__init__(f"still pending after {seconds:g} s; decision {decision_id}")
        self.decision_id = decision_id


@dataclass(frozen=True)
class Credentials:
    """A bearer token (scope gate), a line's webhook secret, or both; and the project the
    caller acts in, for one that may act in several (sent as ?project=)."""

    token: str | None = None
    secret: str | None = None
    project: str | None = None

    def headers(self, body: bytes | None = None) -> dict[str, str]:
        """The auth headers of a request; the signature covers `body` when there is one."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if self.secret and body is not None:
            headers["X-Flipgate-Signature-256"] = signature(self.secret, body)
        return headers

    def params(self) -> dict[str, str]:
        """The query parameters every request of the caller carries."""
        return {"project": self.project} if self.project else {}


def ci_from_environment(env: Mapping[str, str]) -> dict[str, str | None]:
    """Where the run comes from, read from GitHub Actions or GitLab CI variables."""
    if env.get("GITHUB_ACTIONS") == "true":
        run_url = None
        if all(env.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")):
            run_url = (f"{env['GITHUB_SERVER_URL']}/{env['GITHUB_REPOSITORY']}/actions/runs/"
                       f"{env['GITHUB_RUN_ID']}")
        return {"provider": "github", "repo": env.get("GITHUB_REPOSITORY"),
                "sha": env.get("GITHUB_SHA"), "ref": env.get("GITHUB_REF"), "run_url": run_url}
    if env.get("GITLAB_CI") == "true":
        return {"provider": "gitlab", "repo": env.get("CI_PROJECT_PATH"),
                "sha": env.get("CI_COMMIT_SHA"), "ref": env.get("CI_COMMIT_REF_NAME"),
                "run_url": env.get("CI_JOB_URL")}
    return {}


def ci_context(given: Mapping[str, str | None], env: Mapping[str, str]) -> dict | None:
    """The request's `ci` object: fields given on the command line win over the CI's own."""
    detected = ci_from_environment(env)
    merged = {field: given.get(field) or detected.get(field) for field in CI_FIELDS}
    return {field: value for field, value in merged.items() if value} or None


def encode(request: dict) -> bytes:
    """The exact bytes that are signed and sent."""
    return json.dumps(request, separators=(",", ":")).encode()


class GateClient:
    """POST /gate and GET /gate/decisions/{id} on one server, retrying transport errors and
    5xx answers with exponential backoff; 4xx answers raise InputError with the server's
    error code and message."""

    def __init__(self, http: "httpx.Client", credentials: Credentials, *, retries: int = RETRIES,
                 backoff: float = BACKOFF_SECONDS) -> None:
        self.http = http
        self.credentials = credentials
        self.retries = retries
        self.backoff = backoff

    def post_gate(self, body: bytes, delivery: str) -> dict:
        """The decision on a request; the same delivery id always answers the same decision."""
        headers = {"Content-Type": "application/json", "X-Flipgate-Delivery": delivery,
                   **self.credentials.headers(body)}
        return as_decision(self._send("POST", "/gate", content=body, headers=headers))

    def get_decision(self, decision_id: int) -> dict:
        """A decision's current state."""
        return as_decision(self._send("GET", f"/gate/decisions/{decision_id}",
                                      headers=self.credentials.headers()))

    def post_json(self, url: str, payload: dict) -> dict:
        """The JSON answer of POSTing `payload` to `url` with the credentials' token."""
        return self._send("POST", url, json=payload, headers=self.credentials.headers())

    def post_form(self, url: str, fields: dict, files: dict) -> dict:
        """The JSON answer of POSTing a multipart form to `url` with the credentials' token."""
        return self._send("POST", url, data=fields, files=files,
                          headers=self.credentials.headers())

    def get_json(self, url: str) -> dict:
        """The JSON answer of GET `url` with the credentials' token."""
        return self._send("GET", url, headers=self.credentials.headers())

    def _send(self, method: str, url: str, **options) -> dict:
        """The JSON body of the first answer that is not a transport error or a 5xx."""
        import httpx

        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self.http.request(method, url, params=self.credentials.params(),
                                             **options)
            except httpx.TransportError as error:
                failure = InputError("unreachable", f"cannot reach {self.http.base_url}: "
                                       f"{error or type(error).__name__}")
                continue
            if response.status_code < 500:
                return answer(response)
            failure = refusal(response)
        raise failure


def answer(response: "httpx.Response") -> dict:
    """The JSON object of a 2xx answer; a 4xx raises its error as InputError."""
    return json_answer(response.status_code, response.content, response.reason_phrase,
                       str(response.request.url))


def json_answer(status: int, body: bytes, reason: str, url: str) -> dict:
    """The JSON object of a 2xx answer `body` from `url`; a 4xx raises its error."""
    if status >= 400:
        raise refusal_of(status, body, reason)
    try:
        return json.loads(body)
    except ValueError as error:
        raise InputError("invalid_response", f"{url} answered {status} without JSON") from error


def as_decision(body: dict) -> dict:
    """`body` once it looks like a decision: a JSON object with an id and a known verdict."""
    if not (isinstance(body, dict) and "decision_id" in body
            and body.get("verdict") in (*EXIT_CODES, "pending")):
        raise InputError("invalid_response", f"the server's answer is not a decision: "
                           f"{json.dumps(body)[:300]}")
    return body


def refusal(response: "httpx.Response") -> InputError:
    """The server's `{"error": {"code", "message"}}` (or the raw body) as InputError."""
    return refusal_of(response.status_code, response.content, response.reason_phrase)


def refusal_of(status: int, body: bytes, reason: str) -> InputError:
    """An error answer's `{"error": {"code", "message"}}` (or its raw body) as InputError."""
    try:
        error = json.loads(body)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", body.decode("utf-8", "replace").strip()[:300] or reason
    return InputError(code, f"HTTP {status} {code}: {message}")


def decide(client: GateClient, request: dict, delivery: str, *, timeout: float, poll: float,
           on_pending: PendingCallback | None = None) -> dict:
    """The final decision on `request`, polled every `poll` seconds until `timeout`; a
    decision pending on labels (`labels_needed`: no job can settle it) is returned at once.

    With a token the decision is polled by id; with only a webhook secret the same signed
    body is posted again under the same delivery id, which answers the same decision. The
    request names the credentials' project, if they name one.
    """
    project = client.credentials.project
    body = encode({**request, "project": project} if project else request)
    start = time.monotonic()
    decision = client.post_gate(body, delivery)
    while decision["verdict"] == "pending" and not decision.get("labels_needed"):
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            raise GateTimeout(timeout, decision["decision_id"])
        if on_pending:
            on_pending(decision, elapsed)
        time.sleep(min(poll, timeout - elapsed))
        decision = (client.get_decision(decision["decision_id"]) if client.credentials.token
                    else client.post_gate(body, delivery))
    return with_absolute_links(decision, str(client.http.base_url))


def with_absolute_links(decision: dict, server: str) -> dict:
    """The decision with its report links joined to the server's address (a server without
    FLIPGATE_PUBLIC_URL writes them relative to itself)."""
    def absolute(link: str | None) -> str | None:
        return link and urljoin(server.rstrip("/") + "/", link)

    metrics = {evalset: numbers and {**numbers, "report_url": absolute(numbers.get("report_url"))}
               for evalset, numbers in decision.get("metrics", {}).items()}
    reasons = [{**reason, "export_url": absolute(reason["export_url"])}
               if reason.get("export_url") else reason for reason in decision.get("reasons", [])]
    return {**decision, "report_url": absolute(decision.get("report_url")), "metrics": metrics,
            "reasons": reasons}


def http_client(server: str, timeout: "float | httpx.Timeout") -> "httpx.Client":
    """An HTTP client of `server`. httpx is imported here, not with the package: the commands
    that call no server (compare, --help) do not wait for it."""
    import httpx

    return httpx.Client(base_url=server, timeout=timeout)


def ask(server: str, request: dict, credentials: Credentials, *, delivery: str | None,
        timeout: float, poll: float, on_pending: PendingCallback | None = None) -> dict:
    """The final decision of the gate at `server` on `request`; with no delivery id, a
    random one keeps the retries of this call idempotent."""
    with http_client(server, REQUEST_TIMEOUT_SECONDS) as http:
        return decide(GateClient(http, credentials), request, delivery or str(uuid.uuid4()),
                      timeout=timeout, poll=poll, on_pending=on_pending)


def status_printer(stream: TextIO, every_seconds: float = 10) -> PendingCallback:
    """A pending callback that writes the decision and the time waited to `stream`, at most
    once per `every_seconds`."""
    printed_at: list[float] = []

    def show(decision: dict, elapsed: float) -> None:
        if printed_at and elapsed - printed_at[-1] < every_seconds:
            return
        printed_at.append(elapsed)
        jobs = ", ".join(map(str, decision.get("waiting_for", []))) or "none"
        print(f"decision {decision['decision_id']} pending after {elapsed:.0f} s "
              f"(waiting for jobs {jobs})", file=stream, flush=True)

    return show


def metrics_line(evalset: str, metrics: Mapping) -> str:
    """NFR, churn, error rate old → new and McNemar's p on one eval set."""
    parts = [f"NFR {fmt_pct(metrics.get('nfr'))}"]
    if metrics.get("negative_flips") is not None and metrics.get("n"):
        parts[0] += f" ({metrics['negative_flips']} of {metrics['n']})"
    parts.append(f"churn {fmt_pct(metrics.get('churn'))}")
    parts.append(f"ER {fmt_pct(metrics.get('er_old'))} → {fmt_pct(metrics.get('er_new'))}")
    if metrics.get("mcnemar_p") is not None:
        parts.append(f"McNemar p {metrics['mcnemar_p']:.3g}")
    return f"  {evalset}: " + ", ".join(parts)


def describe(decision: Mapping) -> list[str]:
    """A decision for people: verdict, the pair, every reason, the metrics, the report."""
    model = decision["model"]
    baseline = (f"{model}:{decision['baseline']}" if decision.get("baseline")
                else "no baseline (first version of the line)")
    policy = decision.get("policy_version")
    lines = [f"{decision['verdict'].upper()}: {model}:{decision['candidate']} against "
             f"{baseline} (decision {decision['decision_id']}, "
             f"policy {'v' + str(policy) if policy else 'default'})"]
    lines += [f"  {'[blocking]' if reason.get('blocking') else '[note]'} {reason['message']}"
              for reason in decision.get("reasons", [])]
    lines += [metrics_line(evalset, metrics)
              for evalset, metrics in decision.get("metrics", {}).items() if metrics]
    lines += [f"  label {reason['labels_needed']} disagreements of {evalset} "
              f"(about {reason['labels_to_decide']} would decide): {reason['export_url']}"
              for evalset, reason in _waiting_sets(decision).items()]
    if decision.get("report_url"):
        lines.append(f"  report: {decision['report_url']}")
    return lines


def _waiting_sets(decision: Mapping) -> dict[str, Mapping]:
    """The traffic sets a decision waits on, each with its pending reason that needs the
    most labels to decide (several limits may wait on one set)."""
    waiting: dict[str, Mapping] = {}
    for reason in decision.get("reasons", []):
        if reason.get("export_url") and reason["labels_to_decide"] >= waiting.get(
                reason["evalset"], {}).get("labels_to_decide", -1):
            waiting[reason["evalset"]] = reason
    return waiting


def exit_code(decision: Mapping) -> int:
    """0 approve, 1 block, LABELS_NEEDED_EXIT pending until a traffic set's disagreements
    are labelled."""
    return LABELS_NEEDED_EXIT if decision["verdict"] == "pending" else EXIT_CODES[
        decision["verdict"]]
