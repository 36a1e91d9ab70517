"""The dashboard on a line of external versions (labels only, tests/service/api/
test_external_versions_api.py): the line page's matrix and the pair page's report and flips
as for any version."""

import re

import numpy as np
import pytest

from tests.service.api.conftest import measure, run_task
from tests.service.api.test_external_versions_api import (  # noqa: F401
    WINE_EVAL,
    external_line,
    wine,
)


@pytest.fixture
def measured(client, external_line):  # noqa: F811
    """The wine line's matrix and its prompt-v1 → api-v2 report, stored."""
    queued = client.post("/models/wine/matrix", params={"evalset": WINE_EVAL}).json()
    run_task(client, queued["missing"][0]["job_id"])
    measure(client, "wine:prompt-v1", "wine:api-v2", WINE_EVAL)
    return external_line


def test_line_and_pair_pages_show_external_versions(measured, signed_in):
    old, new, y = (measured.predictions["prompt-v1"], measured.predictions["api-v2"],
                   measured.labels)
    line = signed_in.get("/ui/lines/wine")
    assert line.status_code == 200 and "prompt-v1" in line.text and "api-v2" in line.text
    cell = re.search(r'data-old="prompt-v1" data-new="api-v2" data-value="([^"]+)"', line.text)
    assert cell and float(cell.group(1)) == pytest.approx(float(((old == y) & (new != y)).mean()))
    pair = signed_in.get(f"/ui/lines/wine/pairs/prompt-v1/api-v2?evalset={WINE_EVAL}")
    assert pair.status_code == 200 and "<h2>Headline</h2>" in pair.text
    assert "predicted labels only" in pair.text
    assert f"{int(((old == y) & (new != y)).sum())}" in pair.text
    assert np.flatnonzero((old == y) & (new != y)).size > 0
