"""Running an ONNX classifier over an eval set with ONNX Runtime, in batches.

The CUDA execution provider is used when it really works: ORT silently falls back to the
CPU when CUDA libraries are missing, so the providers of the created session are checked.
"""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort

from flipgate.errors import InputError
from flipgate.formats import EvalSet, OnnxSpec, check_labels, inspect_onnx
from flipgate.progress import Progress

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
DEVICES = ("auto", "cuda", "cpu")
DEFAULT_BATCH_SIZE = 512



def create_session(path: Path, device: str = "auto") -> ort.InferenceSession:
    """An inference session on CUDA when asked for or available ("auto"), else on the CPU."""
    if device not in DEVICES:
        raise InputError("invalid_device", f"device must be one of {DEVICES}, not {device!r}")
    if device != "cpu" and CUDA in ort.get_available_providers():
        session = _quiet_session(path, [CUDA, CPU])
        if session.get_providers()[0] == CUDA:
            return session
    if device == "cuda":
        raise InputError("cuda_unavailable", "the CUDA execution provider is not usable "
                           "here (no GPU, or its CUDA/cuDNN libraries are missing)")
    return _quiet_session(path, [CPU])


def _quiet_session(path: Path, providers: list[str]) -> ort.InferenceSession:
    """Create a session without ORT's console errors about providers that fail to load."""
    ort.set_default_logger_severity(4)
    try:
        return ort.InferenceSession(str(path), providers=providers)
    except Exception as error:  # ORT raises its own exception types for models it can't load
        raise InputError("onnx_unloadable", f"{path}: ONNX Runtime cannot load the model "
                           f"({str(error).strip().splitlines()[0]})") from error
    finally:
        ort.set_default_logger_severity(2)


class OnnxClassifier:
    """A validated ONNX classifier: one float input, (N, C) logits out."""

    def __init__(self, path: str | Path, device: str = "auto") -> None:
        self.path = Path(path)
        self.spec: OnnxSpec = inspect_onnx(self.path)
        self.session = create_session(self.path, device)

    @property
    def provider(self) -> str:
        """The execution provider that runs this model ("CUDAExecutionProvider" or CPU)."""
        return self.session.get_providers()[0]

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    def check_evalset(self, evalset: EvalSet) -> None:
        """The eval set's samples must fit the input and its labels the model's classes."""
        self.spec.check_sample_shape(evalset.sample_shape, source=str(self.path))
        check_labels(evalset.y, self.num_classes, source=f"eval set scored by {self.path}")

    def predict(
        self, x: np.ndarray, batch_size: int = DEFAULT_BATCH_SIZE, progress: Progress | None = None
    ) -> np.ndarray:
        """Logits (N, C) as float32, computed `batch_size` samples at a time."""
        logits = np.empty((x.shape[0], self.num_classes), dtype=np.float32)
        for start, batch in self.batches(x, batch_size, progress):
            logits[start : start + batch.shape[0]] = batch
        return logits

    def predict_to_file(
        self, x: np.ndarray, path: str | Path, batch_size: int = DEFAULT_BATCH_SIZE,
        progress: Progress | None = None,
    ) -> Path:
        """Write the logits to an .npy file batch by batch: memory stays one batch of `x` (which
        may be memory-mapped) and of logits, whatever N is. No file is left on an error."""
        path = Path(path)
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")), "fortran_order": False,
                  "shape": (x.shape[0], self.num_classes)}
        try:
            with path.open("wb") as file:
                np.lib.format.write_array_header_2_0(file, header)
                for _, batch in self.batches(x, batch_size, progress):
                    file.write(batch.astype("<f4", copy=False).tobytes())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path

    def batches(
        self, x: np.ndarray, batch_size: int = DEFAULT_BATCH_SIZE, progress: Progress | None = None
    ) -> Iterator[tuple[int, np.ndarray]]:
        """(start, finite float32 logits) of each batch of `x` in order; `x` is read a batch
        at a time, so a memory-mapped array stays on disk."""
        if batch_size < 1:
            raise InputError("invalid_batch_size", f"batch size must be >= 1, not {batch_size}")
        self.spec.check_sample_shape(tuple(x.shape[1:]), source=str(self.path))
        batch_size = self.spec.fixed_batch or batch_size
        for start in range(0, x.shape[0], batch_size):
            stop = min(start + batch_size, x.shape[0])
            logits = self._run_batch(x[start:stop])
            if not np.isfinite(logits).all():
                raise InputError("model_output_not_finite", f"{self.path}: the model produced "
                                 "NaN or infinite logits on this eval set")
            yield start, logits
            if progress:
                progress(stop, x.shape[0])

    def _run_batch(self, batch: np.ndarray) -> np.ndarray:
        batch = np.ascontiguousarray(batch, dtype=np.float32)
        if self.spec.fixed_batch and batch.shape[0] < self.spec.fixed_batch:
            return self._run_padded(batch)
        (out,) = self.session.run([self.spec.output_name], {self.spec.input_name: batch})
        if out.shape != (batch.shape[0], self.num_classes):
            raise InputError("onnx_output_shape", f"{self.path}: the model returned shape "
                               f"{out.shape} for a batch of {batch.shape[0]}")
        return out

    def _run_padded(self, batch: np.ndarray) -> np.ndarray:
        """Fill a last short batch up to the model's fixed batch size and drop the padding."""
        padding = np.zeros((self.spec.fixed_batch - batch.shape[0], *batch.shape[1:]), np.float32)
        return self._run_batch(np.concatenate([batch, padding]))[: batch.shape[0]]
