"""A model with external data as one object: an uncompressed tar of its files in name order
(no owners, no times), rebuilt as a folder where it is read (ONNX Runtime needs the data
beside the model); its address stays `bundle_sha256` of the files."""

import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from service.errors import StorageUnavailable
from service.storage.base import BUNDLE_MODEL, CHUNK_BYTES, bundle_sha256


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
    yield bytes(2 * tarfile.BLOCKSIZE)  # the end of the archive


def folder_files(folder: Path) -> dict[str, Path]:
    """The files of a bundle's folder by their names in it."""
    return {path.relative_to(folder).as_posix(): path for path in folder.rglob("*")
            if path.is_file()}


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


def _plain(name: str) -> bool:
    """A relative path of normal parts (no '..', no absolute path)."""
    path = PurePosixPath(name)
    return not path.is_absolute() and all(part not in ("", ".", "..") for part in path.parts)


def _corrupt(sha256: str, why: str) -> StorageUnavailable:
    return StorageUnavailable("artifact_corrupt", f"the stored bundle {sha256} is not "
                              f"readable: {why}")
