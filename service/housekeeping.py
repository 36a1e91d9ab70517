"""Keeping the artifact store tidy: partial files that no upload is writing any more (swept
by each host's processes in turn, and in a shared bucket by one sweeper of the deployment),
artifacts that no row references and unfinished uploads (reported by `flipgate store check`,
removed by `flipgate store gc`); and copying one store into another (`flipgate store
migrate`)."""

import hashlib
import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, select, text, union
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import InstrumentedAttribute, Session

from flipgate.progress import Progress
from service.compare.models import PairMetrics
from service.datasets.models import Dataset, DatasetLabels
from service.errors import StorageUnavailable
from service.predictions.models import Prediction
from service.registry.models import ModelVersion
from service.storage import ArtifactStore

# Every column that holds the address of an artifact. A new one must be added here, or gc
# would take its artifacts for garbage (tests/service/test_housekeeping.py checks the schema).
ARTIFACT_COLUMNS: tuple[InstrumentedAttribute[str], ...] = (
    ModelVersion.artifact_sha256, Dataset.sha256, Prediction.logits_sha256,
    Prediction.classes_sha256, PairMetrics.html_sha256, PairMetrics.export_sha256,
    DatasetLabels.sha256)


@dataclass(frozen=True)
class StoreReport:
    """What `flipgate store check` finds: artifacts without a row, rows without an artifact,
    and what uploads under way or abandoned hold (each with when it began)."""

    unreferenced: list[str]
    missing: list[str]
    unfinished: list[tuple[str, float]]


def referenced_artifacts(*, session: Session) -> set[str]:
    """The address of every artifact some row points at."""
    statement = union(*(select(column.label("sha256")).where(column.is_not(None))
                        for column in ARTIFACT_COLUMNS))
    return set(session.scalars(statement))


def check_store(*, session: Session, store: ArtifactStore) -> StoreReport:
    """Compare the store with the rows that reference it."""
    stored, referenced = set(store.addresses()), referenced_artifacts(session=session)
    return StoreReport(sorted(stored - referenced), sorted(referenced - stored),
                       sorted(store.unfinished_uploads(), key=lambda upload: upload[1]))


class SharedSweep:
    """Which sweeper sweeps the uploads a shared store holds (`sweep_shared`): on
    PostgreSQL, the one that holds the store's advisory lock, on a connection it keeps (a
    sweeper that dies frees it, and another takes it at its next try); on SQLite, whose
    deployment is one host, any."""

    def __init__(self, engine: Engine, store_url: str) -> None:
        digest = hashlib.sha256(f"flipgate sweep {store_url}".encode()).digest()
        self.engine, self.key = engine, int.from_bytes(digest[:8], "big", signed=True)
        self.connection: Connection | None = None

    def leads(self) -> bool:
        """Whether this sweeper holds the lock now (taken if it is free)."""
        if self.engine.dialect.name == "sqlite":
            return True
        try:
            if self.connection is None:
                self.connection = self._locked_connection()
            else:
                self.connection.scalar(text("select 1"))  # the session holding it lives
                self.connection.commit()
        except DBAPIError:
            self.release()
        return self.connection is not None

    def _locked_connection(self) -> Connection | None:
        """A connection whose session holds the lock; None when another one holds it."""
        connection = self.engine.connect()
        try:
            taken = connection.scalar(text("select pg_try_advisory_lock(:key)"),
                                      {"key": self.key})
            connection.commit()  # the lock is the session's: no transaction is left open
        except BaseException:
            connection.close()
            raise
        if taken:
            return connection
        connection.close()
        return None

    def release(self) -> None:
        """Let the lock go (with the connection that holds it)."""
        if self.connection is not None:
            self.connection.invalidate()
            self.connection = None


def sweep_abandoned_uploads(*, store: ArtifactStore, idle_seconds: float,
                            shared: SharedSweep | None = None) -> list[str]:
    """Remove the files of uploads that stopped writing `idle_seconds` ago on this host
    (once per half period per staging folder), and what they left in the shared store when
    this process is its sweeper; what was removed."""
    swept = store.sweep_local_when_due(idle_seconds)
    if shared is not None and shared.leads():
        swept += store.sweep_shared(idle_seconds)
    return swept


def collect_garbage(*, session: Session, store: ArtifactStore,
                    min_age_seconds: float) -> list[str]:
    """Delete the unreferenced artifacts older than `min_age_seconds` (a younger one may
    belong to a registration whose transaction has not committed yet); what was deleted."""
    cutoff, stored = time.time() - min_age_seconds, dict(store.entries())
    referenced = referenced_artifacts(session=session)
    garbage = sorted(sha256 for sha256, stored_at in stored.items()
                     if sha256 not in referenced and stored_at < cutoff)
    store.remove(garbage)
    return garbage


@dataclass(frozen=True)
class MigrationReport:
    """What `flipgate store migrate` did: artifacts copied, found there already, and those
    whose local bytes do not match their address (not copied)."""

    copied: list[str]
    present: list[str]
    corrupt: list[str]


def migrate_store(*, source: ArtifactStore, target: ArtifactStore,
                  progress: Progress) -> MigrationReport:
    """Copy every artifact of `source` that `target` lacks, each verified against its digest
    first (a bundle as one artifact); run again, it copies only what is left (every write is
    conditional, so a copy cut short is never an artifact)."""
    addresses, report = sorted(source.addresses()), MigrationReport([], [], [])
    for done, sha256 in enumerate(addresses, start=1):
        if target.exists(sha256):
            report.present.append(sha256)
        elif _copied(source, target, sha256):
            report.copied.append(sha256)
        else:
            report.corrupt.append(sha256)
        progress(done, len(addresses))
    return report


def _copied(source: ArtifactStore, target: ArtifactStore, sha256: str) -> bool:
    """Copy one artifact; False (nothing copied) when its bytes in `source` are not its
    address."""
    try:
        source.copy_to(target, sha256)
    except StorageUnavailable as error:
        if error.code != "artifact_corrupt":
            raise
        return False
    return True
