"""Eval sets: the named arrays of an .npz (model inputs, labels, and what people look at),
their headers checked before anything is allocated."""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from flipgate.errors import InputError
from flipgate.formats.files import existing_file
from flipgate.formats.npy import NUMPY_READ_ERRORS, NpyHeader, npz_headers, unreadable
from flipgate.metrics.chunks import row_chunks

MAX_CLASSES = 1 << 20  # labels and logits columns
MAX_SAMPLE_ELEMENTS = 1 << 26  # numbers in one sample (256 MiB of float32)
OPTIONAL_ARRAYS = ("classes", "groups", "text", "images", "ids")  # arrays no model reads
MAX_ID_LENGTH = 256  # characters of a sample's id (a request id a serving system logged)
INPUT_KINDS = "fiubU"  # floats, integers, bools and fixed-width unicode strings


@dataclass(frozen=True)
class EvalSet:
    """An evaluation set: the model inputs (`x` for single-input models, else in `inputs` by
    name; each possibly memory-mapped, samples on the first axis), labels y (N,) (int64
    column indices, or strings until `indexed` maps them to columns; None for a traffic set,
    docs/traffic.md) or, multi-label, a bool matrix (N, L) of the labels each sample has,
    and optionally a group (slice) per sample, the class names, what people
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
            return int(self.y.shape[0])
        return int(next(iter(self.arrays().values())).shape[0])

    @property
    def labeled(self) -> bool:
        """Whether the set has labels (False: a traffic set)."""
        return self.y is not None

    @property
    def multilabel(self) -> bool:
        """Whether y is a matrix (N, L) of labels that each sample has or not."""
        return self.y is not None and self.y.ndim == 2

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample of `x` (or of the only input); () for several inputs."""
        arrays = self.arrays()
        return tuple(next(iter(arrays.values())).shape[1:]) if len(arrays) == 1 else ()

    def arrays(self) -> dict[str, np.ndarray]:
        """Every input array by name, `x` included."""
        return {**({"x": self.x} if self.x is not None else {}), **self.inputs}

    def shown_arrays(self) -> dict[str, np.ndarray]:
        """What people may look at, by name: every input, and `text` and `images` when the
        set has them (flipgate.reporting.gallery.SampleView chooses among them)."""
        return {**self.arrays(), **{name: array for name, array in
                                    (("text", self.text), ("images", self.images))
                                    if array is not None}}

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
                 mmap: bool = False, source: str | None = None,
                 multilabel: bool = False) -> EvalSet:
    """Load an eval set .npz: `y` (integer or string labels; without it, a traffic set; with
    `multilabel`, also a 0/1 matrix (N, L) or label-name sets, see `label_sets_matrix`), the
    inputs (`x`, or one array per model input named as the input) and optionally `classes`
    (C names), `groups` (one integer or string per sample), `text` (one string per sample),
    `images` and `ids` (one unique string per sample).

    The array headers are checked before anything is allocated: every header must agree with
    the bytes the file holds, and compressed arrays may not expand beyond
    `max_decompressed_bytes` together. With `mmap`, inputs stored uncompressed (np.savez) are
    memory-mapped instead of read. Messages name the file as `source` (default: its path)."""
    path = existing_file(path, "eval set", source)
    source = source or str(path)
    try:
        headers = npz_headers(path, source=source)
        _check_evalset_headers(headers, max_decompressed_bytes, source, multilabel)
        arrays = {name: _read_member(path, name, header, mmap=mmap)
                  for name, header in headers.items()}
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise unreadable(error, source, "evalset_corrupt", "a readable .npz archive") from error
    return evalset_of(arrays, source=source, multilabel=multilabel)


def load_training_set(path: str | Path, *, source: str | None = None,
                      multilabel: bool = False) -> EvalSet:
    """An eval-set .npz that flipgate's recipes can train on: a float `x` and labels that
    are column indices (integers, or names mapped by `classes`), or with `multilabel` also a
    0/1 label matrix (N, L) (see load_evalset)."""
    data = load_evalset(path, source=source, multilabel=multilabel)
    if data.x is None or data.x.dtype.kind != "f" or data.labels_named:
        raise InputError("training_set_format", f"{source or path}: training needs a float "
                           "array `x` and integer labels (or class names with `classes`)")
    return data


def evalset_of(arrays: Mapping[str, np.ndarray], *, source: str = "eval set",
               multilabel: bool = False) -> EvalSet:
    """An eval set from its named arrays, checked (see load_evalset)."""
    inputs = {name: array for name, array in arrays.items()
              if name not in ("y", "x", *OPTIONAL_ARRAYS)}
    evalset = validate_evalset(arrays.get("x"), arrays.get("y"), groups=arrays.get("groups"),
                               inputs=inputs, source=source, multilabel=multilabel)
    shown = {name: arrays.get(name) for name in ("text", "images", "ids")}
    for name, array in shown.items():
        if array is not None:
            _check_shown(name, array, evalset.n, source)
    evalset = replace(evalset, **shown)
    if "classes" in arrays:
        evalset = _with_classes(evalset, arrays["classes"], source)
    elif evalset.multilabel and evalset.labels_named:
        raise InputError("labels_need_class_names", f"{source}: y holds label names; add an "
                           "array `classes` that names the L labels")
    return evalset


def validate_evalset(x: np.ndarray | None, y: np.ndarray | None, *,
                     groups: np.ndarray | None = None,
                     inputs: Mapping[str, np.ndarray] | None = None,
                     source: str = "eval set", multilabel: bool = False) -> EvalSet:
    """Check shapes, dtypes and values of an eval set (arrays in memory or memory-mapped);
    without `y`, of a traffic set; with `multilabel`, y may be a label matrix (N, L)."""
    named = {**({"x": x} if x is not None else {}), **(inputs or {})}
    _check_arrays({name: NpyHeader.of(array) for name, array in named.items()},
                  None if y is None else NpyHeader.of(y), source, multilabel)
    if y is not None and y.ndim == 2 and y.dtype.kind != "U":
        y = _label_matrix(y, source)
    elif y is not None and y.dtype.kind != "U":
        check_labels(y, None, source=source)
        y = y.astype(np.int64)
    if groups is not None:
        _check_groups(groups, next(iter(named.values())).shape[0], source)
    if x is not None and np.issubdtype(x.dtype, np.floating) and x.dtype != np.float32:
        x = _cast(x, np.dtype(np.float32), f"{source}: x")
    return EvalSet(x=x, y=y, groups=groups, inputs=dict(inputs or {}))


def _label_matrix(y: np.ndarray, source: str) -> np.ndarray:
    """A multi-label y of 0s and 1s (or bools) as a bool matrix (N, L)."""
    if y.dtype.kind != "b" and not np.isin(y, (0, 1)).all():
        raise InputError("labels_not_binary", f"{source}: a multi-label y (N, L) must hold "
                           "only 0 and 1 (whether each sample has each label)")
    return y.astype(bool)


def label_sets_matrix(label_sets: "Sequence[Iterable[str]] | np.ndarray",
                      class_names: Sequence[str], *, source: str = "eval set") -> np.ndarray:
    """Label-name sets as a multi-label y: a bool matrix (N, L) whose column j says whether a
    sample's set holds class_names[j]. The sets are a list of sets of names, or (as an .npz
    stores them) a string array (N, K) of names padded with empty strings."""
    if isinstance(label_sets, np.ndarray):
        label_sets = [[name for name in row.tolist() if name] for row in label_sets]
    rows = [(row, name) for row, names in enumerate(label_sets) for name in set(names)]
    matrix = np.zeros((len(label_sets), len(class_names)), dtype=bool)
    if rows:
        columns = label_columns(np.array([name for _, name in rows]), class_names,
                                source=source)
        matrix[[row for row, _ in rows], columns] = True
    return matrix


def _with_classes(evalset: EvalSet, classes: np.ndarray, source: str) -> EvalSet:
    """The eval set naming its C columns `classes` (unique strings), string labels mapped;
    a multi-label set's L label columns."""
    if classes.ndim != 1 or classes.dtype.kind not in "iU" or not 2 <= classes.size <= MAX_CLASSES:
        raise InputError("evalset_classes", f"{source}: classes must be a 1-D array of 2 to "
                           f"{MAX_CLASSES} names, got {classes.dtype} {classes.shape}")
    names = tuple(str(name) for name in classes.tolist())
    if len(set(names)) != len(names):
        raise InputError("evalset_classes", f"{source}: classes must be unique, got {names}")
    if evalset.multilabel:
        return _with_label_names(evalset, names, source)
    if evalset.labeled and not evalset.labels_named:
        check_labels(evalset.y, len(names), source=source)
    return replace(evalset.indexed(names, source=source), classes=names)


def _with_label_names(evalset: EvalSet, names: tuple[str, ...], source: str) -> EvalSet:
    """A multi-label set whose L columns `names` names, label-name sets mapped to columns."""
    y = label_sets_matrix(evalset.y, names, source=source) if evalset.labels_named else evalset.y
    if y.shape[1] != len(names):
        raise InputError("evalset_classes", f"{source}: classes names {len(names)} labels "
                           f"but y has {y.shape[1]} label columns")
    return replace(evalset, y=y, classes=names)


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


def _check_evalset_headers(headers: dict[str, NpyHeader], max_decompressed_bytes: int | None,
                           source: str, multilabel: bool = False) -> None:
    """Arrays present, of the right kinds and shapes, compressed ones within the limit."""
    inputs = {name: header for name, header in headers.items()
              if name not in ("y", *OPTIONAL_ARRAYS)}
    if not inputs:
        raise InputError("evalset_missing_array", f"{source}: the archive has no array 'x' "
                           f"(or one array per model input) (it has {sorted(headers)})")
    _check_arrays(inputs, headers.get("y"), source, multilabel)
    total = sum(header.nbytes for header in headers.values() if header.data_offset is None)
    if max_decompressed_bytes is not None and total > max_decompressed_bytes:
        raise InputError("evalset_too_large", f"{source}: its compressed arrays expand to "
                           f"{total} bytes, above the limit of {max_decompressed_bytes}; store "
                           "large eval sets uncompressed (np.savez)")


def _check_arrays(inputs: Mapping[str, NpyHeader], y: NpyHeader | None, source: str,
                  multilabel: bool = False) -> None:
    """y (absent in a traffic set): one integer or string label per sample (with
    `multilabel`, or a row of L 0/1 labels or of label names); every input: samples on the
    first axis, as many as labels, of a dtype a model input can take, non-empty samples of
    bounded size."""
    if y is not None and not (_single_label_y(y) or (multilabel and _multilabel_y(y))):
        also = " (or, multi-label, an (N, L) matrix of 0/1 or of label names)" \
            if multilabel else ""
        raise InputError("evalset_y_dtype", f"{source}: y must be a 1-D array of integer "
                           f"or string labels{also}, got {y.dtype} with shape {y.shape}")
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
        check_sample_size(header.shape[1:] or (1,), f"{source}: {name}")


def _single_label_y(y: NpyHeader) -> bool:
    return len(y.shape) == 1 and y.dtype.kind in "iuU"


def _multilabel_y(y: NpyHeader) -> bool:
    return len(y.shape) == 2 and y.dtype.kind in "iubU" and 1 <= y.shape[1] <= MAX_CLASSES


def check_sample_size(shape: tuple[int, ...], source: str) -> None:
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


def _read_member(path: Path, name: str, header: NpyHeader, *, mmap: bool) -> np.ndarray:
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

