"""A model with external data as one object: an uncompressed tar of its files in name order
(no owners, no times), rebuilt as a folder where it is read (ONNX Runtime needs the data
beside the model), or passed on as it is stored and checked as it passes (a download); its
address stays `bundle_sha256` of the files."""

import hashlib
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from service.errors import StorageUnavailable
from service.storage.base import BUNDLE_MODEL, bundle_sha256, manifest_sha256
from service.storage.common import CHUNK_BYTES

END_BYTES = 2 * tarfile.BLOCKSIZE  # the end of an archive: two blocks of zeros


def pack_bundle(files: dict[str, Path], out: Path) -> Path:
    """Write the bundle of `files` (by their names in it) to the tar `out`."""
    with out.open("wb") as writable:
        for chunk in bundle_chunks(files):
            writable.write(chunk)
    return out


def bundle_chunks(files: dict[str, Path]) -> Iterator[bytes]:
    """The bytes of the bundle of `files`, a header or a megabyte at a time (the same bytes
    for the same files, whichever store holds them)."""
    for name, path in sorted(files.items()):
        member = tarfile.TarInfo(name)
        member.size, member.mode = path.stat().st_size, 0o444
        yield member.tobuf(tarfile.PAX_FORMAT)
        with path.open("rb") as readable:
            while chunk := readable.read(CHUNK_BYTES):
                yield chunk
        yield bytes(-member.size % tarfile.BLOCKSIZE)
    yield bytes(END_BYTES)


def unpack_bundle(tar: Path, folder: Path, sha256: str) -> Path:
    """The bundle `tar` rebuilt as the folder `folder`/bundle, verified to be the bundle
    `sha256` (artifact_corrupt otherwise): regular files with plain relative names only."""
    out = folder / "bundle"
    out.mkdir()
    with tarfile.open(tar, "r:") as archive:
        members = archive.getmembers()
        if not all(member.isfile() and _plain(member.name) for member in members):
            raise _corrupt(sha256, "a member is not a plain file")
        archive.extractall(out, members=members)  # names checked above
    files = {member.name: out / member.name for member in members}
    if BUNDLE_MODEL not in files or bundle_sha256(files) != sha256:
        raise _corrupt(sha256, "its files do not match its address")
    for path in files.values():
        path.chmod(0o444)
    return out


def verified_tar(chunks: Iterable[bytes], sha256: str) -> Iterator[bytes]:
    """The bytes of a stored bundle's tar passed on as they are read, and read as a tar as
    they pass, but the end of the archive, held back until its members are checked to be
    plain files that make the bundle `sha256`: artifact_corrupt otherwise (a download is
    cut short, never a complete tar)."""
    reader, digests = _PassingReader(chunks), {}
    with tarfile.open(fileobj=reader, mode="r|") as archive:
        for member in archive:
            if not (member.isfile() and _plain(member.name)):
                raise _corrupt(sha256, "a member is not a plain file")
            digest, content = hashlib.sha256(), archive.extractfile(member)
            while data := content.read(CHUNK_BYTES):
                digest.update(data)
                yield from reader.take()
            digests[member.name] = digest.hexdigest()
    if BUNDLE_MODEL not in digests or manifest_sha256(digests) != sha256:
        raise _corrupt(sha256, "its files do not match its address")
    yield from reader.take(keep=0)
    yield from reader.rest()


class _PassingReader:
    """A binary reader of `chunks` that keeps what it has handed out until it is taken."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks, self.pending, self.passed = iter(chunks), bytearray(), bytearray()

    def read(self, size: int) -> bytes:
        while len(self.pending) < size and (chunk := next(self.chunks, None)) is not None:
            self.pending += chunk
        data = bytes(self.pending[:size])
        del self.pending[:size]
        self.passed += data
        return data

    def take(self, keep: int = END_BYTES) -> Iterator[bytes]:
        """What was read since the last `take` but its last `keep` bytes (nothing when no
        more was read)."""
        if len(self.passed) > keep:
            cut = len(self.passed) - keep
            yield bytes(self.passed[:cut])
            del self.passed[:cut]

    def rest(self) -> Iterator[bytes]:
        """What was never read (the padding after the end of the archive)."""
        if self.pending:
            yield bytes(self.pending)
        yield from self.chunks


def _plain(name: str) -> bool:
    """A relative path of normal parts (no '..', no absolute path)."""
    path = PurePosixPath(name)
    return not path.is_absolute() and all(part not in ("", ".", "..") for part in path.parts)


def _corrupt(sha256: str, why: str) -> StorageUnavailable:
    return StorageUnavailable("artifact_corrupt", f"the stored bundle {sha256} is not "
                              f"readable: {why}")
