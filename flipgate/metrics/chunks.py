"""Reading arrays chunk by chunk over samples, with memory-mapped inputs kept on disk.

A page of a memory-mapped file that has been read counts in the process's resident memory
until the kernel needs it back; `release` hands the pages of a chunk that has been used back
at once (they stay in the page cache, so reading them again costs no disk access), so the
resident memory of a pass over a file of any size stays about one chunk. On the first read
of a chunk the kernel also maps the cached pages around it ("fault-around", 64 KiB by
default), some of them from the chunk before, already released: `release` covers that
window before the chunk too.
"""

import ctypes
import mmap
import sys
from collections.abc import Iterator

import numpy as np

CHUNK_ELEMENTS = 1 << 19  # values per array and chunk by default: 2 MB of float32
FAULT_AROUND_BYTES = 1 << 20  # generously above the kernel's default 64 KiB
CHECK_CHUNK_BYTES = 64 << 20  # how much of an array a value check holds at once

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def chunk_rows(row_elements: int, chunk_size: int | None = None,
               elements: int = CHUNK_ELEMENTS) -> int:
    """Samples per chunk: `chunk_size`, or as many as keep `elements` values."""
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk size must be >= 1, not {chunk_size}")
    return chunk_size or max(1, elements // max(row_elements, 1))


def sample_ranges(n: int, rows: int) -> Iterator[tuple[int, int]]:
    """[start, stop) of each chunk of `rows` samples out of n."""
    for start in range(0, n, rows):
        yield start, min(start + rows, n)


def release(array: np.ndarray, start: int, stop: int) -> None:
    """Drop rows [start, stop) of a read-only memory-mapped array, and the fault-around
    window before them, from this process's resident memory (rows past the end are not
    the array's: `stop` is clamped, since advising a neighbouring mapping would erase it)."""
    stop = min(stop, array.shape[0]) if array.ndim else stop
    if _LIBC is None or not isinstance(array, np.memmap) or array.mode != "r" or stop <= start:
        return
    base, row_bytes = array.ctypes.data, array.strides[0]
    first = max(base, base + start * row_bytes - FAULT_AROUND_BYTES)
    first -= first % mmap.PAGESIZE  # the page holding the array's start is in the mapping
    length = base + stop * row_bytes - first
    _LIBC.madvise(ctypes.c_void_p(first), ctypes.c_size_t(length), mmap.MADV_DONTNEED)


def row_chunks(array: np.ndarray, chunk_bytes: int | None = None) -> Iterator[np.ndarray]:
    """Consecutive slices of `array` along its first axis of about `chunk_bytes` each
    (default CHECK_CHUNK_BYTES); a memory-mapped array's pages are handed back once a slice
    has been used, so a check over a file of any size keeps about one chunk resident."""
    if array.ndim == 0:
        yield array
        return
    row_bytes = max(1, array[:1].nbytes)
    step = max(1, (chunk_bytes or CHECK_CHUNK_BYTES) // row_bytes)
    for start in range(0, array.shape[0], step):
        yield array[start:start + step]
        release(array, start, start + step)
