"""The API on both databases (the fixtures of tests/service), for the fuzz tests."""

from tests.service.api.conftest import (  # noqa: F401
    client,
    send_evalset,
    send_model,
    settings,
    upload_evalset,
    upload_model,
)
from tests.service.conftest import (  # noqa: F401
    database_url,
    engine,
    no_flipgate_environment,
    npz_file,
    onnx_file,
)
