"""What the back-ends share: receiving a body in batches, checking a declared digest, the
local files of staging and placing (the local store's artifacts, the cache's copies), and the
turns of upkeep that the processes of one host take once per interval."""

import asyncio
import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from flipgate.upload_client import DIGEST_HEADER
from service.errors import InvalidInput, PayloadTooLarge, StorageUnavailable

CHUNK_BYTES = 1 << 20
WRITE_BATCH_BYTES = 1 << 20  # a raw body is written in batches of this size


def check_declared(sha256: str, declared: str | None) -> str:
    """The digest of an upload, unless the client declared another (422)."""
    if declared is not None and declared != sha256:
        raise InvalidInput("digest_mismatch", f"the body's sha256 is {sha256}, not the "
                           f"{declared} its {DIGEST_HEADER} header declares")
    return sha256


def check_intact(actual: str, sha256: str) -> None:
    """Refuse an artifact whose bytes hash to `actual`, not to its address `sha256` (503
    `artifact_corrupt`)."""
    if actual != sha256:
        raise StorageUnavailable("artifact_corrupt", f"the store holds other bytes than the "
                                 f"artifact {sha256}")


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
                raise too_large(max_bytes)
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


def copy_hashing(source: BinaryIO, target: BinaryIO, max_bytes: int | None) -> tuple[str, int]:
    """Copy `source` to `target` a chunk at a time (more than `max_bytes` is
    PayloadTooLarge); the sha256 and the size of what was copied."""
    digest, size = hashlib.sha256(), 0
    while chunk := source.read(CHUNK_BYTES):
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            raise too_large(max_bytes)
        digest.update(chunk)
        target.write(chunk)
    return digest.hexdigest(), size


def too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge("payload_too_large", f"the upload is larger than the limit of "
                           f"{max_bytes} bytes")


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


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link of `source` at `target`, or a copy across file systems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


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


def claim_turn(marker: Path, every_seconds: float) -> bool:
    """Whether this process takes the turn of a chore done once every `every_seconds` by
    the processes sharing the empty folder `marker` (made by the first to ask, whose turn it
    is; then its modification time is when the last turn was taken, and a lock on it orders
    the claims)."""
    try:
        marker.mkdir(parents=True)
        first = True
    except FileExistsError:
        first = False
    descriptor = os.open(marker, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        now = time.time()
        if not first and now - os.fstat(descriptor).st_mtime < every_seconds:
            return False
        os.utime(descriptor, (now, now))
        return True
    finally:
        os.close(descriptor)
