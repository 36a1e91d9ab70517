"""The embedded back-end: a local folder, each artifact at sha256/ab/cdef… (a bundle a
read-only folder there), written through a temporary file and renamed into place."""

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from service.errors import NotFound
from service.storage.base import (
    SHA256_PATTERN,
    ArtifactStore,
    StoredArtifact,
    check_address,
    file_sha256,
)


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

    def sweep_partial(self, idle_seconds: float) -> list[str]:
        return remove_idle(self.partial_files(), idle_seconds)

    def partial_files(self) -> Iterator[Path]:
        """Uploads under way or abandoned: staging folders and unfinished store writes."""
        yield from self.staging.glob("*")
        yield from self.root.glob(".upload-*")

    def check(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.root):
            return "writable"

    def put_file(self, path: Path, sha256: str | None = None) -> StoredArtifact:
        """Linked when the file lies on the store's file system, else copied."""
        path = Path(path)
        artifact = StoredArtifact(sha256 or file_sha256(path), path.stat().st_size)
        if self.exists(artifact.sha256):
            return artifact
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.root / f".upload-{uuid.uuid4().hex}"
        try:
            _link_or_copy(path, temporary)
            self._place(temporary, artifact.sha256)
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
                _link_or_copy(path, temporary / name)
                (temporary / name).chmod(0o444)
            self._place(temporary, sha256)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)

    def _place(self, temporary: Path, sha256: str) -> None:
        """Rename a finished upload to its address unless an artifact is already there."""
        place(temporary, self.path(sha256))


def place(temporary: Path, target: Path) -> None:
    """Rename a finished file or folder to `target`, read-only, unless something is there
    already (another writer placed the same bytes first)."""
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary.chmod(0o755 if temporary.is_dir() else 0o444)
    try:
        os.replace(temporary, target)
    except OSError:  # another upload placed the same bundle first
        if not target.is_dir():
            raise


def remove_idle(paths: Iterable[Path], idle_seconds: float) -> list[str]:
    """Remove those of `paths` (files or folders) untouched for `idle_seconds`; which."""
    cutoff = time.time() - idle_seconds
    stale = [path for path in paths if last_modified(path) < cutoff]
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return [str(path) for path in stale]


def last_modified(path: Path) -> float:
    """The newest modification time of a file, or of anything inside a folder."""
    times = [path.stat().st_mtime]
    if path.is_dir():
        times += [child.stat().st_mtime for child in path.rglob("*")]
    return max(times)


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
