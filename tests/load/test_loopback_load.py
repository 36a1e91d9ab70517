"""200 clients with `read` and `gate` tokens hold a real `flipgate serve` on SQLite over
loopback (benchmarks/gate_bench.py's --hold run, shortened): nothing times out, every
request is answered, and /healthz answers during the load and right after it."""

import tempfile
from pathlib import Path

import pytest

from benchmarks.gate_bench import client_tokens, hold, measured_pair, mixed_requests, server
from flipgate.processes import free_port
from service.config import Settings

pytestmark = [pytest.mark.slow, pytest.mark.serial]
CLIENTS, SECONDS, CLIENT_PROCESSES = 200, 10, 2


def test_200_clients_on_sqlite_get_answers_and_healthz_stays_up(monkeypatch):
    for name in ("FLIPGATE_DATABASE_URL", "FLIPGATE_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    with tempfile.TemporaryDirectory(prefix="load-") as folder:
        settings = Settings(data_dir=Path(folder), database_url="")
        tokens = client_tokens(settings)
        with server(settings, free_port()) as url:
            assert measured_pair(url, tokens["gate"], settings)["verdict"] != "pending"
            result = hold(url, mixed_requests(tokens), clients=CLIENTS, seconds=SECONDS,
                          processes=CLIENT_PROCESSES)
    statuses = result.run.statuses
    assert result.timeouts == 0 and result.unanswered == 0, statuses
    assert set(statuses) <= {200, 503}, statuses  # served, or refused as busy
    assert statuses[200] > 0, statuses
    assert all(latency is not None for latency in result.probes_during), result.probes_during
    assert all(latency is not None for latency in result.probes_after), result.probes_after
