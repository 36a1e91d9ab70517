"""`flipgate serve` whose storage refuses a write during an upload: the multipart form's
spool in TMPDIR running out of space (ENOSPC), and flipgate's own staging write over a
file-size limit (EFBIG, RLIMIT_FSIZE). Both are 507 `storage_full`, nothing stored or left.

The server runs `--api-only`: the API process is the one that spools and stages uploads, and
an embedded worker would write its own files (multiprocessing's `pymp-*` folder) into the
same TMPDIR whenever it gets to it, racing the snapshot of what the server keeps there."""

import io
import resource

import numpy as np
import pytest

from tests.e2e.conftest import served
from tests.service.api.test_storage_full import FILESYSTEM_BYTES, small_disk  # noqa: F401

TOKEN = "fg_storage-admin-token"
FILE_SIZE_LIMIT = 2 * FILESYSTEM_BYTES  # above the spool's disk: the spool fails first


def evalset_bytes(nbytes: int) -> bytes:
    rows = nbytes // 16
    buffer = io.BytesIO()
    np.savez(buffer, x=np.ones((rows, 4), np.float32), y=np.arange(rows) % 3)
    return buffer.getvalue()


def limit_file_size() -> None:
    """In the server: no file it writes may grow past FILE_SIZE_LIMIT (writes get EFBIG)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


@pytest.mark.slow
def test_storage_that_refuses_a_write_is_507_and_leaves_nothing(tmp_path, small_disk):  # noqa: F811
    with served(tmp_path, TOKEN, limit_file_size, ("--api-only",),
                TMPDIR=str(small_disk)) as (_, client):
        spool_before = sorted(small_disk.rglob("*"))  # what the server keeps there itself
        spooled = client.post("/evalsets", data={"name": "spooled"},
                              files={"data": ("e.npz", evalset_bytes(FILESYSTEM_BYTES + 4096))})
        staged = client.put("/evalsets/staged", content=evalset_bytes(FILE_SIZE_LIMIT + 4096),
                            headers={"Content-Type": "application/octet-stream"})
        for response in (spooled, staged):
            assert response.status_code == 507, response.text
            assert response.json()["error"]["code"] == "storage_full"
            assert response.headers["retry-after"] == "60"
        assert client.get("/evalsets").json() == []
        artifacts = tmp_path / "data" / "artifacts"
        assert not [path for path in artifacts.rglob("*") if path.is_file()]
        assert sorted(small_disk.rglob("*")) == spool_before
        small = client.put("/evalsets/small", content=evalset_bytes(64 << 10),
                           headers={"Content-Type": "application/octet-stream"})
        assert small.status_code == 201, small.text
