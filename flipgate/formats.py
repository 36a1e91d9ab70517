"""Reading and validating what users hand to flipgate: eval sets, logits and ONNX models.

Nothing here unpickles: arrays are read with allow_pickle=False and ONNX files are parsed
as protobuf. Every refusal is an InputError with a machine-readable code.
"""

import io
import math
import struct
import zipfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from flipgate import onnx_bytes as proto
from flipgate.errors import InputError
from flipgate.metrics.chunks import release
from flipgate.onnx_io import InputSpec, OutputSpec, model_inputs, scores_output

if TYPE_CHECKING:  # imported where a model is read: 45 ms that .npy files never need
    import onnx

NUMPY_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, struct.error)
MAX_CLASSES = 1 << 20  # labels and logits columns
MAX_SAMPLE_ELEMENTS = 1 << 26  # numbers in one sample (256 MiB of float32)
MAX_FIXED_BATCH = 1 << 16  # a model that insists on a larger batch cannot be scored
MAX_INITIALIZERS = 100_000
INPUT_NAME, OUTPUT_NAME = "input", "logits"  # what flipgate's own exports call them
CHECK_CHUNK_BYTES = 64 << 20  # how much of an array a value check holds at once
ZIP_MAGIC = b"PK"  # how every zip archive (an .npz) begins
ZIP_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a member's local file header (30 bytes)
DEFLATE_MAX_RATIO = 1032  # no deflate stream expands more than this: larger claims are lies
ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate",
               zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}  # what zipfile reads


OPTIONAL_ARRAYS = ("classes", "groups", "text", "images", "ids")  # arrays no model reads
MAX_ID_LENGTH = 256  # characters of a sample's id (a request id a serving system logged)
INPUT_KINDS = "fiubU"  # floats, integers, bools and fixed-width unicode strings


@dataclass(frozen=True)
class EvalSet:
    """An evaluation set: the model inputs (`x` for single-input models, else in `inputs` by
    name; each possibly memory-mapped, samples on the first axis), labels y (N,) (int64
    column indices, or strings until `indexed` maps them to columns; None for a traffic set,
    docs/traffic.md), and optionally a group (slice) per sample, the class names, what people
    look at (text, images) and an id per sample (a serving system's request id)."""

    x: np.ndarray | None
    y: np.ndarray | None
    groups: np.ndarray | None = None
    inputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    classes: tuple[str, ...] | None = None
    text: np.ndarray | None = None
    images: np.ndarray | None = None
    ids: np.ndarray | None = None

    @property
    def n(self) -> int:
        if self.y is not None:
            return int(self.y.size)
        return int(next(iter(self.arrays().values())).shape[0])

    @property
    def labeled(self) -> bool:
        """Whether the set has labels (False: a traffic set)."""
        return self.y is not None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample of `x` (or of the only input); () for several inputs."""
        arrays = self.arrays()
        return tuple(next(iter(arrays.values())).shape[1:]) if len(arrays) == 1 else ()

    def arrays(self) -> dict[str, np.ndarray]:
        """Every input array by name, `x` included."""
        return {**({"x": self.x} if self.x is not None else {}), **self.inputs}

    @property
    def labels_named(self) -> bool:
        """Whether y holds class names rather than column indices."""
        return self.y is not None and self.y.dtype.kind == "U"

    def indexed(self, class_names: Sequence[str], *, source: str) -> "EvalSet":
        """This set with string labels mapped to the columns that `class_names` name."""
        if not self.labels_named:
            return self
        return replace(self, y=label_columns(self.y, class_names, source=source),
                       classes=tuple(str(name) for name in class_names))


def label_columns(labels: np.ndarray, class_names: Sequence[str] | None, *,
                  source: str = "eval set") -> np.ndarray:
    """Labels as int64 column indices: integers as they are, class-name strings mapped to
    the columns `class_names` names (an eval set's `classes`, a model's class labels, or on
    the server its line's). A name that no column has is refused (`unknown_class_name`),
    names without any class names too (`labels_need_class_names`). Every caller that maps an
    eval set's names to columns goes through here."""
    if labels.dtype.kind != "U":
        return labels.astype(np.int64)
    if not class_names:
        raise InputError("labels_need_class_names", f"{source}: y holds class names, but no "
                           "class names are known to map them to columns (an array `classes` "
                           "in the eval set, or a model that names its classes)")
    columns = {str(name): column for column, name in enumerate(class_names)}
    names, positions = np.unique(labels, return_inverse=True)
    if unknown := [name for name in names.tolist() if name not in columns]:
        raise InputError("unknown_class_name", f"{source}: label {unknown[0]!r} names no "
                           f"class (the classes are {list(columns)})")
    return np.array([columns[name] for name in names.tolist()], dtype=np.int64)[
        positions.reshape(labels.shape)]


def load_evalset(path: str | Path, *, max_decompressed_bytes: int | None = None,
                 mmap: bool = False, source: str | None = None) -> EvalSet:
    """Load an eval set .npz: `y` (integer or string labels; without it, a traffic set), the
    inputs (`x`, or one array per model input named as the input) and optionally `classes`
    (C names), `groups` (one integer or string per sample), `text` (one string per sample),
    `images` and `ids` (one unique string per sample).

    The array headers are checked before anything is allocated: every header must agree with
    the bytes the file holds, and compressed arrays may not expand beyond
    `max_decompressed_bytes` together. With `mmap`, inputs stored uncompressed (np.savez) are
    memory-mapped instead of read. Messages name the file as `source` (default: its path)."""
    path = _existing(path, "eval set", source)
    source = source or str(path)
    try:
        headers = npz_headers(path, source=source)
        _check_evalset_headers(headers, max_decompressed_bytes, source)
        arrays = {name: _read_member(path, name, header, mmap=mmap)
                  for name, header in headers.items()}
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise _unreadable(error, source, "evalset_corrupt", "a readable .npz archive") from error
    return evalset_of(arrays, source=source)


def load_training_set(path: str | Path, *, source: str | None = None) -> EvalSet:
    """An eval-set .npz that flipgate's recipes can train on: a float `x` and labels that
    are column indices (integers, or names mapped by `classes`)."""
    data = load_evalset(path, source=source)
    if data.x is None or data.x.dtype.kind != "f" or data.labels_named:
        raise InputError("training_set_format", f"{source or path}: training needs a float "
                           "array `x` and integer labels (or class names with `classes`)")
    return data


def evalset_of(arrays: Mapping[str, np.ndarray], *, source: str = "eval set") -> EvalSet:
    """An eval set from its named arrays, checked (see load_evalset)."""
    inputs = {name: array for name, array in arrays.items()
              if name not in ("y", "x", *OPTIONAL_ARRAYS)}
    evalset = validate_evalset(arrays.get("x"), arrays.get("y"), groups=arrays.get("groups"),
                               inputs=inputs, source=source)
    shown = {name: arrays.get(name) for name in ("text", "images", "ids")}
    for name, array in shown.items():
        if array is not None:
            _check_shown(name, array, evalset.n, source)
    evalset = replace(evalset, **shown)
    if "classes" in arrays:
        evalset = _with_classes(evalset, arrays["classes"], source)
    return evalset


def validate_evalset(x: np.ndarray | None, y: np.ndarray | None, *,
                     groups: np.ndarray | None = None,
                     inputs: Mapping[str, np.ndarray] | None = None,
                     source: str = "eval set") -> EvalSet:
    """Check shapes, dtypes and values of an eval set (arrays in memory or memory-mapped);
    without `y`, of a traffic set."""
    named = {**({"x": x} if x is not None else {}), **(inputs or {})}
    _check_arrays({name: _Header.of(array) for name, array in named.items()},
                  None if y is None else _Header.of(y), source)
    if y is not None and y.dtype.kind != "U":
        check_labels(y, None, source=source)
        y = y.astype(np.int64)
    if groups is not None:
        _check_groups(groups, next(iter(named.values())).shape[0], source)
    if x is not None and np.issubdtype(x.dtype, np.floating) and x.dtype != np.float32:
        x = _cast(x, np.dtype(np.float32), f"{source}: x")
    return EvalSet(x=x, y=y, groups=groups, inputs=dict(inputs or {}))


def _with_classes(evalset: EvalSet, classes: np.ndarray, source: str) -> EvalSet:
    """The eval set naming its C columns `classes` (unique strings), string labels mapped."""
    if classes.ndim != 1 or classes.dtype.kind not in "iU" or not 2 <= classes.size <= MAX_CLASSES:
        raise InputError("evalset_classes", f"{source}: classes must be a 1-D array of 2 to "
                           f"{MAX_CLASSES} names, got {classes.dtype} {classes.shape}")
    names = tuple(str(name) for name in classes.tolist())
    if len(set(names)) != len(names):
        raise InputError("evalset_classes", f"{source}: classes must be unique, got {names}")
    if evalset.labeled and not evalset.labels_named:
        check_labels(evalset.y, len(names), source=source)
    return replace(evalset.indexed(names, source=source), classes=names)


SHOWN_SHAPES = {"text": "one string per sample", "ids": "one unique string per sample of "
                f"at most {MAX_ID_LENGTH} characters",
                "images": "uint8 of shape (N, H, W) or (N, H, W, 3)"}


def _check_shown(name: str, array: np.ndarray, n: int, source: str) -> None:
    """text: one string per sample; ids: one unique string per sample; images: (N, H, W) or
    (N, H, W, 3) uint8."""
    strings = array.ndim == 1 and array.dtype.kind == "U"
    fits = {"text": strings,
            "ids": strings and array.dtype.itemsize <= 4 * MAX_ID_LENGTH
            and np.unique(array).size == array.size,
            "images": array.dtype == np.uint8 and (
                array.ndim == 3 or (array.ndim == 4 and array.shape[3] == 3))}[name]
    if not fits or array.shape[0] != n:
        raise InputError(f"evalset_{name}", f"{source}: {name} must be {SHOWN_SHAPES[name]} "
                           f"for {n} samples, got {array.dtype} {array.shape}")


def cast_input(array: np.ndarray, dtype: np.dtype, *, source: str) -> np.ndarray:
    """`array` as `dtype`, refused (naming `source`) unless every value survives the cast;
    NaN and infinities survive a cast between float types. Checked a chunk at a time."""
    if array.dtype == dtype:
        return array
    for chunk in row_chunks(array):
        _cast(chunk, dtype, source)
    return array


def _cast(array: np.ndarray, dtype: np.dtype, source: str) -> np.ndarray:
    """`array` cast to `dtype` if every value survives (floats: within range), else refused."""
    if (array.dtype.kind == "U") != (dtype.kind == "U"):
        raise InputError("input_dtype", f"{source}: {array.dtype} cannot be fed to an input "
                           f"of type {dtype}")
    if dtype.kind == "U":
        return array
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(dtype)
        if array.dtype.kind == "f" and dtype.kind == "f":
            lossless = not (np.isinf(cast) & np.isfinite(array)).any()
        else:
            lossless = bool(np.array_equal(cast.astype(array.dtype), array))
    if not lossless:
        raise InputError("input_cast", f"{source}: some values of this {array.dtype} array do "
                           f"not survive a cast to the model's {dtype}")
    return cast


@dataclass(frozen=True)
class _Header:
    """What an .npy header declares: enough to refuse an array before allocating it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool = False
    data_offset: int | None = None  # where the raw data starts in the file, if uncompressed

    @classmethod
    def of(cls, array: np.ndarray) -> "_Header":
        return cls(tuple(array.shape), array.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def npz_headers(path: Path, *, source: str) -> dict[str, _Header]:
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
                   source: str) -> _Header:
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
    return _Header(shape, dtype, fortran_order, offset)


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


def _check_evalset_headers(headers: dict[str, _Header], max_decompressed_bytes: int | None,
                           source: str) -> None:
    """Arrays present, of the right kinds and shapes, compressed ones within the limit."""
    inputs = {name: header for name, header in headers.items()
              if name not in ("y", *OPTIONAL_ARRAYS)}
    if not inputs:
        raise InputError("evalset_missing_array", f"{source}: the archive has no array 'x' "
                           f"(or one array per model input) (it has {sorted(headers)})")
    _check_arrays(inputs, headers.get("y"), source)
    total = sum(header.nbytes for header in headers.values() if header.data_offset is None)
    if max_decompressed_bytes is not None and total > max_decompressed_bytes:
        raise InputError("evalset_too_large", f"{source}: its compressed arrays expand to "
                           f"{total} bytes, above the limit of {max_decompressed_bytes}; store "
                           "large eval sets uncompressed (np.savez)")


def _check_arrays(inputs: Mapping[str, _Header], y: _Header | None, source: str) -> None:
    """y (absent in a traffic set): one integer or string label per sample; every input:
    samples on the first axis, as many as labels, of a dtype a model input can take,
    non-empty samples of bounded size."""
    if y is not None and (len(y.shape) != 1 or y.dtype.kind not in "iuU"):
        raise InputError("evalset_y_dtype", f"{source}: y must be a 1-D array of integer "
                           f"or string labels, got {y.dtype} with shape {y.shape}")
    first = y if y is not None else next(iter(inputs.values()))
    if not first.shape or first.shape[0] == 0:
        raise InputError("empty", f"{source}: the eval set has no samples")
    for name, header in inputs.items():
        if len(header.shape) < 1 or header.dtype.kind not in INPUT_KINDS:
            raise InputError(f"evalset_{name}_dtype" if name == "x" else "evalset_input_dtype",
                             f"{source}: {name} must be an array of floats, integers, bools "
                             f"or strings with the samples on the first axis, got "
                             f"{header.dtype} with shape {header.shape}")
        if header.shape[0] != first.shape[0]:
            counted = (f"y has {first.shape[0]} labels" if y is not None
                       else f"the first input has {first.shape[0]}")
            raise InputError("length_mismatch", f"{source}: {name} has {header.shape[0]} "
                               f"samples but {counted}")
        _check_sample_shape(header.shape[1:] or (1,), f"{source}: {name}")


def _check_sample_shape(shape: tuple[int, ...], source: str) -> None:
    """A sample holds at least one and at most MAX_SAMPLE_ELEMENTS numbers."""
    elements = math.prod(shape)
    if elements == 0:
        raise InputError("empty_samples", f"{source}: samples of shape {shape} hold no values")
    if elements > MAX_SAMPLE_ELEMENTS:
        raise InputError("sample_too_large", f"{source}: samples of shape {shape} hold "
                           f"{elements} values, above the limit of {MAX_SAMPLE_ELEMENTS}")


def _check_groups(groups: np.ndarray, n: int, source: str) -> None:
    """Groups: one integer or string per sample."""
    if groups.ndim != 1 or groups.dtype.kind not in "iuU":
        raise InputError("evalset_groups", f"{source}: groups must be a 1-D array of "
                           f"integers or strings, got {groups.dtype} with shape {groups.shape}")
    if groups.size != n:
        raise InputError("length_mismatch", f"{source}: groups has {groups.size} entries "
                           f"for {n} samples")


def _read_member(path: Path, name: str, header: _Header, *, mmap: bool) -> np.ndarray:
    """An array of an .npz: memory-mapped when asked and stored uncompressed in C order, else
    read (its size was checked against the limit)."""
    if mmap and header.data_offset is not None and not header.fortran_order \
            and name not in ("y", *OPTIONAL_ARRAYS):
        return np.memmap(path, dtype=header.dtype, mode="r", offset=header.data_offset,
                         shape=header.shape)
    with np.load(path, allow_pickle=False) as archive:
        return archive[name]


def check_labels(labels: np.ndarray, num_classes: int | None, *, source: str) -> None:
    """Labels must lie in [0, num_classes) (in [0, MAX_CLASSES) when num_classes is None)."""
    limit = MAX_CLASSES if num_classes is None else num_classes
    bad = (labels < 0) | (labels >= limit)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        label = int(labels[first])
        allowed = (f"lie in [0, {num_classes})" if num_classes is not None else
                   "be >= 0" if label < 0 else f"lie below {MAX_CLASSES} (the class limit)")
        raise InputError("labels_out_of_range", f"{source}: labels must {allowed}; label "
                           f"{label} at index {first} does not")


def load_logits(path: str | Path, *, mmap: bool = False, source: str | None = None,
                non_finite: int | None = None) -> np.ndarray:
    """Load (N, C) float logits from a .npy file, memory-mapped with `mmap`; the header is
    checked against the file before the data is read. `non_finite`: the count of NaN or
    infinite values when it was taken already (flipgate.logits_scan): then the values are
    not read here."""
    path = _existing(path, "logits", source)
    source = source or str(path)
    try:
        header = single_npy_header(path, source=source, what="logits")
        _check_logits_header(header, source)
        _check_data_size(header, path.stat().st_size)
        logits = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise _unreadable(error, source, "logits_corrupt", "a readable .npy array") from error
    if non_finite is None:
        return validate_logits(logits, source=source)
    _refuse_non_finite(non_finite, source)
    return logits


def check_logits_head(head: bytes, size: int, *, source: str,
                      non_finite: int) -> tuple[int, ...]:
    """`load_logits`' checks of an .npy of `size` bytes known by its first bytes `head`
    (holding its header) and the count of its NaN or infinite values (flipgate.logits_scan:
    a body streamed elsewhere, never read again); the shape it declares."""
    try:
        if head.startswith(ZIP_MAGIC):
            raise _npz_not_npy("logits", source)
        handle = io.BytesIO(head)
        shape, fortran_order, dtype = read_npy_header(handle, source=source)
        header = _Header(shape, dtype, fortran_order, data_offset=handle.tell())
        _check_logits_header(header, source)
        _check_data_size(header, size)
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise _unreadable(error, source, "logits_corrupt", "a readable .npy array") from error
    _refuse_non_finite(non_finite, source)
    return shape


def _check_data_size(header: _Header, size: int) -> None:
    """A file of `size` bytes holds exactly the data its header declares."""
    if size != header.data_offset + header.nbytes:
        raise ValueError(f"the header declares {header.nbytes} bytes of data, the file "
                         f"holds {size - header.data_offset}")


def _npz_not_npy(what: str, source: str) -> InputError:
    return InputError(f"{what}_not_npy", f"{source}: expected one .npy array of {what}, "
                      "found an .npz archive")


def single_npy_header(path: Path, *, source: str, what: str) -> _Header:
    """The header of a one-array .npy file of `what` (an .npz archive is refused)."""
    if zipfile.is_zipfile(path):
        raise _npz_not_npy(what, source)
    with path.open("rb") as handle:
        shape, _, dtype = read_npy_header(handle, source=source)
        return _Header(shape, dtype, data_offset=handle.tell())


def _check_logits_header(header: _Header, source: str) -> None:
    """Floats of shape (N, C) with N >= 1 and 2 <= C <= MAX_CLASSES."""
    if not np.issubdtype(header.dtype, np.floating):
        raise InputError("logits_dtype", f"{source}: logits must be floats, "
                           f"got {header.dtype}")
    shape = header.shape
    if len(shape) != 2 or shape[0] == 0 or shape[1] < 2:
        raise InputError("logits_shape", f"{source}: logits must have shape (N, C) with "
                           f"N >= 1 and C >= 2, got {shape}")
    if shape[1] > MAX_CLASSES:
        raise InputError("too_many_classes", f"{source}: {shape[1]} classes, above the "
                           f"limit of {MAX_CLASSES}")


def validate_logits(logits: np.ndarray, *, source: str = "logits") -> np.ndarray:
    """Logits must be a finite float array of shape (N, C) with N >= 1 and C >= 2."""
    _check_logits_header(_Header.of(logits), source)
    _require_finite(logits, source)
    return logits


def check_logits_match(logits: np.ndarray, evalset: EvalSet, *, source: str) -> None:
    """Logits must have one row per eval-set sample and a column for every label."""
    if logits.shape[0] != evalset.n:
        raise InputError("length_mismatch", f"{source}: {logits.shape[0]} rows of logits "
                           f"for an eval set of {evalset.n} samples")
    if evalset.labeled:
        check_labels(evalset.y, logits.shape[1], source=f"eval set scored by {source}")


@dataclass(frozen=True)
class OnnxSpec:
    """The interface of an ONNX classifier: its named inputs and the output read as scores."""

    inputs: tuple[InputSpec, ...]
    output: OutputSpec

    @property
    def input_name(self) -> str:
        return self.inputs[0].name

    @property
    def input_shape(self) -> tuple[int | None, ...]:
        return self.inputs[0].shape

    @property
    def output_name(self) -> str:
        return self.output.name

    @property
    def num_classes(self) -> int:
        return self.output.num_classes

    @property
    def fixed_batch(self) -> int | None:
        """The batch size the model insists on, or None when the batch axis is dynamic."""
        return self.inputs[0].shape[0]

    def check_sample_shape(self, sample_shape: tuple[int, ...], *, source: str) -> None:
        """Refuse samples whose shape the (first) input cannot take."""
        check_input_shape(self.inputs[0], sample_shape, source=source)

    def describe(self) -> dict[str, object]:
        """Which inputs it is fed, which output is read and as what (for reports)."""
        return {"inputs": [spec.describe() for spec in self.inputs],
                "output": self.output.name, "scores": self.output.kind}


def check_input_shape(spec: InputSpec, sample_shape: tuple[int, ...], *, source: str) -> None:
    """Refuse samples whose shape the model input `spec` cannot take."""
    expected = spec.shape[1:]
    fits = len(expected) == len(sample_shape) and all(
        want is None or want == got for want, got in zip(expected, sample_shape, strict=True))
    if not fits:
        shown = tuple("N" if d is None else d for d in spec.shape)
        raise InputError("onnx_input_shape", f"{source}: the model's input {spec.name!r} has "
                           f"shape {shown} but the eval set's samples have shape "
                           f"{sample_shape}")


def inspect_onnx(path: str | Path, *, source: str | None = None, output: str | None = None,
                 scores: str | None = None) -> OnnxSpec:
    """Parse and validate an ONNX classifier without running it; `output` and `scores`
    override the chosen scores output and what its scores are (see flipgate.onnx_io);
    messages name it `source`."""
    import onnx

    path = _existing(path, "model", source)
    source = source or str(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
        _check_external_data(model, path, source)
        _check_initializer_count(model, source)
        onnx.checker.check_model(str(path))  # by path: external data beside the model
    except InputError:
        raise
    except Exception as error:  # protobuf and checker raise many types for corrupt input
        raise InputError("onnx_corrupt", f"{source}: not a valid ONNX model "
                           f"({_explain(error)})") from error
    inputs = model_inputs(model, source)
    for spec in inputs:
        _check_input_dims(spec.shape, f"{source}: input {spec.name!r}")
    return OnnxSpec(inputs, scores_output(model, source, output=output, scores=scores))


def _check_initializer_count(model: "onnx.ModelProto", source: str) -> None:
    count = len(model.graph.initializer)
    if count > MAX_INITIALIZERS:
        raise InputError("onnx_too_many_initializers", f"{source}: {count} initializers, "
                           f"above the limit of {MAX_INITIALIZERS}")


def _check_input_dims(dims: tuple[int | None, ...], source: str) -> None:
    """A batch axis (dynamic, or fixed up to MAX_FIXED_BATCH) and a bounded, fixed sample."""
    if not dims:
        raise InputError("onnx_input_shape", f"{source}: the input needs a batch axis")
    if dims[0] is not None and not 1 <= dims[0] <= MAX_FIXED_BATCH:
        raise InputError("onnx_fixed_batch", f"{source}: the model insists on a batch of "
                           f"{dims[0]}; at most {MAX_FIXED_BATCH} is supported")
    if any(dim == 0 for dim in dims[1:]):
        raise InputError("empty_samples", f"{source}: input samples of shape {dims[1:]} "
                           "hold no values")
    _check_sample_shape(tuple(dim or 1 for dim in dims[1:]), source)


def _check_external_data(model: "onnx.ModelProto", path: Path, source: str) -> None:
    """External tensors must be files inside the model's own folder."""
    folder = path.parent.resolve()
    for tensor in _all_tensors(model.graph):
        if tensor.data_location != proto.EXTERNAL:
            continue
        location = _location(tensor)
        target = (folder / location).resolve()
        if not target.is_relative_to(folder) or target == folder:
            raise InputError("onnx_external_data", f"{source}: tensor {tensor.name!r} points "
                               f"to external data {location!r} outside the model's folder")
        if not target.is_file():
            raise InputError("onnx_external_data", f"{source}: tensor {tensor.name!r} needs "
                               f"external data file {location!r}, which does not exist")


def external_data_names(path: str | Path, *, source: str | None = None) -> set[str]:
    """The files (relative to the model's folder) that an ONNX model's external tensors name;
    the model is parsed without reading them."""
    import onnx

    path = _existing(path, "model", source)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf raises many types for corrupt input
        raise InputError("onnx_corrupt", f"{source or path}: not a valid ONNX model "
                           f"({_explain(error)})") from error
    return {_location(tensor) for tensor in _all_tensors(model.graph)
            if tensor.data_location == proto.EXTERNAL}


def _location(tensor: "onnx.TensorProto") -> str:
    return next((entry.value for entry in tensor.external_data if entry.key == "location"), "")


def _all_tensors(graph: "onnx.GraphProto"):
    """Initializers and tensor attributes of a graph and all of its subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            yield from ([attribute.t] if attribute.HasField("t") else [])
            yield from attribute.tensors
            for subgraph in [attribute.g] if attribute.HasField("g") else []:
                yield from _all_tensors(subgraph)
            for subgraph in attribute.graphs:
                yield from _all_tensors(subgraph)


def _unreadable(error: Exception, source: str, code: str, expected: str) -> InputError:
    if "allow_pickle" in str(error):
        return InputError("object_array", f"{source}: holds an array of Python objects; "
                            "flipgate never unpickles data, store plain numeric arrays")
    return InputError(code, f"{source}: not {expected} ({_explain(error)})")


def _require_finite(array: np.ndarray, source: str) -> None:
    """No NaN or infinity, checked a chunk of rows at a time (memory-mapped arrays stay so)."""
    _refuse_non_finite(sum(chunk.size - np.count_nonzero(np.isfinite(chunk))
                           for chunk in row_chunks(array)), source)


def _refuse_non_finite(bad: int, source: str) -> None:
    if bad:
        raise InputError("non_finite", f"{source} contains {bad} NaN or infinite values")


def row_chunks(array: np.ndarray, chunk_bytes: int = CHECK_CHUNK_BYTES) -> Iterator[np.ndarray]:
    """Consecutive slices of `array` along its first axis of about `chunk_bytes` each; a
    memory-mapped array's pages are handed back once a slice has been used, so a check over
    a file of any size keeps about one chunk resident."""
    if array.ndim == 0:
        yield array
        return
    row_bytes = max(1, array[:1].nbytes)
    step = max(1, chunk_bytes // row_bytes)
    for start in range(0, array.shape[0], step):
        yield array[start:start + step]
        release(array, start, start + step)


def _existing(path: str | Path, what: str, source: str | None = None) -> Path:
    path = Path(path)
    if not path.is_file():
        raise InputError("file_not_found", f"{source or path}: no such {what} file")
    return path


def _explain(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
