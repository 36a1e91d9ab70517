"""Failed dashboard sign-ins are counted in the database: two apps on one database (as two
API processes or hosts behind one address are) throttle a client address together, and
failures that left the window are forgotten and deleted."""

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from service.auth.models import FailedSignIn
from service.db import utcnow
from service.main import create_app
from service.ui.session import COOKIE, SIGNIN_ATTEMPTS, SIGNIN_WINDOW
from tests.service.api.conftest import ADMIN_TOKEN, store_settings
from tests.service.conftest import BACKENDS, empty_database, migrated_engine


def sign_in(client: TestClient, token: str) -> int:
    return client.post("/ui/signin", data={"token": token}, follow_redirects=False).status_code


@pytest.mark.parametrize("backend", BACKENDS)
def test_failed_sign_ins_are_throttled_across_api_processes(backend, tmp_path_factory,
                                                            tmp_path):
    with empty_database(backend, tmp_path_factory) as url, migrated_engine(url) as engine:
        settings = store_settings(engine, tmp_path)
        apps = [create_app(settings) for _ in range(2)]  # each with its own engine and pool
        with TestClient(apps[0]) as first, TestClient(apps[1]) as second, \
                TestClient(apps[1], client=("192.0.2.9", 40000)) as elsewhere:
            for attempt in range(SIGNIN_ATTEMPTS):  # alternately on either process
                assert sign_in((first, second)[attempt % 2], "fg_wrong") == 401
            for client in (first, second):
                throttled = client.post("/ui/signin", data={"token": ADMIN_TOKEN})
                assert throttled.status_code == 429 and COOKIE not in throttled.cookies
                assert 1 <= int(throttled.headers["retry-after"]) <= SIGNIN_WINDOW.seconds
            assert sign_in(elsewhere, ADMIN_TOKEN) == 303  # another address is not throttled
            with engine.begin() as connection:  # the window passes
                connection.execute(update(FailedSignIn).values(
                    failed_at=utcnow() - SIGNIN_WINDOW - timedelta(seconds=1)))
            assert sign_in(second, "fg_wrong") == 401
            with engine.connect() as connection:  # the old failures were deleted
                assert connection.scalar(select(func.count()).select_from(FailedSignIn)) == 1
            assert sign_in(first, ADMIN_TOKEN) == 303
