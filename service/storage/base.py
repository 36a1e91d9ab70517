"""The artifact store's interface: immutable artifacts named by the sha256 of their bytes
(`sha256/ab/cdef…`), and the local staging of uploads that both back-ends share."""

import hashlib
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from flipgate.formats.files import file_sha256
from flipgate.logits_scan import LogitsScan
from service.errors import InvalidInput
from service.storage.common import (
    check_declared,
    check_intact,
    claim_turn,
    copy_hashing,
    receive_batches,
)

SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
HEAD_BYTES = 64 << 10  # the first bytes of a streamed upload kept for its header checks
BUNDLE_MODEL = "model.onnx"  # the model's name inside a bundle (a model with external data)


@dataclass(frozen=True)
class StoredArtifact:
    """The address and size of an artifact in the store."""

    sha256: str
    size: int


@dataclass(frozen=True)
class StagedFile:
    """An upload received and hashed (for logits, scanned: checks and argmax) in one pass:
    written to the local staging file `path`, or (path None) streamed into the store, which
    keeps `head` (its first HEAD_BYTES) and `size` for the header checks; `put_staged`
    stores it. A back-end that streams uploads extends it with what it needs to finish
    one."""

    path: Path | None
    sha256: str
    scan: LogitsScan | None = None
    size: int = 0
    head: bytes = b""


class ArtifactStore(ABC):
    """Immutable artifacts named by their sha256: the local folder or an S3 bucket. Uploads
    are staged in the local folder `staging` (files that must be read whole to be checked)
    unless the store takes a stream (`receive`)."""

    staging: Path
    # whether a raw body whose sha256 the client declares goes straight to its address,
    # saving the copy from a staging key (/healthz tells upload clients)
    declared_digest_saves_copy = False

    @abstractmethod
    def exists(self, sha256: str) -> bool:
        """Whether the artifact is stored."""

    @abstractmethod
    def local_path(self, sha256: str) -> Path:
        """A local file holding the artifact (the file itself, or a verified cached copy),
        for memory-mapped reads; a bundle is a folder. NotFound when it is not stored."""

    @abstractmethod
    def is_bundle(self, sha256: str) -> bool:
        """Whether the artifact is a bundle (a model with its external data); NotFound when
        it is not stored."""

    @abstractmethod
    def bundle_tar(self, sha256: str) -> Iterator[bytes]:
        """The bundle `sha256` as the bytes of one uncompressed tar of its files in name
        order (service.storage.bundle; the same bytes from either back-end), for a download;
        NotFound when no bundle is stored there."""

    def model_path(self, sha256: str) -> Path:
        """Where a model artifact's .onnx lies locally: the file, or inside its bundle."""
        path = self.local_path(sha256)
        return path / BUNDLE_MODEL if path.is_dir() else path

    def open(self, sha256: str) -> BinaryIO:
        """The artifact opened for reading in binary mode."""
        return self.local_path(sha256).open("rb")

    @abstractmethod
    def put_file(self, path: Path, sha256: str | None = None) -> StoredArtifact:
        """Store a local file (whose digest is `sha256`, when known); storing the same bytes
        again stores nothing new."""

    @abstractmethod
    def put_bundle(self, files: dict[str, Path], sha256: str) -> None:
        """Store a model and its external data (`files` by their names in the bundle, the
        model as BUNDLE_MODEL) as one artifact at `sha256` (`bundle_sha256(files)`)."""

    @abstractmethod
    def entries(self) -> Iterator[tuple[str, float]]:
        """The sha256 of every stored artifact and when it was stored (seconds since the
        epoch)."""

    def addresses(self) -> Iterator[str]:
        """The sha256 of every stored artifact."""
        return (sha256 for sha256, _ in self.entries())

    @abstractmethod
    def remove(self, addresses: list[str]) -> None:
        """Delete artifacts (garbage collection only: requests never delete)."""

    def sweep_partial(self, idle_seconds: float) -> list[str]:
        """Remove what uploads left that stopped writing `idle_seconds` ago, on this host and
        in the shared store; what was removed."""
        return self.sweep_local(idle_seconds) + self.sweep_shared(idle_seconds)

    @abstractmethod
    def sweep_local(self, idle_seconds: float) -> list[str]:
        """Remove this host's files of uploads that stopped writing `idle_seconds` ago
        (staging folders, the local store's unfinished writes); what was removed."""

    def sweep_local_when_due(self, idle_seconds: float) -> list[str]:
        """`sweep_local`, by one of the processes sharing the staging folder once per half
        `idle_seconds` (the others find it done); what was removed."""
        marker = self.staging.with_name(f"{self.staging.name}-swept-at")
        if not claim_turn(marker, idle_seconds / 2):
            return []
        return self.sweep_local(idle_seconds)

    def sweep_shared(self, idle_seconds: float) -> list[str]:
        """Remove what uploads left in the store every host shares (a bucket's staging
        objects and unfinished multipart uploads) begun `idle_seconds` ago; what was
        removed. One process of a deployment does it (worker.sweeper)."""
        return []

    @abstractmethod
    def unfinished_uploads(self) -> list[tuple[str, float]]:
        """What uploads under way or abandoned hold in the store (unfinished writes and
        multipart uploads, staging files and objects), each named as `flipgate store check`
        prints it, with when it began or was last written (seconds since the epoch)."""

    @abstractmethod
    def check(self) -> str:
        """Raise unless the store answers; its kind."""

    def copy_to(self, target: "ArtifactStore", sha256: str) -> None:
        """Store the artifact in `target` as it is here (a bundle as a bundle), its bytes
        checked against its address first (StorageUnavailable `artifact_corrupt` when they
        do not match)."""
        path = self.local_path(sha256)
        if path.is_dir():
            files = folder_files(path)
            check_intact(bundle_sha256(files), sha256)
            target.put_bundle(files, sha256)
        else:
            check_intact(file_sha256(path), sha256)
            target.put_file(path, sha256)

    def put_model(self, files: dict[str, Path], sha256: str) -> None:
        """Store a model (`model_files`) at `sha256` (`model_sha256`): as one file, or as a
        bundle with its external data."""
        if len(files) == 1:
            self.put_file(files[BUNDLE_MODEL], sha256)
        else:
            self.put_bundle(files, sha256)

    def put_stream(self, readable: BinaryIO, max_bytes: int | None = None) -> StoredArtifact:
        """Store what `readable` holds, hashed while it is staged; more than `max_bytes` is
        PayloadTooLarge."""
        with self.stage(readable, filename="stream", max_bytes=max_bytes) as staged:
            return self.put_file(staged.path, staged.sha256)

    def put_staged(self, staged: StagedFile) -> None:
        """Store an upload staged by `stage`, `stage_chunks` or `receive`, at its digest."""
        self.put_file(staged.path, staged.sha256)

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A fresh local folder beside the staged uploads (storing a file from it is a link
        where the store is local), removed afterwards."""
        self.staging.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.staging) as folder:
            yield Path(folder)

    @contextmanager
    def stage(self, readable: BinaryIO, *, filename: str,
              max_bytes: int | None) -> Iterator[StagedFile]:
        """An upload streamed (at most `max_bytes`) and hashed into a fresh folder of its
        own, so that nothing it names relative to itself can reach other files; removed
        afterwards."""
        with self.scratch() as folder:
            path = folder / filename
            with path.open("wb") as handle:
                sha256, size = copy_hashing(readable, handle, max_bytes)
            yield StagedFile(path, sha256, size=size)

    @asynccontextmanager
    async def stage_chunks(self, chunks: AsyncIterator[bytes], *, filename: str,
                           max_bytes: int, scan: LogitsScan | None = None,
                           declared: str | None = None) -> AsyncIterator[StagedFile]:
        """`stage` for a body that arrives as chunks (a raw request body): written, hashed
        and fed to `scan` as it comes, a megabyte at a time off the event loop, in one
        pass; refused (422 `digest_mismatch`) unless its sha256 is the one the client
        `declared`, if it did."""
        with self.scratch() as folder:
            path, digest = folder / filename, hashlib.sha256()
            with path.open("wb") as handle:

                def keep(data: bytes) -> None:
                    digest.update(data)
                    handle.write(data)
                    if scan is not None:
                        scan.feed(data)

                size = await receive_batches(chunks, keep, max_bytes)
            yield StagedFile(path, check_declared(digest.hexdigest(), declared), scan,
                             size=size)

    @asynccontextmanager
    async def receive(self, chunks: AsyncIterator[bytes], *, filename: str, max_bytes: int,
                      scan: LogitsScan | None = None,
                      declared: str | None = None) -> AsyncIterator[StagedFile]:
        """A raw body whose checks need only `scan`, its head and its size: streamed into
        the store where it takes streams (S3), else staged (`stage_chunks`); `put_staged`
        stores it, and whatever is not stored by then is discarded afterwards."""
        async with self.stage_chunks(chunks, filename=filename, max_bytes=max_bytes,
                                     scan=scan, declared=declared) as staged:
            yield staged


def check_address(sha256: str) -> str:
    """`sha256` when it is 64 lowercase hex digits, else InvalidInput."""
    if not isinstance(sha256, str) or not SHA256_PATTERN.fullmatch(sha256):
        raise InvalidInput("invalid_sha256", f"{sha256!r} is not a sha256 digest "
                           "(64 lowercase hexadecimal characters)")
    return sha256


def upload_name(field: str, filename: str | None) -> str:
    """How messages name an upload: its form field and the client's file name (its last path
    part, printable, at most 100 characters), never where the server staged it."""
    base = re.split(r"[/\\]", filename or "")[-1]
    shown = "".join(c for c in base if c.isprintable())[:100]
    return f"{field} ({shown})" if shown else field


def model_sha256(files: dict[str, Path]) -> str:
    """The address of a model (`model_files`): the digest of its .onnx file, or of its bundle
    when it has external data."""
    return file_sha256(files[BUNDLE_MODEL]) if len(files) == 1 else bundle_sha256(files)


def bundle_sha256(files: dict[str, Path]) -> str:
    """The address of a bundle: the sha256 of its file names and their contents' digests."""
    return manifest_sha256({name: file_sha256(path) for name, path in files.items()})


def manifest_sha256(digests: dict[str, str]) -> str:
    """The address of a bundle whose files (by their names in it) have these digests."""
    manifest = "".join(f"{name}\0{digest}\n" for name, digest in sorted(digests.items()))
    return hashlib.sha256(manifest.encode()).hexdigest()


def folder_files(folder: Path) -> dict[str, Path]:
    """The files of a bundle's folder by their names in it."""
    return {path.relative_to(folder).as_posix(): path for path in folder.rglob("*")
            if path.is_file()}
