"""The ready-made operations under deploy/: Prometheus' scrape config and alert rules pass
`promtool` (Debian's prometheus package; scripts/dev.py installs it, and CI must have it),
each alert fires on its fault in promtool's rule tests, every figure the alerts and the
Grafana dashboard query is one that /metrics answers, and compose's Prometheus is off unless
its profile is asked for."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.config import Settings
from service.main import create_app
from service.migrate import upgrade

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "flipgate.json"
TOKEN = "deploy-admin-token-0123456789"
FIGURE = re.compile(r"\bflipgate_\w+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        message = "promtool is missing: apt-get install --no-install-recommends prometheus"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI must check deploy/prometheus)", pytrace=False)
        pytest.skip(message)
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=PROMETHEUS,
                          timeout=60)


@pytest.mark.parametrize("check", [("check", "config", "--syntax-only", "prometheus.yml"),
                                   ("check", "rules", "alerts.yml"),
                                   ("test", "rules", "alerts_test.yml")],
                         ids=["scrape config", "alert rules", "alert rule tests"])
def test_promtool_passes_the_prometheus_files(check):
    result = promtool(*check)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def exposed(tmp_path_factory) -> set[str]:
    """Every sample name /metrics can answer (a counter's _total, a histogram's _bucket...),
    from an app's scrape."""
    folder = tmp_path_factory.mktemp("deploy")
    settings = Settings(database_url=f"sqlite:///{folder / 'db.sqlite'}", data_dir=folder,
                        admin_token=TOKEN)
    upgrade(settings)
    with TestClient(create_app(settings)) as client:
        client.get("/models", headers={"Authorization": f"Bearer {TOKEN}"})
        page = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    return {family.name + suffix for family in text_string_to_metric_families(page)
            for suffix in SUFFIXES.get(family.type, ("",))}


def queried(text: str) -> set[str]:
    return set(FIGURE.findall(text))


def test_the_alerts_and_the_dashboard_query_only_figures_that_exist(exposed):
    alerts = queried(" ".join(rule["expr"] for group in yaml.safe_load(
        (PROMETHEUS / "alerts.yml").read_text())["groups"] for rule in group["rules"]))
    dashboard = queried(" ".join(target["expr"] for panel in json.loads(DASHBOARD.read_text())[
        "panels"] for target in panel["targets"]))
    assert len(alerts) >= 6 and len(dashboard) >= 15
    assert (alerts | dashboard) - exposed == set()


def test_compose_scrapes_the_api_only_in_the_monitoring_profile():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    prometheus = compose["services"]["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["api:8000"]
    assert job["authorization"]["credentials_file"] == "/run/secrets/metrics_token"
    assert compose["secrets"]["metrics_token"] == {"environment": "FLIPGATE_METRICS_TOKEN"}
