"""A content-addressed file store: each artifact lives at sha256/ab/cdef… and never changes."""

import asyncio
import hashlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from flipgate.logits_scan import LogitsScan
from service.config import Settings
from service.errors import InvalidInput, NotFound, PayloadTooLarge

SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
CHUNK_BYTES = 1 << 20
WRITE_BATCH_BYTES = 1 << 20  # a raw body is written to disk in batches of this size
BUNDLE_MODEL = "model.onnx"  # the model's name inside a bundle (a model with external data)


@dataclass(frozen=True)
class StoredArtifact:
    """The address and size of an artifact in the store."""

    sha256: str
    size: int


@dataclass(frozen=True)
class StagedFile:
    """An upload written to staging, the digest taken while it was written and, for logits,
    their scan (checks and argmax) taken in the same pass."""

    path: Path
    sha256: str
    scan: LogitsScan | None = None


class ArtifactStore:
    """Immutable files named by the sha256 of their bytes, written via a temporary file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / "sha256"

    @classmethod
    def from_settings(cls, settings: Settings) -> "ArtifactStore":
        return cls(settings.artifacts_dir)

    def path(self, sha256: str) -> Path:
        """Where the artifact lives; refuses anything but 64 lowercase hex digits."""
        if not isinstance(sha256, str) or not SHA256_PATTERN.fullmatch(sha256):
            raise InvalidInput("invalid_sha256", f"{sha256!r} is not a sha256 digest "
                               "(64 lowercase hexadecimal characters)")
        return self.root / sha256[:2] / sha256[2:]

    def exists(self, sha256: str) -> bool:
        path = self.path(sha256)
        return path.is_file() or path.is_dir()

    def model_path(self, sha256: str) -> Path:
        """Where a model artifact's .onnx lives: the file itself, or inside its bundle."""
        path = self.path(sha256)
        return path / BUNDLE_MODEL if path.is_dir() else path

    @property
    def staging(self) -> Path:
        """Where uploads are written while they are checked."""
        return self.root.parent / "staging"

    def addresses(self) -> Iterator[str]:
        """The sha256 of every artifact in the store."""
        for path in self.root.glob("??/*"):
            if SHA256_PATTERN.fullmatch(address := path.parent.name + path.name):
                yield address

    def partial_files(self) -> Iterator[Path]:
        """Uploads under way or abandoned: staging folders and unfinished store writes."""
        yield from self.staging.glob("*")
        yield from self.root.glob(".upload-*")

    def remove(self, sha256: str) -> None:
        """Delete an artifact (garbage collection only: requests never delete)."""
        path = self.path(sha256)
        if path.is_dir():
            shutil.rmtree(path)
        path.unlink(missing_ok=True)

    def open(self, sha256: str) -> BinaryIO:
        """The artifact opened for reading in binary mode."""
        try:
            return self.path(sha256).open("rb")
        except FileNotFoundError as error:
            raise NotFound("artifact_not_found", f"no artifact {sha256}") from error

    def put_file(self, path: Path, sha256: str | None = None) -> StoredArtifact:
        """Place a local file (whose digest is `sha256`, when known) into the store: linked
        when it lies on the store's file system, else copied."""
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

    def put_model(self, files: dict[str, Path], sha256: str) -> None:
        """Place a model (`model_files`) at `sha256` (`model_sha256`): as one file, or as a
        bundle with its external data."""
        if len(files) == 1:
            self.put_file(files[BUNDLE_MODEL], sha256)
        else:
            self.put_bundle(files, sha256)

    def put_bundle(self, files: dict[str, Path], sha256: str) -> None:
        """Place a model and its external data (`files` by their names in the bundle, the
        model as BUNDLE_MODEL) as one read-only folder at the address `sha256`
        (`bundle_sha256(files)`), linked or copied into a temporary folder first."""
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

    def put_stream(self, readable: BinaryIO, max_bytes: int | None = None) -> StoredArtifact:
        """Stream into the store while hashing; more than `max_bytes` is PayloadTooLarge."""
        self.root.mkdir(parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(dir=self.root, prefix=".upload-")
        temporary = Path(name)
        try:
            with open(descriptor, "wb") as handle:
                artifact = _copy_hashing(readable, handle, max_bytes)
                handle.flush()
                os.fsync(handle.fileno())
            self._place(temporary, artifact.sha256)
        finally:
            temporary.unlink(missing_ok=True)
        return artifact

    @contextmanager
    def stage(self, readable: BinaryIO, *, filename: str,
              max_bytes: int) -> Iterator[StagedFile]:
        """An upload streamed (at most `max_bytes`) and hashed into a fresh folder of its
        own, so that nothing it names relative to itself can reach other files; removed
        afterwards."""
        self.staging.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.staging) as folder:
            path = Path(folder) / filename
            with path.open("wb") as handle:
                artifact = _copy_hashing(readable, handle, max_bytes)
            yield StagedFile(path, artifact.sha256)

    @asynccontextmanager
    async def stage_chunks(self, chunks: AsyncIterator[bytes], *, filename: str,
                           max_bytes: int,
                           scan: LogitsScan | None = None) -> AsyncIterator[StagedFile]:
        """`stage` for a body that arrives as chunks (a raw request body): written, hashed
        and fed to `scan` as it comes, a megabyte at a time off the event loop, in one
        pass."""
        self.staging.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.staging) as folder:
            path, digest = Path(folder) / filename, hashlib.sha256()
            with path.open("wb") as handle:

                def keep(data: bytes) -> None:
                    digest.update(data)
                    handle.write(data)
                    if scan is not None:
                        scan.feed(data)

                await _receive(chunks, keep, max_bytes)
            yield StagedFile(path, digest.hexdigest(), scan)

    def _place(self, temporary: Path, sha256: str) -> None:
        """Rename a finished upload to its address unless an artifact is already there."""
        target = self.path(sha256)
        if target.exists():
            return
        target.parent.mkdir(exist_ok=True)
        temporary.chmod(0o755 if temporary.is_dir() else 0o444)
        try:
            os.replace(temporary, target)
        except OSError:  # another upload placed the same bundle first
            if not target.is_dir():
                raise


async def _receive(chunks: AsyncIterator[bytes], keep: Callable[[bytes], None],
                   max_bytes: int) -> None:
    """Hand the chunks to `keep` in order, a batch of WRITE_BATCH_BYTES at a time in a
    worker thread while the next batch is received (at most one batch in the thread, none
    left there when this returns or raises); more than `max_bytes` is PayloadTooLarge."""
    loop, pending, size, buffered = asyncio.get_running_loop(), [], 0, 0
    writing: asyncio.Future | None = None
    try:
        async for chunk in chunks:
            size, buffered = size + len(chunk), buffered + len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge("payload_too_large", "the upload is larger than the "
                                      f"limit of {max_bytes} bytes")
            pending.append(chunk)
            if buffered >= WRITE_BATCH_BYTES:
                if writing is not None:
                    await asyncio.shield(writing)
                writing = loop.run_in_executor(None, keep, b"".join(pending))
                pending, buffered = [], 0
    finally:
        if writing is not None:
            await asyncio.wait([writing])  # the file is never closed under a write
    if writing is not None:
        writing.result()
    keep(b"".join(pending))


def upload_name(field: str, filename: str | None) -> str:
    """How messages name an upload: its form field and the client's file name (its last path
    part, printable, at most 100 characters), never where the server staged it."""
    base = re.split(r"[/\\]", filename or "")[-1]
    shown = "".join(c for c in base if c.isprintable())[:100]
    return f"{field} ({shown})" if shown else field


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in chunks: its address in the store."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as readable:
        while chunk := readable.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def model_sha256(files: dict[str, Path]) -> str:
    """The address of a model (`model_files`): the digest of its .onnx file, or of its bundle
    when it has external data."""
    return file_sha256(files[BUNDLE_MODEL]) if len(files) == 1 else bundle_sha256(files)


def bundle_sha256(files: dict[str, Path]) -> str:
    """The address of a bundle: the sha256 of its file names and their contents' digests."""
    manifest = "".join(f"{name}\0{file_sha256(path)}\n" for name, path in sorted(files.items()))
    return hashlib.sha256(manifest.encode()).hexdigest()


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _copy_hashing(source: BinaryIO, target: BinaryIO, max_bytes: int | None) -> StoredArtifact:
    digest, size = hashlib.sha256(), 0
    while chunk := source.read(CHUNK_BYTES):
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            raise PayloadTooLarge("payload_too_large", f"the upload is larger than the limit "
                                  f"of {max_bytes} bytes")
        digest.update(chunk)
        target.write(chunk)
    return StoredArtifact(digest.hexdigest(), size)
