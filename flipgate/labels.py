"""Predicted labels of a classifier known only by its answers (an LLM prompt, a remote API,
another runtime): an .npy of shape (N,) holding integer classes or class-name strings."""

from pathlib import Path

import numpy as np

from flipgate.errors import InputError
from flipgate.formats.files import existing_file
from flipgate.formats.npy import NUMPY_READ_ERRORS, read_npy_header, single_npy_header, unreadable
from flipgate.metrics.matrices import class_dtype


def load_predicted_labels(path: str | Path, *, num_classes: int,
                          class_names: list[str] | None = None,
                          source: str | None = None) -> np.ndarray:
    """The (N,) predicted classes in an .npy file, in `class_dtype(num_classes)`: integers in
    [0, num_classes), or strings mapped to their index in `class_names`."""
    path = existing_file(path, "labels", source)
    source = source or str(path)
    try:
        header = single_npy_header(path, source=source, what="labels")
        if len(header.shape) != 1 or header.shape[0] == 0 or header.dtype.kind not in "iuU":
            raise InputError("labels_shape", f"{source}: predicted labels must be a non-empty "
                               f"(N,) array of integers or strings, got {header.dtype} "
                               f"{header.shape}")
        labels = np.load(path, allow_pickle=False)
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise unreadable(error, source, "labels_corrupt", "a readable .npy array") from error
    return as_classes(labels, num_classes=num_classes, class_names=class_names, source=source)


def holds_labels(path: Path) -> bool:
    """Whether an .npy file holds one integer or string per sample (predicted labels) rather
    than float scores; an unreadable file is left for the logits reader to explain."""
    try:
        with Path(path).open("rb") as handle:
            shape, _, dtype = read_npy_header(handle, source=str(path))
    except (InputError, *NUMPY_READ_ERRORS):
        return False
    return len(shape) == 1 and dtype.kind in "iuU"


def as_classes(labels: np.ndarray, *, num_classes: int, class_names: list[str] | None,
               source: str) -> np.ndarray:
    """Integer labels checked to lie in [0, num_classes), or strings mapped by `class_names`,
    in `class_dtype(num_classes)`."""
    if labels.dtype.kind == "U":
        labels = _indices_of_names(labels, class_names, source)
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise InputError("labels_out_of_range", f"{source}: predicted labels must lie in "
                           f"[0, {num_classes}); label {int(labels[first])} at index {first} "
                           "does not")
    return labels.astype(class_dtype(num_classes))


def _indices_of_names(names: np.ndarray, class_names: list[str] | None,
                      source: str) -> np.ndarray:
    """Each class name's column, by `class_names`; a name not among them is refused."""
    if not class_names:
        raise InputError("labels_need_class_names", f"{source}: labels are class names, but "
                           "no class names are known to map them to classes; give integers")
    known = np.asarray(class_names)
    order = np.argsort(known)
    positions = np.searchsorted(known[order], names).clip(max=len(known) - 1)
    found = known[order][positions] == names
    if not found.all():
        first = int(np.flatnonzero(~found)[0])
        raise InputError("unknown_class_name", f"{source}: label {str(names[first])!r} at "
                           f"index {first} is not one of the classes {list(class_names)}")
    return order[positions]
