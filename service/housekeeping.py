"""Keeping the artifact store tidy: partial files that no upload is writing any more, and
artifacts that no row references (reported by `flipgate store check`, removed by
`flipgate store gc`)."""

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select, union
from sqlalchemy.orm import InstrumentedAttribute, Session

from service.artifacts import ArtifactStore
from service.compare.models import PairMetrics
from service.datasets.models import Dataset, DatasetLabels
from service.predictions.models import Prediction
from service.registry.models import ModelVersion

# Every column that holds the address of an artifact. A new one must be added here, or gc
# would take its artifacts for garbage (tests/service/test_housekeeping.py checks the schema).
ARTIFACT_COLUMNS: tuple[InstrumentedAttribute[str], ...] = (
    ModelVersion.artifact_sha256, Dataset.sha256, Prediction.logits_sha256,
    Prediction.classes_sha256, PairMetrics.html_sha256, PairMetrics.export_sha256,
    DatasetLabels.sha256)
NOT_ARTIFACT_COLUMNS = frozenset({"gate_decisions.request_sha256"})


@dataclass(frozen=True)
class StoreReport:
    """What `flipgate store check` finds: artifacts without a row, rows without an artifact."""

    unreferenced: list[str]
    missing: list[str]


def last_modified(path: Path) -> float:
    """The newest modification time of a file, or of anything inside a folder."""
    times = [path.stat().st_mtime]
    if path.is_dir():
        times += [child.stat().st_mtime for child in path.rglob("*")]
    return max(times)


def sweep_partial_files(*, store: ArtifactStore, idle_seconds: float) -> list[Path]:
    """Remove the staging folders and unfinished writes untouched for `idle_seconds` (an
    upload under way keeps writing, so its files stay fresh); what was removed."""
    cutoff = time.time() - idle_seconds
    stale = [path for path in store.partial_files() if last_modified(path) < cutoff]
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


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
    cutoff = time.time() - min_age_seconds
    garbage = [sha256 for sha256 in check_store(session=session, store=store).unreferenced
               if store.path(sha256).stat().st_mtime < cutoff]
    for sha256 in garbage:
        store.remove(sha256)
    return garbage
