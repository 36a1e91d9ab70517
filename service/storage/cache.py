"""The local read-through cache of a remote store, keyed by sha256: an artifact is fetched
into a temporary folder, verified against its digest, and renamed into place; the processes
of one host fetch one artifact once (a lock file per key); the least recently used are
evicted beyond the size limit, by one process of the host once per EVICT_SECONDS (an eviction
lists the whole cache), or at once by one that has cached more than EVICT_MARGIN of the limit
since its last."""

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from service.storage.common import claim_turn, place

# an entry used this recently is never evicted: a reader may be about to open the path it
# was handed (once opened or memory-mapped, an evicted file stays readable)
IN_USE_SECONDS = 60.0
EVICT_SECONDS = 60.0  # the processes of a host share one eviction per this interval...
EVICT_MARGIN = 0.05  # ...unless one has cached this fraction of the limit since it evicted
Fetch = Callable[[str, Path], Path]  # (sha256, an empty folder) -> the verified file or folder


class ReadCache:
    """Verified copies of artifacts in `root` (ab/cdef… as in the local store; a bundle a
    folder), at most about `max_bytes` of them."""

    def __init__(self, root: Path, max_bytes: int,
                 evict_seconds: float = EVICT_SECONDS) -> None:
        self.root, self.max_bytes, self.evict_seconds = Path(root), max_bytes, evict_seconds
        self.added = 0  # bytes this process has cached since it last evicted

    def path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256[2:]

    def get(self, sha256: str, fetch: Fetch) -> Path:
        """The cached copy of the artifact, fetched (with `fetch`) by the first process of
        this host that asks for it while the others wait for it."""
        target = self.path(sha256)
        if not target.exists():
            with self._locked(sha256):
                if not target.exists():
                    with self.scratch() as folder:
                        place(fetch(sha256, folder), target)
                    self.added_entry(target)
        _touch(target)
        return target

    def adopt(self, path: Path, sha256: str) -> None:
        """Keep a copy of a local file just stored (a worker's result) when it can be linked
        (same file system); nothing otherwise."""
        target = self.path(sha256)
        if target.exists():
            return
        with self.scratch() as folder:
            try:
                os.link(path, folder / "adopted")
            except OSError:
                return
            place(folder / "adopted", target)
        self.added_entry(target)

    def discard(self, addresses: list[str]) -> None:
        """Forget artifacts (deleted from the store)."""
        for sha256 in addresses:
            _remove(self.path(sha256))

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A fresh folder on the cache's file system, removed afterwards."""
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.root / "tmp") as folder:
            yield Path(folder)

    def added_entry(self, path: Path) -> None:
        """Count an entry this process placed, and evict when it is this folder's turn or
        this process has cached more than EVICT_MARGIN of the limit since its last eviction."""
        with suppress(FileNotFoundError):  # evicted by another process meanwhile
            self.added += _size(path)
        if (self.added > EVICT_MARGIN * self.max_bytes
                or claim_turn(self.root / "evicted-at", self.evict_seconds)):
            self.added = 0
            self.evict()

    def evict(self) -> None:
        """Remove the least recently used entries while the cache holds more than
        max_bytes (never one used within IN_USE_SECONDS)."""
        entries = sorted(self._entries(), key=lambda entry: entry[1])
        total = sum(size for _, _, size in entries)
        recent = time.time() - IN_USE_SECONDS
        for path, used, size in entries:
            if total <= self.max_bytes or used > recent:
                return
            _remove(path)
            total -= size

    def _entries(self) -> Iterator[tuple[Path, float, int]]:
        """(path, last used, size) of every cached artifact."""
        for path in self.root.glob("[0-9a-f][0-9a-f]/*"):
            try:
                yield path, path.stat().st_mtime, _size(path)
            except FileNotFoundError:  # evicted by another process meanwhile
                continue

    @contextmanager
    def _locked(self, sha256: str) -> Iterator[None]:
        """Hold this host's lock of one key (a file lock: other processes wait)."""
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / sha256).open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _touch(path: Path) -> None:
    """Mark an entry used now (its modification time orders the eviction)."""
    with suppress(OSError):  # evicted meanwhile
        os.utime(path)


def _size(path: Path) -> int:
    """The bytes of a cached file, or of the files of a cached bundle."""
    files = [path] if path.is_file() else [*path.rglob("*")]
    return sum(item.stat().st_size for item in files)


def _remove(path: Path) -> None:
    if path.is_dir():
        path.chmod(0o755)
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
