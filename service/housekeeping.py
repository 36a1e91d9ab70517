"""Keeping the artifact store tidy: partial files that no upload is writing any more, and
artifacts that no row references (reported by `flipgate store check`, removed by
`flipgate store gc`); and copying one store into another (`flipgate store migrate`)."""

import time
from dataclasses import dataclass

from sqlalchemy import select, union
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
    """What `flipgate store check` finds: artifacts without a row, rows without an artifact."""

    unreferenced: list[str]
    missing: list[str]


def referenced_artifacts(*, session: Session) -> set[str]:
    """The address of every artifact some row points at."""
    statement = union(*(select(column.label("sha256")).where(column.is_not(None))
                        for column in ARTIFACT_COLUMNS))
    return set(session.scalars(statement))


def check_store(*, session: Session, store: ArtifactStore) -> StoreReport:
    """Compare the store with the rows that reference it."""
    stored, referenced = set(store.addresses()), referenced_artifacts(session=session)
    return StoreReport(sorted(stored - referenced), sorted(referenced - stored))


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
