"""The .npy and .npz containers, read without trusting them: every header is read and
checked against the bytes the file holds before an array is allocated, and nothing is
unpickled (arrays of Python objects are refused)."""

import math
import struct
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from flipgate.errors import InputError
from flipgate.formats.files import first_line

NUMPY_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, struct.error)
ZIP_MAGIC = b"PK"  # how every zip archive (an .npz) begins
ZIP_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a member's local file header (30 bytes)
DEFLATE_MAX_RATIO = 1032  # no deflate stream expands more than this: larger claims are lies
ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate",
               zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}  # what zipfile reads


@dataclass(frozen=True)
class NpyHeader:
    """What an .npy header declares: enough to refuse an array before allocating it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool = False
    data_offset: int | None = None  # where the raw data starts in the file, if uncompressed

    @classmethod
    def of(cls, array: np.ndarray) -> "NpyHeader":
        return cls(tuple(array.shape), array.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def npz_headers(path: Path, *, source: str) -> dict[str, NpyHeader]:
    """The header of every array in an .npz archive, read without reading the arrays."""
    with path.open("rb") as raw:
        if raw.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX:
            raise InputError("evalset_not_npz", f"{source}: expected an .npz archive holding "
                               "arrays 'x' and 'y', found a single array")
    with zipfile.ZipFile(path) as archive, path.open("rb") as raw:
        _check_members(archive.infolist(), source)
        return {info.filename.removesuffix(".npy"): _member_header(archive, raw, info, source)
                for info in archive.infolist() if info.filename.endswith(".npy")}


def _check_members(members: list[zipfile.ZipInfo], source: str) -> None:
    """No member encrypted or compressed by a method zipfile cannot read, and no name twice
    (readers disagree on which of two they read)."""
    for info in members:
        if info.compress_type not in ZIP_METHODS:
            raise InputError("npz_compression", f"{source}: member {info.filename!r} is "
                             f"compressed with zip method {info.compress_type}, which flipgate "
                             f"cannot read; use one of {sorted(ZIP_METHODS.values())} "
                             "(np.savez or np.savez_compressed)")
    if encrypted := [info.filename for info in members if info.flag_bits & 1]:
        raise InputError("evalset_encrypted", f"{source}: members {encrypted} are encrypted; "
                         "store the arrays without a password")
    counts = Counter(info.filename for info in members)
    if twice := sorted(name for name, count in counts.items() if count > 1):
        raise InputError("evalset_duplicate_member", f"{source}: the archive holds "
                         f"{twice} more than once")


def _member_header(archive: zipfile.ZipFile, raw: BinaryIO, info: zipfile.ZipInfo,
                   source: str) -> NpyHeader:
    with archive.open(info) as member:
        shape, fortran_order, dtype = read_npy_header(member, source=source)
        header_bytes = member.tell()
    _check_declared_size(info, header_bytes + math.prod(shape) * dtype.itemsize, source)
    offset = None
    if info.compress_type == zipfile.ZIP_STORED:
        raw.seek(info.header_offset)
        fields = ZIP_LOCAL_HEADER.unpack(raw.read(ZIP_LOCAL_HEADER.size))
        offset = (info.header_offset + ZIP_LOCAL_HEADER.size + fields[-2] + fields[-1]
                  + header_bytes)
    return NpyHeader(shape, dtype, fortran_order, offset)


def _check_declared_size(info: zipfile.ZipInfo, declared: int, source: str) -> None:
    """An array's header must agree with its member's size, and that size with what its
    compressed bytes can expand to, so that a lying header never gets its memory."""
    expandable = info.compress_size * (1 if info.compress_type == zipfile.ZIP_STORED
                                       else DEFLATE_MAX_RATIO)
    if declared != info.file_size or info.file_size > expandable + 1024:
        raise ValueError(f"{info.filename} declares {declared} bytes but holds "
                         f"{info.file_size} ({info.compress_size} compressed)")


def read_npy_header(handle: BinaryIO, *, source: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype of the .npy data at `handle`, which is left at the
    start of the raw data; object and structured arrays are refused."""
    version = np.lib.format.read_magic(handle)
    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f"unsupported .npy format version {version}")
    shape, fortran_order, dtype = readers[version](handle)
    if dtype.hasobject:
        raise InputError("object_array", f"{source}: holds an array of Python objects; "
                           "flipgate never unpickles data, store plain numeric arrays")
    if dtype.fields is not None or dtype.subdtype is not None:
        raise InputError("npy_dtype", f"{source}: structured arrays are not supported")
    return tuple(shape), fortran_order, dtype


def single_npy_header(path: Path, *, source: str, what: str) -> NpyHeader:
    """The header of a one-array .npy file of `what` (an .npz archive is refused)."""
    if zipfile.is_zipfile(path):
        raise npz_not_npy(what, source)
    with path.open("rb") as handle:
        shape, _, dtype = read_npy_header(handle, source=source)
        return NpyHeader(shape, dtype, data_offset=handle.tell())


def npz_not_npy(what: str, source: str) -> InputError:
    """The refusal of an .npz archive where one .npy array of `what` belongs."""
    return InputError(f"{what}_not_npy", f"{source}: expected one .npy array of {what}, "
                      "found an .npz archive")


def check_data_size(header: NpyHeader, size: int) -> None:
    """A file of `size` bytes holds exactly the data its header declares."""
    if size != header.data_offset + header.nbytes:
        raise ValueError(f"the header declares {header.nbytes} bytes of data, the file "
                         f"holds {size - header.data_offset}")


def unreadable(error: Exception, source: str, code: str, expected: str) -> InputError:
    """The refusal of a file numpy could not read as `expected` (`code`; `object_array` for
    one that holds pickled objects)."""
    if "allow_pickle" in str(error):
        return InputError("object_array", f"{source}: holds an array of Python objects; "
                            "flipgate never unpickles data, store plain numeric arrays")
    return InputError(code, f"{source}: not {expected} ({first_line(error)})")

