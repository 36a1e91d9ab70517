"""Traffic sets (eval sets without labels): their labels, added later and append-only, and
the export of the samples two models disagree on, for people to label (docs/traffic.md)."""

import csv
import io
import json
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flipgate.errors import InputError
from flipgate.formats.evalsets import EvalSet, check_labels, label_columns
from flipgate.formats.npy import NUMPY_READ_ERRORS, npz_headers
from flipgate.metrics.probs import softmax
from flipgate.metrics.traffic import UNLABELLED

if TYPE_CHECKING:
    from flipgate.reporting.gallery import SampleView

EXPORT_FORMATS = ("json", "csv", "label-studio")
CHOICES_FROM, SAMPLE_TO = "label", "sample"  # the labelling configuration's tag names
MAX_SHOWN_VALUES = 64  # a sample shown as its input values: at most this many of each input


def class_name_list(num_classes: int, class_names: Sequence[str] | None) -> list[str]:
    """The classes' names: `class_names`, else the column numbers as strings."""
    return list(class_names) if class_names else [str(column) for column in range(num_classes)]


# Labels ------------------------------------------------------------------------------------

def read_labels_file(path: Path, *, evalset: EvalSet, class_names: Sequence[str] | None,
                     num_classes: int | None, source: str | None = None,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(sample indices, label columns) in a labels file: an .npz of `index` (or `ids`, the
    set's sample ids) and `y` (columns below `num_classes` when it is known, or names that
    `class_names` maps to columns), or a Label Studio JSON export of tasks made by the
    disagreements export."""
    source = source or str(path)
    path = Path(path)
    if not path.is_file():
        raise InputError("file_not_found", f"{source}: no such labels file")
    if zipfile.is_zipfile(path):
        index, labels = _npz_labels(path, evalset, source)
    else:
        index, labels = label_studio_labels(path.read_bytes(), source=source)
    return _checked(index, labels, evalset.n, (class_names, num_classes), source)


def _npz_labels(path: Path, evalset: EvalSet, source: str) -> tuple[np.ndarray, np.ndarray]:
    """`index` (or `ids` mapped to indices) and `y` of a labels .npz."""
    try:
        headers = npz_headers(path, source=source)
        if "y" not in headers or not {"index", "ids"} & headers.keys():
            raise InputError("labels_missing_array", f"{source}: a labels .npz holds `y` and "
                             f"`index` or `ids` (it has {sorted(headers)})")
        with np.load(path, allow_pickle=False) as archive:
            labels = archive["y"]
            index = archive["index"] if "index" in headers else _indices_of_ids(
                archive["ids"], evalset, source)
    except InputError:
        raise
    except NUMPY_READ_ERRORS as error:
        raise InputError("labels_corrupt", f"{source}: not a readable .npz ({error})") from error
    return index, labels


def _indices_of_ids(ids: np.ndarray, evalset: EvalSet, source: str) -> np.ndarray:
    """The sample indices of request ids (each must be one of the set's `ids`)."""
    if evalset.ids is None:
        raise InputError("labels_ids_unknown", f"{source}: labels name samples by `ids` but "
                         "the set has no array `ids`; name them by `index`")
    position = {sample_id: i for i, sample_id in enumerate(evalset.ids.tolist())}
    unknown = [str(sample_id) for sample_id in ids.tolist() if sample_id not in position]
    if unknown:
        raise InputError("labels_ids_unknown", f"{source}: id {unknown[0]!r} is no sample's id")
    return np.array([position[sample_id] for sample_id in ids.tolist()], dtype=np.int64)


def _checked(index: np.ndarray, labels: np.ndarray, n: int,
             classes: tuple[Sequence[str] | None, int | None],
             source: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices within the set, each once, and labels mapped to columns (by the names, and
    below the count, of `classes` where known)."""
    class_names, num_classes = classes
    if index.ndim != 1 or index.dtype.kind not in "iu" or labels.shape != index.shape \
            or labels.dtype.kind not in "iuU":
        raise InputError("labels_shape", f"{source}: labels need one integer index and one "
                         f"label (integer or class name) per row, got {index.dtype} "
                         f"{index.shape} and {labels.dtype} {labels.shape}")
    if index.size and (index.min() < 0 or index.max() >= n):
        raise InputError("labels_index_out_of_range", f"{source}: sample indices must lie in "
                         f"[0, {n})")
    if np.unique(index).size != index.size:
        raise InputError("labels_duplicate_sample", f"{source}: a sample is labelled twice")
    columns = label_columns(labels, class_names or [], source=source)
    check_labels(columns, num_classes, source=source)
    return index.astype(np.int64), columns


def merge_labels(known: np.ndarray, index: np.ndarray, labels: np.ndarray, *,
                 ids: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """The labels known (N,, UNLABELLED where unknown) with new ones added, and how many
    were new. Append-only: a different label for a labelled sample is refused (naming it);
    the same label again changes nothing."""
    differs = (known[index] != UNLABELLED) & (known[index] != labels)
    if differs.any():
        sample = int(index[np.argmax(differs)])
        named = f"sample {sample}" + (f" (id {str(ids[sample])!r})" if ids is not None else "")
        raise InputError("label_conflict", f"{named} is labelled {int(known[sample])} "
                         f"already; labels are append-only (asked: {int(labels[differs][0])})")
    merged = known.copy()
    merged[index] = labels
    return merged, int((known[index] == UNLABELLED).sum())


def label_studio_labels(data: bytes, *, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(sample indices, class names) of a Label Studio JSON export of disagreement tasks:
    each task's `data.index` and the choice of its last annotation that was not cancelled
    (tasks without one are skipped)."""
    try:
        tasks = json.loads(data)
        pairs = [(int(task["data"]["index"]), choice) for task in tasks
                 if (choice := _annotated_choice(task)) is not None]
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise InputError("labels_corrupt", f"{source}: not a Label Studio JSON export of "
                         f"flipgate's tasks ({type(error).__name__}: {error})") from error
    index = np.array([sample for sample, _ in pairs], dtype=np.int64)
    return index, np.array([str(choice) for _, choice in pairs], dtype=str)


def _annotated_choice(task: dict) -> str | None:
    """The class name chosen in the task's last annotation that was not cancelled."""
    for annotation in reversed(task.get("annotations") or []):
        if annotation.get("was_cancelled"):
            continue
        for result in annotation.get("result", []):
            if result.get("from_name") == CHOICES_FROM and result["value"].get("choices"):
                return result["value"]["choices"][0]
    return None


# The disagreements' export ---------------------------------------------------------------

def top_probabilities(logits: np.ndarray | None, rows: np.ndarray) -> list[float | None]:
    """The top softmax probability of each of `rows` of the logits (None without logits)."""
    if logits is None:
        return [None] * rows.size
    ascending = np.sort(rows)  # a memory-mapped file is read in order
    chosen = np.asarray(logits[ascending], dtype=np.float64)[np.searchsorted(ascending, rows)]
    return softmax(chosen).max(axis=1).tolist()


def disagreement_rows(order: np.ndarray, predictions: tuple[np.ndarray, np.ndarray],
                      confidences: tuple[list, list], *, evalset: EvalSet,
                      class_names: list[str]) -> list[dict]:
    """One row per disagreement, in the export order: its position, index, id, both
    predictions (class names), both confidences (top probability) and what people look at."""
    old_pred, new_pred = predictions
    view = sample_view(evalset)
    return [{"rank": rank, "index": int(i),
             "id": None if evalset.ids is None else str(evalset.ids[i]),
             "old": class_names[old_pred[i]], "new": class_names[new_pred[i]],
             "old_confidence": old_conf, "new_confidence": new_conf,
             **shown(evalset, int(i), view)}
            for rank, (i, old_conf, new_conf) in enumerate(zip(order, *confidences, strict=True))]


def sample_view(evalset: EvalSet) -> "SampleView":
    """How the export shows the set's samples: as the flip gallery does (its `text`, its
    `images`, its only input when that is a float image, else the inputs' values)."""
    from flipgate.reporting.gallery import SampleView

    return SampleView.of_arrays(evalset.shown_arrays())


def shown(evalset: EvalSet, index: int, view: "SampleView") -> dict[str, str]:
    """What people look at for a sample, as `view` shows it: {"image": PNG data URI} drawn
    as the flip gallery draws it, {"text": the set's text}, or {"text": its input values}
    (at most MAX_SHOWN_VALUES of each input)."""
    from flipgate.reporting.gallery import IMAGE, png_data_uri, values_text

    arrays = evalset.shown_arrays()
    values = {name: np.asarray(arrays[name][index]) for name in view.arrays}
    if view.kind == IMAGE:
        return {"image": png_data_uri(values[view.arrays[0]])}
    if view.arrays == ("text",):
        return {"text": str(values["text"])}
    return {"text": values_text(values, MAX_SHOWN_VALUES)}


def write_export(rows: list[dict], export_format: str, *, version_names: tuple[str, str]) -> bytes:
    """The rows as a JSON list, a CSV table or a Label Studio task list."""
    if export_format == "csv":
        return _csv(rows)
    if export_format == "label-studio":
        return json.dumps(label_studio_tasks(rows, version_names), allow_nan=False).encode()
    return json.dumps(rows, allow_nan=False).encode()


def _csv(rows: list[dict]) -> bytes:
    columns = ["rank", "index", "id", "old", "new", "old_confidence", "new_confidence",
               "text", "image"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().encode()


def label_studio_tasks(rows: list[dict], version_names: tuple[str, str]) -> list[dict]:
    """Label Studio tasks: `data` holds the sample (text or image), its index, id and rank;
    the two models' predictions are two `predictions` entries (model_version = the version)."""
    def prediction(version: str, choice: str, confidence: float | None) -> dict:
        return {"model_version": version, **({} if confidence is None else {"score": confidence}),
                "result": [{"from_name": CHOICES_FROM, "to_name": SAMPLE_TO, "type": "choices",
                            "value": {"choices": [choice]}}]}

    return [{"data": {key: row[key] for key in ("index", "id", "rank", "text", "image")
                      if key in row},
             "predictions": [prediction(version_names[0], row["old"], row["old_confidence"]),
                             prediction(version_names[1], row["new"], row["new_confidence"])]}
            for row in rows]


def label_studio_config(class_names: Sequence[str], evalset: EvalSet) -> str:
    """The labelling configuration the tasks of `evalset` expect: the sample shown as text
    or image (as the export shows it) and one single choice among the classes."""
    from xml.sax.saxutils import quoteattr

    from flipgate.reporting.gallery import IMAGE

    shown_tag = (f'<Image name="{SAMPLE_TO}" value="$image"/>'
                 if sample_view(evalset).kind == IMAGE
                 else f'<Text name="{SAMPLE_TO}" value="$text"/>')
    choices = "".join(f"\n    <Choice value={quoteattr(name)}/>" for name in class_names)
    return (f'<View>\n  {shown_tag}\n  <Choices name="{CHOICES_FROM}" toName="{SAMPLE_TO}" '
            f'choice="single" showInline="true">{choices}\n  </Choices>\n</View>\n')
