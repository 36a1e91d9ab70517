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
from flipgate.formats.evalsets import EvalSet, check_labels, label_columns, label_sets_matrix
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
                     multilabel: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(sample indices, label columns) in a labels file: an .npz of `index` (or `ids`, the
    set's sample ids) and `y` (columns below `num_classes` when it is known, or names that
    `class_names` maps to columns), or a Label Studio JSON export of tasks made by the
    disagreements export. With `multilabel`, the labels are label sets, returned as a 0/1
    matrix (k, num_classes): see `_label_set_matrix`."""
    source = source or str(path)
    path = Path(path)
    if not path.is_file():
        raise InputError("file_not_found", f"{source}: no such labels file")
    if zipfile.is_zipfile(path):
        index, labels = _npz_labels(path, evalset, source)
    else:
        index, labels = label_studio_labels(path.read_bytes(), source=source,
                                            multiple=multilabel)
    if multilabel:
        return _checked_index(index, evalset.n, source), _label_set_matrix(
            labels, index.size, class_names, num_classes, source)
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
    if labels.shape != index.shape or labels.dtype.kind not in "iuU":
        raise InputError("labels_shape", f"{source}: labels need one integer index and one "
                         f"label (integer or class name) per row, got {index.dtype} "
                         f"{index.shape} and {labels.dtype} {labels.shape}")
    index = _checked_index(index, n, source)
    columns = label_columns(labels, class_names or [], source=source)
    check_labels(columns, num_classes, source=source)
    return index, columns


def _checked_index(index: np.ndarray, n: int, source: str) -> np.ndarray:
    """Sample indices: integers (N,) within the set, each once."""
    if index.ndim != 1 or index.dtype.kind not in "iu":
        raise InputError("labels_shape", f"{source}: labels need one integer sample index "
                         f"per row, got {index.dtype} {index.shape}")
    if index.size and (index.min() < 0 or index.max() >= n):
        raise InputError("labels_index_out_of_range", f"{source}: sample indices must lie in "
                         f"[0, {n})")
    if np.unique(index).size != index.size:
        raise InputError("labels_duplicate_sample", f"{source}: a sample is labelled twice")
    return index.astype(np.int64)


def _label_set_matrix(labels: "np.ndarray | list[list[str]]", rows: int,
                      label_names: Sequence[str] | None, num_labels: int | None,
                      source: str) -> np.ndarray:
    """Label sets as an int64 0/1 matrix (rows, L): a 0/1 (or bool) matrix (rows, L) as it
    is; label names, one per row (rows,) or padded with empty strings (rows, K), or lists
    of them (Label Studio's choices), mapped by `label_names`. A name the line lacks is
    refused (`unknown_class_name`), and so is another label count (`label_count_mismatch`)."""
    if isinstance(labels, np.ndarray) and labels.dtype.kind in "biu":
        matrix = _flag_matrix(labels, rows, source)
    else:
        matrix = _named_sets_matrix(labels, rows, label_names, source)
    if num_labels is not None and matrix.shape[1] != num_labels:
        raise InputError("label_count_mismatch", f"{source}: {matrix.shape[1]} label columns, "
                         f"but the labels are {num_labels}")
    return matrix


def _flag_matrix(labels: np.ndarray, rows: int, source: str) -> np.ndarray:
    """A 0/1 (or bool) matrix (rows, L) of label sets, checked, as int64."""
    if labels.ndim != 2 or labels.shape[0] != rows:
        raise InputError("labels_shape", f"{source}: multi-label labels need a 0/1 row of "
                         f"L labels per sample, got {labels.dtype} {labels.shape}")
    if not np.isin(labels, (0, 1)).all():
        raise InputError("labels_not_binary", f"{source}: a multi-label y must hold only "
                         "0 and 1")
    return labels.astype(np.int64)


def _named_sets_matrix(labels: "np.ndarray | list[list[str]]", rows: int,
                       label_names: Sequence[str] | None, source: str) -> np.ndarray:
    """Label names ((rows,), (rows, K) padded with empty strings, or lists) as a 0/1 int64
    matrix whose columns `label_names` names."""
    if isinstance(labels, np.ndarray) and (labels.dtype.kind != "U" or labels.ndim > 2
                                           or labels.shape[0] != rows):
        raise InputError("labels_shape", f"{source}: label names need a row per sample, "
                         f"got {labels.dtype} {labels.shape}")
    if not label_names:
        raise InputError("labels_need_class_names", f"{source}: labels are label names, "
                         "but no label names are known to map them; give a 0/1 matrix")
    sets = labels.reshape(rows, -1) if isinstance(labels, np.ndarray) else labels
    return label_sets_matrix(sets, label_names, source=source).astype(np.int64)


def merge_labels(known: np.ndarray, index: np.ndarray, labels: np.ndarray, *,
                 ids: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """The labels known (N,, UNLABELLED where unknown; multi-label: label sets (N, L), a
    whole row UNLABELLED) with new ones added, and how many samples were new. Append-only:
    a different label for a labelled sample is refused (naming it); the same label again
    changes nothing."""
    width = int(np.prod(known.shape[1:]))  # 1, or L
    before, asked = known[index].reshape(index.size, width), labels.reshape(index.size, width)
    unlabelled = before[:, 0] == UNLABELLED
    differs = ~unlabelled & (before != asked).any(axis=1)
    if differs.any():
        row = int(np.argmax(differs))
        sample = int(index[row])
        named = f"sample {sample}" + (f" (id {str(ids[sample])!r})" if ids is not None else "")
        raise InputError("label_conflict", f"{named} is labelled {_shown(known[sample])} "
                         f"already; labels are append-only (asked: {_shown(labels[row])})")
    merged = known.copy()
    merged[index] = labels
    return merged, int(unlabelled.sum())


def _shown(label: np.ndarray) -> str:
    """A class (an integer) or a label set (a 0/1 row) as a message shows it."""
    return str(label.tolist())


def label_studio_labels(data: bytes, *, source: str, multiple: bool = False,
                        ) -> tuple[np.ndarray, "np.ndarray | list[list[str]]"]:
    """(sample indices, class names) of a Label Studio JSON export of disagreement tasks:
    each task's `data.index` and the choice of its last annotation that was not cancelled
    (tasks without one are skipped). With `multiple` (a multi-label line's tasks), the
    label names chosen, a list per task: an annotation that chose none gives the empty set."""
    try:
        tasks = json.loads(data)
        pairs = [(int(task["data"]["index"]), choices) for task in tasks
                 if (choices := _annotated_choices(task, multiple)) is not None]
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise InputError("labels_corrupt", f"{source}: not a Label Studio JSON export of "
                         f"flipgate's tasks ({type(error).__name__}: {error})") from error
    index = np.array([sample for sample, _ in pairs], dtype=np.int64)
    if multiple:
        return index, [[str(name) for name in choices] for _, choices in pairs]
    return index, np.array([str(choices[0]) for _, choices in pairs], dtype=str)


def _annotated_choices(task: dict, multiple: bool) -> list | None:
    """The names chosen in the task's last annotation that was not cancelled: one (None
    when it chose none) or, with `multiple`, every one (an empty list when it chose none)."""
    for annotation in reversed(task.get("annotations") or []):
        if annotation.get("was_cancelled"):
            continue
        chosen = [result["value"]["choices"] for result in annotation.get("result", [])
                  if result.get("from_name") == CHOICES_FROM and result["value"].get("choices")]
        if multiple:
            return [name for names in chosen for name in names]
        if chosen:
            return chosen[0][:1]
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


def label_set_rows(order: np.ndarray, decisions: tuple[np.ndarray, np.ndarray], *,
                   evalset: EvalSet, label_names: list[str]) -> list[dict]:
    """One row per disagreement of a multi-label pair (a sample whose decisions differ on
    any label), in the export order: its position, index, id, both label sets and the labels
    that differ (names, in label order) and what people look at."""
    view = sample_view(evalset)
    names = np.asarray(label_names, dtype=object)

    def named(row: np.ndarray) -> list[str]:
        return names[np.asarray(row, dtype=bool)].tolist()

    old, new = decisions
    return [{"rank": rank, "index": int(i),
             "id": None if evalset.ids is None else str(evalset.ids[i]),
             "old": named(old[i]), "new": named(new[i]), "changed_labels": named(old[i] != new[i]),
             **shown(evalset, int(i), view)}
            for rank, i in enumerate(order.tolist())]


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


def write_export(rows: list[dict], export_format: str, *, version_names: tuple[str, str],
                 multilabel: bool = False) -> bytes:
    """The rows as a JSON list, a CSV table or a Label Studio task list (`multilabel`: the
    rows of `label_set_rows`)."""
    if export_format == "csv":
        return _csv(rows, multilabel)
    if export_format == "label-studio":
        return json.dumps(label_studio_tasks(rows, version_names), allow_nan=False).encode()
    return json.dumps(rows, allow_nan=False).encode()


def _csv(rows: list[dict], multilabel: bool) -> bytes:
    """The rows as a table; a multi-label row's label sets as JSON lists of names."""
    columns = ["rank", "index", "id", "old", "new",
               *(["changed_labels"] if multilabel else ["old_confidence", "new_confidence"]),
               "text", "image"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows({key: json.dumps(value) if isinstance(value, list) else value
                      for key, value in row.items()} for row in rows)
    return buffer.getvalue().encode()


def label_studio_tasks(rows: list[dict], version_names: tuple[str, str]) -> list[dict]:
    """Label Studio tasks: `data` holds the sample (text or image), its index, id and rank;
    the two models' predictions are two `predictions` entries (model_version = the version)."""
    def prediction(version: str, choice: "str | list[str]", confidence: float | None) -> dict:
        choices = choice if isinstance(choice, list) else [choice]  # a label set, or a class
        return {"model_version": version, **({} if confidence is None else {"score": confidence}),
                "result": [{"from_name": CHOICES_FROM, "to_name": SAMPLE_TO, "type": "choices",
                            "value": {"choices": choices}}] if choices else []}

    return [{"data": {key: row[key] for key in ("index", "id", "rank", "text", "image")
                      if key in row},
             "predictions": [prediction(version_names[0], row["old"], row.get("old_confidence")),
                             prediction(version_names[1], row["new"], row.get("new_confidence"))]}
            for row in rows]


def label_studio_config(class_names: Sequence[str], evalset: EvalSet, *,
                        multiple: bool = False) -> str:
    """The labelling configuration the tasks of `evalset` expect: the sample shown as text
    or image (as the export shows it) and one single choice among the classes (`multiple`:
    any number of the labels, for a multi-label line)."""
    from xml.sax.saxutils import quoteattr

    from flipgate.reporting.gallery import IMAGE

    shown_tag = (f'<Image name="{SAMPLE_TO}" value="$image"/>'
                 if sample_view(evalset).kind == IMAGE
                 else f'<Text name="{SAMPLE_TO}" value="$text"/>')
    choices = "".join(f"\n    <Choice value={quoteattr(name)}/>" for name in class_names)
    choice = "multiple" if multiple else "single"
    return (f'<View>\n  {shown_tag}\n  <Choices name="{CHOICES_FROM}" toName="{SAMPLE_TO}" '
            f'choice="{choice}" showInline="true">{choices}\n  </Choices>\n</View>\n')
