"""The embedded back-end: a local folder, each artifact at sha256/ab/cdef… (a bundle a
read-only folder there), written through a temporary file and renamed into place."""

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from service.errors import NotFound
from service.storage.base import (
    SHA256_PATTERN,
    ArtifactStore,
    StoredArtifact,
    check_address,
    file_sha256,
    folder_files,
)
from service.storage.bundle import bundle_chunks
from service.storage.common import last_modified, link_or_copy, place, remove_idle


class LocalStore(ArtifactStore):
    """Artifacts in the folder `root`/sha256, uploads staged in `root`/staging (one file
    system, so that storing a staged file is a link)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / "sha256"
        self.staging = Path(root) / "staging"

    def path(self, sha256: str) -> Path:
        """Where the artifact lives; refuses anything but 64 lowercase hex digits."""
        check_address(sha256)
        return self.root / sha256[:2] / sha256[2:]

    def exists(self, sha256: str) -> bool:
        path = self.path(sha256)
        return path.is_file() or path.is_dir()

    def local_path(self, sha256: str) -> Path:
        if not self.exists(sha256):
            raise NotFound("artifact_not_found", f"no artifact {sha256}")
        return self.path(sha256)

    def is_bundle(self, sha256: str) -> bool:
        """A bundle is a folder."""
        return self.local_path(sha256).is_dir()

    def bundle_tar(self, sha256: str) -> Iterator[bytes]:
        """The folder's files, tarred as they are read."""
        if not self.is_bundle(sha256):
            raise NotFound("artifact_not_found", f"no bundle {sha256}")
        return bundle_chunks(folder_files(self.path(sha256)))

    def entries(self) -> Iterator[tuple[str, float]]:
        for path in self.root.glob("??/*"):
            if SHA256_PATTERN.fullmatch(address := path.parent.name + path.name):
                yield address, path.stat().st_mtime

    def remove(self, addresses: list[str]) -> None:
        for sha256 in addresses:
            path = self.path(sha256)
            if path.is_dir():
                shutil.rmtree(path)
            path.unlink(missing_ok=True)

    def sweep_local(self, idle_seconds: float) -> list[str]:
        return remove_idle(self.partial_files(), idle_seconds)

    def unfinished_uploads(self) -> list[tuple[str, float]]:
        return [(str(path), last_modified(path)) for path in self.partial_files()]

    def partial_files(self) -> Iterator[Path]:
        """Uploads under way or abandoned: staging folders and unfinished store writes."""
        yield from self.staging.glob("*")
        yield from self.root.glob(".upload-*")

    def check(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.root):
            return "local"

    def put_file(self, path: Path, sha256: str | None = None) -> StoredArtifact:
        """Linked when the file lies on the store's file system, else copied."""
        path = Path(path)
        artifact = StoredArtifact(sha256 or file_sha256(path), path.stat().st_size)
        if self.exists(artifact.sha256):
            return artifact
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.root / f".upload-{uuid.uuid4().hex}"
        try:
            link_or_copy(path, temporary)
            place(temporary, self.path(artifact.sha256))
        finally:
            temporary.unlink(missing_ok=True)
        return artifact

    def put_bundle(self, files: dict[str, Path], sha256: str) -> None:
        """One read-only folder, linked or copied into a temporary folder first."""
        if self.exists(sha256):
            return
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(dir=self.root, prefix=".upload-"))
        try:
            for name, path in files.items():
                link_or_copy(path, temporary / name)
                (temporary / name).chmod(0o444)
            place(temporary, self.path(sha256))
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
