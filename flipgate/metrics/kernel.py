"""The per-sample numbers of an old/new pair for one chunk of logits, as one ONNX graph.

Every (N, C) pass of the pair report (top-2, softmax, SChurn, prediction difference, logit
displacement) runs inside ONNX Runtime: its fused, vectorised `Softmax` is several times
faster than numpy's max/exp/sum/divide passes (numpy's float32 `exp` alone costs about 3×
ORT's on this project's machines), and the graph keeps its intermediates in its arena. What
leaves the graph is per sample, so the caller's work is O(N), not O(N·C). `pair_chunks` runs
one chunk per core at once, each on one thread (ORT releases the GIL), while the caller folds
the chunk before; the operators themselves are not split between threads (no
synchronisation after each of the graph's ~30 nodes).
"""

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import onnxruntime as ort

from flipgate import onnx_bytes as proto
from flipgate.metrics.chunks import release, sample_ranges

THREADS = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1, 8)  # chunks computed at once by `pair_chunks`
KERNEL_ELEMENTS = 1 << 17  # values per graph run: 512 KB of float32 stays in cache per pass
OPSET = 17
IR_VERSION = 9  # the newest IR version every supported ONNX Runtime loads
ELEMENT_TYPES = {np.dtype(np.float32): proto.FLOAT, np.dtype(np.float64): proto.DOUBLE}
OUTPUTS = ("old_index", "old_top", "old_max_prob", "new_index", "new_top", "new_max_prob",
           "schurn", "delta_l1_sum", "delta_l2_squared", "old_label_prob", "new_label_prob",
           "displacement")


@dataclass(frozen=True, eq=False)
class PairChunk:
    """Per-sample results for one chunk; `*_top`/`*_index` are the two largest logits."""

    old_index: np.ndarray
    old_top: np.ndarray
    old_max_prob: np.ndarray
    new_index: np.ndarray
    new_top: np.ndarray
    new_max_prob: np.ndarray
    schurn: np.ndarray  # ‖(p_old / max p_old)^α − (p_new / max p_new)^α‖₁
    delta_l1_sum: np.ndarray  # ‖p_old − p_new‖₁
    delta_l2_squared: np.ndarray  # ‖p_old − p_new‖₂²
    old_label_prob: np.ndarray
    new_label_prob: np.ndarray
    displacement: np.ndarray  # ‖z_new − z_old‖₂

    def predictions(self, model: str) -> np.ndarray:
        """argmax of the logits of "old" or "new" (the lowest index among ties, as numpy)."""
        return getattr(self, f"{model}_index")[:, 0]

    def confidence(self, model: str) -> np.ndarray:
        """The top probability of "old" or "new" per sample."""
        return getattr(self, f"{model}_max_prob")

    def gap(self, model: str) -> np.ndarray:
        """p_top1 − p_top2 = p_top1 · (1 − exp(z_top2 − z_top1)) of "old" or "new" per sample."""
        top = getattr(self, f"{model}_top")
        return (1 - np.exp(top[:, 1] - top[:, 0])) * self.confidence(model)


def pair_chunk(
    old_logits: np.ndarray, new_logits: np.ndarray, labels: np.ndarray, alpha: float
) -> PairChunk:
    """Run the pair graph on one chunk (float32 stays float32, anything else is float64); a
    float32 chunk whose logits are too large for its numbers (finite logits near float32's
    limit: their differences and squares overflow) is run again in float64."""
    dtype = np.dtype(np.float32 if old_logits.dtype == np.float32 else np.float64)
    session = _session(ELEMENT_TYPES[dtype], float(alpha))
    chunk = PairChunk(*session.run(None, {
        "old": np.ascontiguousarray(old_logits, dtype=dtype),
        "new": np.ascontiguousarray(new_logits, dtype=dtype),
        "labels": np.ascontiguousarray(labels, dtype=np.int64),
    }))
    if dtype == np.float32 and not _fits_float32(chunk):
        return pair_chunk(old_logits.astype(np.float64), new_logits.astype(np.float64), labels,
                          alpha)
    return chunk


FLOAT32_SAFE = 1e38  # top logits below this differ by less than float32's largest number


def _fits_float32(chunk: PairChunk) -> bool:
    """Whether no number of a float32 chunk overflowed, and the gaps' differences of the two
    top logits will not (checked per sample: O(N), not O(N·C))."""
    return bool(np.isfinite(chunk.displacement).all()
                and np.abs(chunk.old_top).max(initial=0) < FLOAT32_SAFE
                and np.abs(chunk.new_top).max(initial=0) < FLOAT32_SAFE)


def pair_block(old_logits: np.ndarray, new_logits: np.ndarray, labels: np.ndarray,
               alpha: float) -> PairChunk:
    """`pair_chunk` of a block of samples, run KERNEL_ELEMENTS values at a time (rows that
    stay in cache between the graph's passes) and joined."""
    rows = max(1, KERNEL_ELEMENTS // old_logits.shape[1])
    parts = [pair_chunk(old_logits[start:stop], new_logits[start:stop], labels[start:stop],
                        alpha) for start, stop in sample_ranges(len(labels), rows)]
    if len(parts) == 1:
        return parts[0]
    return PairChunk(*(np.concatenate([getattr(part, name) for part in parts])
                       for name in OUTPUTS))


def pair_chunks(old_logits: np.ndarray, new_logits: np.ndarray, labels: np.ndarray,
                alpha: float, rows: int) -> Iterator[tuple[int, int, PairChunk]]:
    """(start, stop, pair_block of samples [start, stop)) for consecutive chunks of `rows`
    samples, in order. THREADS chunks are computed ahead at once; the pages of memory-mapped
    logits of a chunk are handed back when the caller asks for the next one."""
    def submit(start: int, stop: int) -> Future:
        return pool.submit(pair_block, old_logits[start:stop], new_logits[start:stop],
                           labels[start:stop], alpha)

    with ThreadPoolExecutor(THREADS, thread_name_prefix="pair-chunk") as pool:
        pending: deque[tuple[int, int, Future]] = deque()
        for start, stop in sample_ranges(len(labels), rows):
            pending.append((start, stop, submit(start, stop)))
            if len(pending) > THREADS:
                yield from _finish(pending.popleft(), old_logits, new_logits)
        while pending:
            yield from _finish(pending.popleft(), old_logits, new_logits)


def _finish(computing: tuple[int, int, Future], *logits: np.ndarray,
            ) -> Iterator[tuple[int, int, PairChunk]]:
    """Yield a computed chunk, then release its rows of the (memory-mapped) logits."""
    start, stop, future = computing
    yield start, stop, future.result()
    for array in logits:
        release(array, start, stop)


@lru_cache(maxsize=8)
def _session(element_type: int, alpha: float) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    model = proto.make_model(_graph(element_type, alpha), ir_version=IR_VERSION, opset=OPSET)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _graph(element_type: int, alpha: float) -> bytes:
    constants = [
        proto.make_tensor("two", proto.INT64, [1], [2]),
        proto.make_tensor("axis_1", proto.INT64, [1], [1]),
        proto.make_tensor("zero", proto.INT64, [1], [0]),
        proto.make_tensor("one", proto.INT64, [1], [1]),
    ]
    if alpha != 1:
        constants.append(proto.make_tensor("alpha", element_type, [], [alpha]))
    nodes = [*_model_nodes("old"), *_model_nodes("new"), *_pair_nodes(alpha)]
    logits = [proto.make_tensor_value_info(name, element_type, ["N", "C"])
              for name in ("old", "new")]
    labels = proto.make_tensor_value_info("labels", proto.INT64, ["N"])
    outputs = [proto.make_tensor_value_info(
        name, proto.INT64 if name.endswith("index") else element_type, None)
        for name in OUTPUTS]
    return proto.make_graph(nodes, "flipgate_pair_chunk", [*logits, labels], outputs,
                            initializer=constants)


def _model_nodes(model: str) -> list[bytes]:
    """Top-2 logits and indices, the probabilities, the top one and the true class's one."""
    node = proto.make_node
    return [
        node("TopK", [model, "two"], [f"{model}_top", f"{model}_index"], axis=1),
        node("Softmax", [model], [f"{model}_probs"], axis=1),
        node("Slice", [f"{model}_index", "zero", "one", "axis_1"], [f"{model}_argmax"]),
        node("GatherElements", [f"{model}_probs", f"{model}_argmax"], [f"{model}_max_p"],
             axis=1),
        node("Squeeze", [f"{model}_max_p", "axis_1"], [f"{model}_max_prob"]),
        node("Unsqueeze", ["labels", "axis_1"], [f"{model}_labels"]),
        node("GatherElements", [f"{model}_probs", f"{model}_labels"], [f"{model}_label_p"],
             axis=1),
        node("Squeeze", [f"{model}_label_p", "axis_1"], [f"{model}_label_prob"]),
    ]


def _schurn_nodes(alpha: float) -> list[bytes]:
    """Σ|(p_old / max p_old)^α − (p_new / max p_new)^α| per sample; for α = 1 as
    Σ|p_old − p_new · (max p_old / max p_new)| / max p_old, two passes fewer."""
    node = proto.make_node
    if alpha == 1:
        return [
            node("Div", ["old_max_p", "new_max_p"], ["max_ratio"]),
            node("Mul", ["new_probs", "max_ratio"], ["new_rescaled"]),
            node("Sub", ["old_probs", "new_rescaled"], ["scaled_difference"]),
            *_row_sum("Abs", "scaled_difference", "schurn_times_max"),
            node("Div", ["schurn_times_max", "old_max_prob"], ["schurn"]),
        ]
    nodes = []
    for model in ("old", "new"):
        nodes += [node("Div", [f"{model}_probs", f"{model}_max_p"], [f"{model}_scaled"]),
                  node("Pow", [f"{model}_scaled", "alpha"], [f"{model}_scaled_alpha"])]
    return [*nodes, node("Sub", ["old_scaled_alpha", "new_scaled_alpha"], ["scaled_difference"]),
            *_row_sum("Abs", "scaled_difference", "schurn")]


def _pair_nodes(alpha: float) -> list[bytes]:
    """SChurn, ‖p_old − p_new‖₁, ‖p_old − p_new‖₂² and ‖z_new − z_old‖₂ per sample."""
    node = proto.make_node
    return [
        *_schurn_nodes(alpha),
        node("Sub", ["old_probs", "new_probs"], ["prob_difference"]),
        *_row_sum("Abs", "prob_difference", "delta_l1_sum"),
        *_row_sum("Square", "prob_difference", "delta_l2_squared"),
        node("Sub", ["new", "old"], ["logit_difference"]),
        *_row_sum("Square", "logit_difference", "displacement_squared"),
        node("Sqrt", ["displacement_squared"], ["displacement"]),
    ]


def _row_sum(elementwise: str, tensor: str, output: str) -> list[bytes]:
    """Σ_c f(tensor[:, c]) for f = "Abs" or "Square": an elementwise pass and ReduceSum,
    about twice as fast as ORT's ReduceL1 / ReduceSumSquare / ReduceL2 on (N, C) rows."""
    node = proto.make_node
    mapped = f"{elementwise.lower()}_{tensor}"
    first = (node("Abs", [tensor], [mapped]) if elementwise == "Abs"
             else node("Mul", [tensor, tensor], [mapped]))
    return [first, node("ReduceSum", [mapped, "axis_1"], [output], keepdims=0)]
