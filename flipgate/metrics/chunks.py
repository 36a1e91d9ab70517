"""Reading arrays chunk by chunk over samples, with memory-mapped inputs kept on disk.

A page of a memory-mapped file that has been read counts in the process's resident memory
until the kernel needs it back; `release` hands the pages of a chunk that has been used back
at once (they stay in the page cache, so reading them again costs no disk access), so the
resident memory of a pass over a file of any size stays about one chunk.
"""

import ctypes
import mmap
import sys
from collections.abc import Iterator

import numpy as np

CHUNK_ELEMENTS = 1 << 19  # values per array and chunk by default: 2 MB of float32

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def chunk_rows(row_elements: int, chunk_size: int | None = None) -> int:
    """Samples per chunk: `chunk_size`, or as many as keep CHUNK_ELEMENTS values."""
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk size must be >= 1, not {chunk_size}")
    return chunk_size or max(1, CHUNK_ELEMENTS // max(row_elements, 1))


def sample_ranges(n: int, rows: int) -> Iterator[tuple[int, int]]:
    """[start, stop) of each chunk of `rows` samples out of n."""
    for start in range(0, n, rows):
        yield start, min(start + rows, n)


def release(chunk: np.ndarray) -> None:
    """Drop a read-only memory-mapped chunk's pages from this process's resident memory."""
    if _LIBC is None or not isinstance(chunk, np.memmap) or chunk.mode != "r" or not chunk.size:
        return
    start = chunk.ctypes.data - chunk.ctypes.data % mmap.PAGESIZE
    length = chunk.ctypes.data + chunk.nbytes - start
    _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), mmap.MADV_DONTNEED)
