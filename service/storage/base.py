"""The artifact store's interface: immutable artifacts named by the sha256 of their bytes
(`sha256/ab/cdef…`), and the local staging of uploads that both back-ends share."""

import asyncio
import hashlib
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from flipgate.formats.files import file_sha256
from flipgate.logits_scan import LogitsScan
from flipgate.upload_client import DIGEST_HEADER
from service.errors import InvalidInput, PayloadTooLarge

SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
CHUNK_BYTES = 1 << 20
WRITE_BATCH_BYTES = 1 << 20  # a raw body is written in batches of this size
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
    written to the local staging file `path`, or (path None) streamed into the store's
    multipart `upload` to `key` (its address when the client declared the digest, else a
    staging key), of which `head` (its first HEAD_BYTES) and `size` are kept for the header
    checks."""

    path: Path | None
    sha256: str
    scan: LogitsScan | None = None
    size: int = 0
    head: bytes = b""
    key: str | None = None
    upload: Any = None


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

    @abstractmethod
    def sweep_partial(self, idle_seconds: float) -> list[str]:
        """Remove what uploads left that stopped writing `idle_seconds` ago (staging files,
        unfinished writes); what was removed."""

    @abstractmethod
    def check(self) -> str:
        """Raise unless the store answers; its kind."""

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
                artifact = _copy_hashing(readable, handle, max_bytes)
            yield StagedFile(path, artifact.sha256, size=artifact.size)

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


def check_declared(sha256: str, declared: str | None) -> str:
    """The digest of an upload, unless the client declared another (422)."""
    if declared is not None and declared != sha256:
        raise InvalidInput("digest_mismatch", f"the body's sha256 is {sha256}, not the "
                           f"{declared} its {DIGEST_HEADER} header declares")
    return sha256


def check_address(sha256: str) -> str:
    """`sha256` when it is 64 lowercase hex digits, else InvalidInput."""
    if not isinstance(sha256, str) or not SHA256_PATTERN.fullmatch(sha256):
        raise InvalidInput("invalid_sha256", f"{sha256!r} is not a sha256 digest "
                           "(64 lowercase hexadecimal characters)")
    return sha256


async def receive_batches(chunks: AsyncIterator[bytes], keep: Callable[[bytes], None],
                          max_bytes: int) -> int:
    """Hand the chunks to `keep` in order, a batch of WRITE_BATCH_BYTES at a time in a
    worker thread while the next batch is received (at most one batch in the thread, none
    left there when this returns or raises); more than `max_bytes` is PayloadTooLarge; the
    size received."""
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
    await loop.run_in_executor(None, keep, b"".join(pending))
    return size


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
    manifest = "".join(f"{name}\0{file_sha256(path)}\n" for name, path in sorted(files.items()))
    return hashlib.sha256(manifest.encode()).hexdigest()


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
