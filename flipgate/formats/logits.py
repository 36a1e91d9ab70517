"""Logits: one (N, C) float .npy of a model's scores on an eval set, its header checked
against the file before the data is read, every value finite."""

import io
from pathlib import Path

import numpy as np

from flipgate.errors import InputError
from flipgate.formats.evalsets import MAX_CLASSES, EvalSet, check_labels
from flipgate.formats.files import existing_file
from flipgate.formats.npy import (
    NUMPY_READ_ERRORS,
    ZIP_MAGIC,
    NpyHeader,
    check_data_size,
    npz_not_npy,
    read_npy_header,
    single_npy_header,
    unreadable,
)
from flipgate.metrics.chunks import row_chunks


def load_logits(path: str | Path, *, mmap: bool = False, source: str | None = None,
                non_finite: int | None = None) -> np.ndarray:
    """Load (N, C) float logits from a .npy file, memory-mapped with `mmap`; the header is
    checked against the file before the data is read. `non_finite`: the count of NaN or
    infinite values when it was taken already (flipgate.logits_scan): then the values are
    not read here."""
    path = existing_file(path, "logits", source)
    source = source or str(path)
    try:
        header = single_npy_header(path, source=source, what="logits")
        _check_logits_header(header, source)
        check_data_size(header, path.stat().st_size)
        logits = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise unreadable(error, source, "logits_corrupt", "a readable .npy array") from error
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
            raise npz_not_npy("logits", source)
        handle = io.BytesIO(head)
        shape, fortran_order, dtype = read_npy_header(handle, source=source)
        header = NpyHeader(shape, dtype, fortran_order, data_offset=handle.tell())
        _check_logits_header(header, source)
        check_data_size(header, size)
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise unreadable(error, source, "logits_corrupt", "a readable .npy array") from error
    _refuse_non_finite(non_finite, source)
    return shape


def _check_logits_header(header: NpyHeader, source: str) -> None:
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
    _check_logits_header(NpyHeader.of(logits), source)
    _require_finite(logits, source)
    return logits


def check_logits_match(logits: np.ndarray, evalset: EvalSet, *, source: str) -> None:
    """Logits must have one row per eval-set sample and a column for every label."""
    if logits.shape[0] != evalset.n:
        raise InputError("length_mismatch", f"{source}: {logits.shape[0]} rows of logits "
                           f"for an eval set of {evalset.n} samples")
    if evalset.labeled:
        check_labels(evalset.y, logits.shape[1], source=f"eval set scored by {source}")


def _require_finite(array: np.ndarray, source: str) -> None:
    """No NaN or infinity, checked a chunk of rows at a time (memory-mapped arrays stay so)."""
    _refuse_non_finite(sum(chunk.size - np.count_nonzero(np.isfinite(chunk))
                           for chunk in row_chunks(array)), source)


def _refuse_non_finite(bad: int, source: str) -> None:
    if bad:
        raise InputError("non_finite", f"{source} contains {bad} NaN or infinite values")

