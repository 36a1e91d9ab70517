"""A full disk is 507 `storage_full`, with nothing half-written: the artifact store on a
small tmpfs of the test's own (mounting needs root, as CI has; elsewhere the test skips)."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from service.config import Settings
from tests.service.api.conftest import (
    ADMIN_TOKEN,
    both_ways,
    error_code,
    post_evalset,
    put_evalset,
)

FILESYSTEM_BYTES = 2 << 20
send_evalset = both_ways(post_evalset, put_evalset)  # the raw body is written in a thread


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FILESYSTEM_BYTES}", "tmpfs",
                              str(mount_point)], capture_output=True, text=True)
    if mounted.returncode:
        message = f"cannot mount a tmpfs: {mounted.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI must test a full disk)", pytrace=False)
        pytest.skip(message)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.fixture
def settings(engine, small_disk) -> Settings:
    return Settings(database_url=engine.url.render_as_string(hide_password=False),
                    data_dir=small_disk / "data", admin_token=ADMIN_TOKEN)


def test_an_upload_that_fills_the_disk_is_507_and_leaves_nothing(client, tmp_path,
                                                                upload_evalset):
    rows = FILESYSTEM_BYTES // 16 + 1000  # float32 x of 4 features: more than the disk holds
    evalset = tmp_path / "big.npz"
    np.savez(evalset, x=np.ones((rows, 4), np.float32), y=np.arange(rows) % 3)
    response = upload_evalset("big", evalset)
    assert error_code(response, 507) == "storage_full"
    assert response.headers["retry-after"] == "60"
    assert client.get("/evalsets").json() == []
    store = client.app.state.store
    assert list(store.partial_files()) == [] and not any(store.staging.glob("*/*"))
