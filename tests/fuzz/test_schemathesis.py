"""A bounded, deterministic schemathesis run against the app in-process (ASGI), on SQLite
and on PostgreSQL: no 5xx, every status documented in the OpenAPI schema, every body and
content type matching it, invalid requests refused."""

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode
from schemathesis.openapi import from_asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.service.api.conftest import ADMIN_TOKEN, bearer

pytestmark = pytest.mark.slow
EXAMPLES_PER_OPERATION = 24  # valid and invalid requests: about a minute per backend
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection]
FUZZ_SETTINGS = hypothesis.settings(
    max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
    suppress_health_check=list(HealthCheck), phases=[hypothesis.Phase.generate])


def fuzz(operation, failures: dict[str, str]) -> None:
    """Send an operation's generated requests; record each distinct failure with one
    request that shows it."""
    requests = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                         operation.as_strategy(GenerationMode.NEGATIVE))

    @FUZZ_SETTINGS
    @given(case=requests)
    def send(case) -> None:
        checks = CHECKS[:-1] if negates_only_the_token(case) else CHECKS
        try:
            case.call_and_validate(headers=bearer(ADMIN_TOKEN), checks=checks)
        except (Failure, FailureGroup) as failed:
            for failure in getattr(failed, "exceptions", (failed,)):
                failures.setdefault(f"{operation.label}: {failure.title}",
                                    f"{failure}\n{case.as_curl_command()}")

    send()


def negates_only_the_token(case) -> bool:
    """Whether a negative case negated the headers of an operation that declares none but the
    bearer token: every request carries the token, so what is sent is not the negated case
    (schemathesis still judges it as one)."""
    header = case.meta.components.get(ParameterLocation.HEADER)
    declared = [parameter for parameter in case.operation.headers
                if "x-original-security-type" not in parameter.definition]  # not the token's
    return bool(header and header.mode.is_negative and not declared)


def test_api_answers_as_documented(client):
    schema = from_asgi("/openapi.json", client.app)
    failures: dict[str, str] = {}
    for result in schema.get_all_operations():
        fuzz(result.ok(), failures)
    assert not failures, "\n\n".join(failures.values())
