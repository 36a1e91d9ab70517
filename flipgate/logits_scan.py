"""The value checks and argmax of an .npy of logits, taken from its bytes as they arrive (an
upload being written to disk), so that nothing reads the file again afterwards."""

import io
import struct

import numpy as np

from flipgate.formats.npy import read_npy_header
from flipgate.metrics.matrices import class_dtype

MAGIC = b"\x93NUMPY"
PREFIX_BYTES = {1: 10, 2: 12, 3: 12}  # magic, version and the header's length field


class LogitsScan:
    """`feed` the bytes of an .npy in order; once all are fed, `result()` is the count of
    NaN or infinite values and the predicted classes (argmax of each row, in
    `class_dtype(C)`), as `load_logits` and `predicted_classes` would find them on the file.
    A file that is not plain C-ordered (N, C) floats of the declared size has no result:
    reading it again (load_logits) says why it is refused."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._dtype: np.dtype | None = None
        self._columns = self._rows_left = self.non_finite = 0
        self._classes: list[np.ndarray] = []
        self._failed = False

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the file."""
        if self._failed:
            return
        self._buffer += data
        if self._dtype is None and not self._read_header():
            return
        self._scan_rows()

    def result(self) -> tuple[int, np.ndarray] | None:
        """(non-finite values, predicted classes), or None when the scan gave up."""
        if self._failed or self._dtype is None or self._rows_left or self._buffer:
            return None
        classes = (np.concatenate(self._classes) if self._classes
                   else np.empty(0, class_dtype(self._columns)))
        return self.non_finite, classes

    def _read_header(self) -> bool:
        """Parse the header once it has arrived; False while it has not."""
        head = bytes(self._buffer[:12])
        if len(head) < 12:
            return False
        version = head[6]
        if head[:6] != MAGIC or version not in PREFIX_BYTES:
            return self._give_up()
        prefix = PREFIX_BYTES[version]
        length = struct.unpack("<H" if version == 1 else "<I", head[8:prefix])[0]
        if len(self._buffer) < prefix + length:
            return False
        try:
            handle = io.BytesIO(bytes(self._buffer[:prefix + length]))
            shape, fortran_order, dtype = read_npy_header(handle, source="logits")
        except Exception:  # any refusal is load_logits' to explain, on the file
            return self._give_up()
        if fortran_order or len(shape) != 2 or shape[1] < 1 or dtype.kind != "f":
            return self._give_up()
        self._dtype, (self._rows_left, self._columns) = dtype, shape
        del self._buffer[:handle.tell()]
        return True

    def _scan_rows(self) -> None:
        """Check and argmax the complete rows buffered; keep the rest."""
        row_bytes = self._columns * self._dtype.itemsize
        rows = min(len(self._buffer) // row_bytes, self._rows_left)
        if len(self._buffer) > self._rows_left * row_bytes:
            self._give_up()  # more data than the header declares
            return
        if rows == 0:
            return
        logits = np.frombuffer(self._buffer, self._dtype, rows * self._columns).reshape(
            rows, self._columns)
        self.non_finite += logits.size - int(np.count_nonzero(np.isfinite(logits)))
        self._classes.append(logits.argmax(axis=1).astype(class_dtype(self._columns)))
        del logits
        del self._buffer[:rows * row_bytes]
        self._rows_left -= rows

    def _give_up(self) -> bool:
        self._failed, self._buffer = True, bytearray()
        return False
