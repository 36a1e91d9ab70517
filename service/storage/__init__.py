"""The artifact store: one interface (base.ArtifactStore), two back-ends (the local folder,
the default, and an S3-compatible bucket read through a local cache), chosen by
FLIPGATE_ARTIFACT_STORE."""

from service.config import Settings
from service.storage.base import (
    BUNDLE_MODEL,
    ArtifactStore,
    StagedFile,
    StoredArtifact,
    bundle_sha256,
    check_address,
    file_sha256,
    model_sha256,
    upload_name,
)
from service.storage.local import LocalStore

__all__ = ["BUNDLE_MODEL", "ArtifactStore", "LocalStore", "StagedFile", "StoredArtifact",
           "bundle_sha256", "check_address", "file_sha256", "model_sha256", "open_store",
           "upload_name"]


def open_store(settings: Settings) -> ArtifactStore:
    """The store `settings` name: the bucket of FLIPGATE_ARTIFACT_STORE=s3://…, else the
    local folder <data_dir>/artifacts."""
    if settings.artifact_store is None:
        return LocalStore(settings.artifacts_dir)
    from service.storage.s3 import S3Store  # boto3: loaded only where a bucket is used

    return S3Store.from_settings(settings)
