"""Unpacking a model shipped as a .zip: one .onnx and, flat beside it, the external data
files it names (what `torch.onnx.export` writes: model.onnx + model.onnx.data).

Every member's name, type and size is checked before a byte is unpacked, and the files the
model names must be exactly the other members. Refusals are InputErrors.
"""

import shutil
import stat
import zipfile
from pathlib import Path

from flipgate.errors import InputError
from flipgate.formats.npy import DEFLATE_MAX_RATIO
from flipgate.formats.onnx_models import external_data_names

MAX_MEMBERS = 4096
COPY_CHUNK_BYTES = 1 << 20


def unpack_model_zip(archive_path: Path, folder: Path, *, max_bytes: int,
                     source: str | None = None) -> Path:
    """Unpack the model .zip at `archive_path` into the empty `folder` (at most `max_bytes`
    unpacked); the path of its .onnx file."""
    source = source or str(archive_path)
    try:
        with zipfile.ZipFile(archive_path) as archive:
            members = _checked_members(archive, max_bytes, source)
            model = _the_model(members, source)
            model_path = _unpack(archive, members[model], folder)
            _check_data_files(external_data_names(model_path, source=source),
                              set(members) - {model}, source)
            for name in set(members) - {model}:
                _unpack(archive, members[name], folder)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise InputError("model_zip_corrupt", f"{source}: not a readable .zip archive "
                           f"({error})") from error
    return model_path


def _checked_members(archive: zipfile.ZipFile, max_bytes: int,
                     source: str) -> dict[str, zipfile.ZipInfo]:
    """The archive's members by name, each a plain file with a flat, safe name, together
    at most `max_bytes` unpacked."""
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise InputError("model_zip_members", f"{source}: {len(infos)} files, above the "
                           f"limit of {MAX_MEMBERS}")
    for info in infos:
        _check_member(info, source)
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise InputError("model_zip_members", f"{source}: a file name occurs twice")
    total = sum(info.file_size for info in infos)
    if total > max_bytes:
        raise InputError("model_zip_too_large", f"{source}: its files unpack to {total} "
                           f"bytes, above the limit of {max_bytes}")
    return dict(zip(names, infos, strict=True))


def _check_member(info: zipfile.ZipInfo, source: str) -> None:
    """A flat name (no folder, no '..', not absolute), a regular file, not encrypted, stored
    or deflated, and a size its compressed bytes can really expand to."""
    name = info.filename
    if (not name or name in {".", ".."} or any(c in name for c in "/\\:\0")
            or not name.isprintable()):
        raise InputError("model_zip_path", f"{source}: member {name!r} is not a plain file "
                           "name; the .onnx and its data files must lie flat in the archive")
    mode = info.external_attr >> 16
    if info.is_dir() or (stat.S_IFMT(mode) and not stat.S_ISREG(mode)):
        raise InputError("model_zip_member_type", f"{source}: member {name!r} is not a "
                           "regular file (links and folders are refused)")
    if info.flag_bits & 0x1 or info.compress_type not in {zipfile.ZIP_STORED,
                                                          zipfile.ZIP_DEFLATED}:
        raise InputError("model_zip_member_type", f"{source}: member {name!r} is encrypted "
                           "or compressed with a method other than stored or deflate")
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else DEFLATE_MAX_RATIO
    if info.file_size > info.compress_size * ratio + 1024:
        raise InputError("model_zip_corrupt", f"{source}: member {name!r} claims "
                           f"{info.file_size} bytes from {info.compress_size} compressed")


def _the_model(members: dict[str, zipfile.ZipInfo], source: str) -> str:
    """The name of the archive's one .onnx file."""
    models = sorted(name for name in members if name.lower().endswith(".onnx"))
    if len(models) != 1:
        raise InputError("model_zip_onnx_count", f"{source}: a model .zip holds exactly one "
                           f".onnx file, this one holds {len(models)} {models}")
    return models[0]


def _check_data_files(named: set[str], present: set[str], source: str) -> None:
    """The files beside the model must be exactly those its external tensors name."""
    if missing := sorted(named - present):
        raise InputError("model_zip_missing_data", f"{source}: the model's external data "
                           f"{missing} is not in the archive (put the files beside the .onnx)")
    if extra := sorted(present - named):
        raise InputError("model_zip_extra_files", f"{source}: {extra} are not data files "
                           "of the model; the archive may hold only the .onnx and its data")


def _unpack(archive: zipfile.ZipFile, info: zipfile.ZipInfo, folder: Path) -> Path:
    """Write one checked member into `folder`, never more than the size it declared."""
    target = folder / info.filename
    with archive.open(info) as member, target.open("xb") as handle:
        shutil.copyfileobj(member, handle, COPY_CHUNK_BYTES)
    return target
