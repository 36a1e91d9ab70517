"""A model with external data as one object: an uncompressed tar of its files in name order
(no owners, no times), rebuilt as a folder where it is read (ONNX Runtime needs the data
beside the model); its address stays `bundle_sha256` of the files."""

import tarfile
from pathlib import Path, PurePosixPath

from service.errors import StorageUnavailable
from service.storage.base import BUNDLE_MODEL, bundle_sha256


def pack_bundle(files: dict[str, Path], out: Path) -> Path:
    """Write the bundle of `files` (by their names in it) to the tar `out`."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, path in sorted(files.items()):
            member = tarfile.TarInfo(name)
            member.size, member.mode = path.stat().st_size, 0o444
            with path.open("rb") as readable:
                archive.addfile(member, readable)
    return out


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
