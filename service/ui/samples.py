"""Bounded reads for the pair page: a few rows of a stored logits array or eval set.

Logits are .npy artifacts and are memory-mapped. An eval set is an .npz (a zip): an array
stored uncompressed is memory-mapped at its offset inside the zip; a compressed one is
streamed once up to the last row wanted, in chunks, keeping only the rows wanted. Either way
a page of the gallery costs memory for its own rows only.

(The server may later store predictions compactly, e.g. predicted class and confidence per
sample; the gallery would then read those instead of the logits.)
"""

import zipfile
from pathlib import Path

import numpy as np

from flipgate.formats.evalsets import label_columns
from flipgate.formats.npy import npz_headers
from flipgate.metrics.traffic import UNLABELLED
from flipgate.reporting.gallery import FlipSample, SampleView, by_new_confidence, flip_samples
from flipgate.reporting.html import LabelRows, label_gallery

ZIP_LOCAL_HEADER_BYTES = 30
STREAM_CHUNK_BYTES = 1 << 22


def logits_rows(path: Path, indices: np.ndarray) -> np.ndarray:
    """Rows `indices` of an (N, C) .npy, read through a memory map."""
    return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False)[indices])


def npz_rows(path: Path, member: str, indices: np.ndarray) -> np.ndarray:
    """Rows `indices` of the array `member` (e.g. "x") of an .npz, without loading the rest."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{member}.npy")
        with archive.open(info) as stream:
            shape, fortran, dtype = _npy_header(stream)
            if dtype.hasobject:
                raise ValueError(f"{member} of {path.name} is not a numeric array")
            if info.compress_type == zipfile.ZIP_STORED:
                return _mapped_rows(path, info, stream.tell(), shape, dtype, indices, fortran)
            if fortran:
                return _streamed_fortran_rows(stream, shape, dtype, indices)
            return _streamed_rows(stream, shape, dtype, indices)


def _npy_header(stream) -> tuple[tuple[int, ...], bool, np.dtype]:
    major, _minor = np.lib.format.read_magic(stream)
    if major == 1:
        return np.lib.format.read_array_header_1_0(stream)
    return np.lib.format.read_array_header_2_0(stream)


def _mapped_rows(path: Path, info: zipfile.ZipInfo, header_bytes: int,
                 shape: tuple[int, ...], dtype: np.dtype, indices: np.ndarray,
                 fortran: bool) -> np.ndarray:
    """Rows of an uncompressed member (C or Fortran order), memory-mapped at its data offset
    in the zip file."""
    with path.open("rb") as raw:
        raw.seek(info.header_offset + 26)
        name_length, extra_length = np.frombuffer(raw.read(4), dtype="<u2")
    offset = (info.header_offset + ZIP_LOCAL_HEADER_BYTES + int(name_length)
              + int(extra_length) + header_bytes)
    mapped = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape,
                       order="F" if fortran else "C")
    return np.ascontiguousarray(mapped[indices])


def _streamed_rows(stream, shape: tuple[int, ...], dtype: np.dtype,
                   indices: np.ndarray) -> np.ndarray:
    """Rows of a compressed member, decompressed in order up to the last row wanted."""
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    rows_per_chunk = max(1, STREAM_CHUNK_BYTES // max(row_bytes, 1))
    out = np.empty((len(indices), *shape[1:]), dtype=dtype)
    wanted = np.asarray(indices)
    last = int(wanted.max()) if wanted.size else -1
    for start in range(0, last + 1, rows_per_chunk):
        count = min(rows_per_chunk, last + 1 - start)
        chunk = np.frombuffer(stream.read(count * row_bytes), dtype=dtype).reshape(
            count, *shape[1:])
        hits = np.flatnonzero((wanted >= start) & (wanted < start + count))
        out[hits] = chunk[wanted[hits] - start]
    return out


def _streamed_fortran_rows(stream, shape: tuple[int, ...], dtype: np.dtype,
                           indices: np.ndarray) -> np.ndarray:
    """Rows of a compressed member in Fortran order, where each row is spread over the whole
    array: decompressed once, whole columns (all N samples of one position) at a time."""
    n, positions = shape[0], int(np.prod(shape[1:], dtype=np.int64))
    columns_per_chunk = max(1, STREAM_CHUNK_BYTES // max(n * dtype.itemsize, 1))
    out = np.empty((len(indices), positions), dtype=dtype)
    for start in range(0, positions, columns_per_chunk):
        count = min(columns_per_chunk, positions - start)
        chunk = np.frombuffer(stream.read(count * n * dtype.itemsize), dtype=dtype)
        out[:, start:start + count] = chunk.reshape(count, n).T[indices]
    return np.ascontiguousarray(out.reshape((len(indices), *shape[1:]), order="F"))


def ranked_negative_flips(negative: np.ndarray, new_logits: Path) -> np.ndarray:
    """The pair's negative flips (indices from its stored report), most confident first."""
    indices = np.asarray(negative, dtype=np.int64)
    return by_new_confidence(indices, logits_rows(new_logits, indices))


def sample_view(evalset: Path) -> SampleView:
    """How the gallery shows the samples of a stored eval set, from its array headers."""
    headers = npz_headers(evalset, source=evalset.name)
    return SampleView.of({name: (header.shape, header.dtype) for name, header in headers.items()})


def negative_flips(report: dict, labels: np.ndarray | None, old_logits: Path,
                   new_logits: Path) -> np.ndarray:
    """The pair's negative flips: its stored report's, else (a traffic set not labelled
    throughout) those its label revision `labels` makes known."""
    flipped = report.get("flipped_indices")
    if flipped or labels is None:
        return np.asarray(flipped["negative"], dtype=np.int64)
    return known_negative_flips(labels, old_logits, new_logits)


def known_negative_flips(labels: np.ndarray, old_logits: Path, new_logits: Path) -> np.ndarray:
    """The samples of a traffic set known to flip negatively: labelled (`labels`, a label
    revision's (N,) columns, UNLABELLED where unknown), the old model right and the new one
    wrong; only the labelled samples' logits rows are read."""
    labelled = np.flatnonzero(labels != UNLABELLED)
    truth = labels[labelled]
    old, new = (logits_rows(path, labelled).argmax(axis=1) for path in (old_logits, new_logits))
    return labelled[(old == truth) & (new != truth)]


def gallery_page(ranked: np.ndarray, page: int, per_page: int, *, old_logits: Path,
                 new_logits: Path, evalset: Path, view: SampleView,
                 class_names: list[str] | None,
                 labels: np.ndarray | None = None) -> list[FlipSample]:
    """The gallery entries of one page of `ranked` flips, reading only their rows; `labels`:
    a traffic set's label revision (N,), else the set's own `y` is read."""
    shown = ranked[(page - 1) * per_page:page * per_page]
    truth = column_labels(evalset, shown, class_names) if labels is None else labels[shown]
    return flip_samples(shown, truth,
                        logits_rows(old_logits, shown),
                        logits_rows(new_logits, shown),
                        {name: npz_rows(evalset, name, shown) for name in view.arrays})


def column_labels(evalset: Path, indices: np.ndarray,
                  class_names: list[str] | None) -> np.ndarray:
    """The labels of samples `indices` as column indices (class names mapped by the set's
    `classes`, else by the line's `class_names`)."""
    labels = npz_rows(evalset, "y", indices)
    if labels.dtype.kind != "U":
        return labels
    with np.load(evalset, allow_pickle=False) as archive:
        if "classes" in archive.files:
            class_names = archive["classes"].tolist()
    return label_columns(labels, class_names, source=evalset.name)


def multilabel_gallery(report: dict, *, old_probabilities: Path, new_probabilities: Path,
                       evalset: Path, y: np.ndarray, view: SampleView) -> str:
    """The library's gallery of a multi-label pair's negative flips by label
    (flipgate.reporting.html.label_gallery), reading only the rows it ranks and draws of the
    stored probabilities (N, L) and eval set; `y` is the set's label matrix (N, L)."""
    def rows(indices: np.ndarray) -> LabelRows:
        return LabelRows(y[indices], logits_rows(old_probabilities, indices),
                         logits_rows(new_probabilities, indices),
                         {name: npz_rows(evalset, name, indices) for name in view.arrays})

    return label_gallery(report, view,
                         lambda indices, label: logits_rows(new_probabilities, indices)[:, label],
                         rows)
