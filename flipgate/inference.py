"""Running an ONNX classifier over an eval set with ONNX Runtime, in batches.

The CUDA execution provider is used when it really works: ORT silently falls back to the
CPU when CUDA libraries are missing, so the providers of the created session are checked.
Another thread can stop a thread's runs, the one under way included (`terminate_runs`).
"""

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from flipgate.errors import InputError
from flipgate.formats.evalsets import EvalSet, cast_input, check_labels
from flipgate.formats.onnx_models import OnnxSpec, check_input_shape, inspect_onnx
from flipgate.onnx_io import InputSpec, OutputSpec
from flipgate.progress import Progress
from flipgate.scores import label_probabilities, to_logits

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
DEVICES = ("auto", "cuda", "cpu")
DEFAULT_BATCH_SIZE = 512
_RUN_OPTIONS: dict[int, ort.RunOptions] = {}  # by thread: what terminate_runs reaches
_cuda_unusable = False  # True once a session asked for CUDA came back without it


def terminate_runs(thread_id: int) -> None:
    """Stop the ONNX Runtime runs of a thread: the one under way (within moments) and every
    later one (each raises) until that thread calls `allow_runs`."""
    _RUN_OPTIONS.setdefault(thread_id, ort.RunOptions()).terminate = True


def allow_runs() -> None:
    """Let this thread's runs go on again after `terminate_runs`."""
    _RUN_OPTIONS[threading.get_ident()] = ort.RunOptions()


def _run_options() -> ort.RunOptions:
    return _RUN_OPTIONS.setdefault(threading.get_ident(), ort.RunOptions())


def create_session(path: Path, device: str = "auto") -> ort.InferenceSession:
    """An inference session on CUDA when asked for or available ("auto"), else on the CPU.
    CUDA is tried once per process: after a session asked for it came back without it (its
    libraries or the GPU are missing), sessions go straight to the CPU (each try costs a
    session's creation, 20-100 ms for a small model)."""
    global _cuda_unusable
    if device not in DEVICES:
        raise InputError("invalid_device", f"device must be one of {DEVICES}, not {device!r}")
    if device != "cpu" and CUDA in ort.get_available_providers() and not _cuda_unusable:
        session = _quiet_session(path, [CUDA, CPU])
        if session.get_providers()[0] == CUDA:
            return session
        _cuda_unusable = True
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


Inputs = np.ndarray | Mapping[str, np.ndarray]  # one array for a single-input model, or by name


class OnnxClassifier:
    """A validated ONNX classifier: named inputs in, float32 logits (N, C) out, whatever its
    scores output holds (see flipgate.onnx_io and flipgate.scores)."""

    multilabel = False  # one score per label (MultiLabelOnnx)
    dtype = np.float32  # of what `predict` returns

    def __init__(self, path: str | Path, device: str = "auto", *, output: str | None = None,
                 scores: str | None = None) -> None:
        self.path = Path(path)
        self.spec: OnnxSpec = inspect_onnx(self.path, output=output, scores=scores,
                                           multilabel=self.multilabel)
        self.session = create_session(self.path, device)

    @property
    def provider(self) -> str:
        """The execution provider that runs this model ("CUDAExecutionProvider" or CPU)."""
        return self.session.get_providers()[0]

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    def check_evalset(self, evalset: EvalSet) -> EvalSet:
        """The eval set with its labels as this model's columns, checked to fit its inputs
        and classes."""
        self.feeds(evalset)
        evalset = match_labels(evalset, self.spec.output, source=str(self.path))
        if evalset.labeled:
            check_labels(evalset.y, self.num_classes, source=f"eval set scored by {self.path}")
        return evalset

    def feeds(self, evalset: EvalSet) -> dict[str, np.ndarray]:
        """The eval set's array for each model input (by the input's name, or `x` for a
        single-input model), checked to fit its shape and dtype."""
        arrays = evalset.arrays()
        if len(self.spec.inputs) == 1 and self.spec.input_name not in arrays and "x" in arrays:
            arrays = {self.spec.input_name: arrays["x"]}
        missing = [spec.name for spec in self.spec.inputs if spec.name not in arrays]
        if missing:
            raise InputError("evalset_missing_input", f"{self.path}: the model's input "
                               f"{missing[0]!r} has no array of that name in the eval set "
                               f"(it has {sorted(arrays)})")
        return {spec.name: self._fitted(arrays[spec.name], spec) for spec in self.spec.inputs}

    def _fitted(self, array: np.ndarray, spec: InputSpec) -> np.ndarray:
        """`array` shaped for `spec` ((N,) becomes (N, 1) for a column input) and checked to
        cast to its dtype without loss."""
        if array.ndim == 1 and len(spec.shape) == 2 and spec.shape[1] in (1, None):
            array = array[:, None]
        check_input_shape(spec, tuple(array.shape[1:]), source=str(self.path))
        return cast_input(array, spec.dtype, source=f"eval set array {spec.name!r}")

    def predict(
        self, data: Inputs, batch_size: int = DEFAULT_BATCH_SIZE, progress: Progress | None = None
    ) -> np.ndarray:
        """Logits (N, C) as float32, computed `batch_size` samples at a time."""
        feeds = self._named(data)
        logits = np.empty((_length(feeds), self.num_classes), dtype=self.dtype)
        for start, batch in self.batches(feeds, batch_size, progress):
            logits[start : start + batch.shape[0]] = batch
        return logits

    def predict_to_file(
        self, data: Inputs, path: str | Path, batch_size: int = DEFAULT_BATCH_SIZE,
        progress: Progress | None = None,
    ) -> Path:
        """Write the logits to an .npy file batch by batch: memory stays one batch of the
        inputs (which may be memory-mapped) and of logits, whatever N is. No file is left on
        an error."""
        path = Path(path)
        feeds = self._named(data)
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")), "fortran_order": False,
                  "shape": (_length(feeds), self.num_classes)}
        try:
            with path.open("wb") as file:
                np.lib.format.write_array_header_2_0(file, header)
                for _, batch in self.batches(feeds, batch_size, progress):
                    file.write(batch.astype("<f4", copy=False).tobytes())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path

    def batches(
        self, data: Inputs, batch_size: int = DEFAULT_BATCH_SIZE, progress: Progress | None = None
    ) -> Iterator[tuple[int, np.ndarray]]:
        """(start, float32 logits) of each batch in order; the inputs are read a batch at a
        time, so memory-mapped arrays stay on disk."""
        if batch_size < 1:
            raise InputError("invalid_batch_size", f"batch size must be >= 1, not {batch_size}")
        feeds = self._named(data)
        n = _length(feeds)
        batch_size = self.spec.fixed_batch or batch_size
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            yield start, self._run_batch({name: array[start:stop] for name, array in feeds.items()})
            if progress:
                progress(stop, n)

    def _named(self, data: Inputs) -> dict[str, np.ndarray]:
        """The inputs by name, a single array given for a single-input model checked to fit."""
        if isinstance(data, Mapping):
            return dict(data)
        return {self.spec.input_name: self._fitted(data, self.spec.inputs[0])}

    def _run_batch(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        rows = _length(feeds)
        if self.spec.fixed_batch and rows < self.spec.fixed_batch:
            return self._run_padded(feeds, rows)
        feeds = {spec.name: _as_input(feeds[spec.name], spec) for spec in self.spec.inputs}
        try:
            (out,) = self.session.run([self.spec.output_name], feeds, _run_options())
        except Exception as error:  # ORT's own exception types: a node fails on this input
            raise InputError("onnx_run_failed", f"{self.path}: ONNX Runtime failed to run the "
                             f"model ({str(error).strip().splitlines()[0]})") from error
        return self._converted(out, rows)

    def _converted(self, out: object, rows: int) -> np.ndarray:
        """The scores output of a batch of `rows` samples as float32 logits (N, C)."""
        scores = self._zipmap_columns(out) if self.spec.output.zipmap else np.asarray(out)
        if scores.shape[0] != rows or scores.ndim > 2:
            raise InputError("onnx_output_shape", f"{self.path}: the model returned shape "
                               f"{scores.shape} for a batch of {rows}")
        logits = to_logits(scores, self.spec.output.kind, source=f"{self.path}: the model's "
                           f"output {self.spec.output_name!r}")
        if logits.shape[1] != self.num_classes:
            raise InputError("onnx_output_shape", f"{self.path}: the model returned "
                               f"{logits.shape[1]} classes, not {self.num_classes}")
        return logits

    def _zipmap_columns(self, rows: list[dict]) -> np.ndarray:
        """A ZipMap's sequence of maps as an (N, C) array in the order of its class labels."""
        labels = self.spec.output.class_labels
        keys = [int(label) for label in labels] if self.spec.output.int_labels else list(labels)
        return np.array([[row[key] for key in keys] for row in rows], dtype=np.float64)

    def _run_padded(self, feeds: dict[str, np.ndarray], rows: int) -> np.ndarray:
        """Fill a last short batch up to the model's fixed batch size and drop the padding."""
        padded = {name: np.concatenate([array, np.zeros(
            (self.spec.fixed_batch - rows, *array.shape[1:]), array.dtype)])
            for name, array in feeds.items()}
        return self._run_batch(padded)[:rows]


class MultiLabelOnnx(OnnxClassifier):
    """A validated multi-label ONNX classifier: named inputs in, float64 probabilities (N, L)
    out, one per label, whatever its scores output holds (see flipgate.onnx_io and
    flipgate.scores.label_probabilities)."""

    multilabel = True
    dtype = np.float64

    def check_evalset(self, evalset: EvalSet) -> EvalSet:
        """The multi-label eval set, checked to fit the model's inputs and label count (and
        its label names, where the model names them); a traffic set's label count is that of
        its `classes`, if any."""
        self.feeds(evalset)
        count = evalset.y.shape[1] if evalset.labeled else len(evalset.classes or ()) or None
        if count not in (None, self.num_classes):
            what = "y has" if evalset.labeled else "classes name"
            raise InputError("label_count_mismatch", f"{self.path}: the model scores "
                               f"{self.num_classes} labels but the eval set's {what} {count} "
                               "label columns")
        names = self.spec.output.class_labels
        if names and not self.spec.output.int_labels and evalset.classes \
                and names != evalset.classes:
            raise InputError("class_names_mismatch", f"{self.path}: the model names its "
                               f"labels {list(names)}, the eval set's `classes` are "
                               f"{list(evalset.classes)}")
        return evalset

    def _converted(self, out: object, rows: int) -> np.ndarray:
        """The scores output of a batch as probabilities (N, L): a tensor (N, L), a ZipMap's
        maps or a sequence of L tensors (N, 2) (column 1: the label's score)."""
        if self.spec.output.per_label:
            scores = np.stack([self._positive_column(np.asarray(t), rows) for t in out], axis=1)
        else:
            scores = self._zipmap_columns(out) if self.spec.output.zipmap else np.asarray(out)
        if scores.shape != (rows, self.num_classes):
            raise InputError("onnx_output_shape", f"{self.path}: the model returned shape "
                               f"{scores.shape} for a batch of {rows} samples and "
                               f"{self.num_classes} labels")
        return label_probabilities(scores, self.spec.output.kind, source=f"{self.path}: the "
                                   f"model's output {self.spec.output_name!r}")

    def _positive_column(self, tensor: np.ndarray, rows: int) -> np.ndarray:
        """Column 1 (the label present) of one label's tensor (N, 2)."""
        if tensor.shape != (rows, 2):
            raise InputError("onnx_output_shape", f"{self.path}: a label's tensor in output "
                               f"{self.spec.output_name!r} has shape {tensor.shape}, not "
                               f"({rows}, 2)")
        return tensor[:, 1]


def _as_input(batch: np.ndarray, spec: InputSpec) -> np.ndarray:
    """A batch in the input's dtype (strings as they are), contiguous, as ORT takes it: the
    batch itself when it is so already (a slice of rows of the eval set), never a copy."""
    return np.ascontiguousarray(batch, dtype=None if spec.dtype.kind == "U" else spec.dtype)


def _length(feeds: Mapping[str, np.ndarray]) -> int:
    return next(iter(feeds.values())).shape[0]


def match_labels(evalset: EvalSet, output: OutputSpec, *, source: str) -> EvalSet:
    """The eval set with its labels as the model's columns: class names mapped by the eval
    set's `classes` or the model's own labels, which must agree where both exist; integer
    labels refused where the model names its classes otherwise than 0..C-1 (ambiguous)."""
    labels = output.class_labels
    if evalset.classes is not None and labels is not None and evalset.classes != labels:
        raise InputError("class_names_mismatch", f"{source}: the model names its classes "
                           f"{list(labels)}, the eval set's `classes` are "
                           f"{list(evalset.classes)}")
    if evalset.labels_named:
        if labels is None:
            raise InputError("labels_need_classes", f"{source}: y holds class names but "
                               "the model does not name its classes; add an array `classes` "
                               "(one name per output column) to the eval set")
        return evalset.indexed(labels, source=source)
    if evalset.classes is None and labels is not None and evalset.labeled \
            and labels != tuple(str(column) for column in range(len(labels))):
        raise InputError("labels_ambiguous", f"{source}: the model names its classes "
                           f"{list(labels)} but y holds integers, which cannot be told apart "
                           "from column indices; store y as class names (strings) or add "
                           "an array `classes`")
    return evalset
