"""`flipgate traffic import`: a traffic set and two versions' predictions from what serving
systems log, paired by request id (docs/traffic.md). Two formats:

- `sagemaker`: SageMaker Data Capture JSON lines, one file (or more) per variant: each line
  holds `captureData.endpointInput` and `.endpointOutput` ({"data", "encoding": CSV, JSON or
  BASE64}) and `eventMetadata` (the request id: `inferenceId` when the caller set one, else
  `eventId`).
- `kserve`: KServe's payload logger, CloudEvents in structured mode, one JSON object a line:
  a request event (`type` org.kubeflow.serving.inference.request) and a response event
  (...response) share the request's `id`; `data` (or `data_base64`) holds the V1
  ({"instances"} / {"predictions"}) or V2 ({"inputs"} / {"outputs"}) payload.

A request may carry a batch: its k instances become samples `<id>/0` … `<id>/k-1`. Records
that cannot be read are counted by reason, and requests logged on one side only are counted
as unpaired; none is dropped silently: the summary says how many and which.
"""

import argparse
import base64
import binascii
import csv
import io
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flipgate.errors import InputError
from flipgate.scores import PROBABILITIES, SCORE_KINDS, to_logits

FORMATS = ("sagemaker", "kserve")
KSERVE_REQUEST = "org.kubeflow.serving.inference.request"
KSERVE_RESPONSE = "org.kubeflow.serving.inference.response"
SHOWN_PROBLEMS = 10  # malformed records named in the summary (all are counted)


class Malformed(ValueError):
    """A record that cannot be read: its reason (a short code)."""


@dataclass(frozen=True)
class Exchange:
    """One logged request and its answer: the instances sent and the outputs returned."""

    request_id: str
    inputs: np.ndarray  # (k, features)
    outputs: np.ndarray  # (k, C) scores, or (k,) labels


@dataclass
class Side:
    """What one version's capture files held: its exchanges by request id, and the records
    that could not be read (reason -> count; the first few with their place)."""

    exchanges: dict[str, Exchange] = field(default_factory=dict)
    malformed: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    unpaired_events: int = 0  # KServe: a request without its response, or the reverse

    def refuse(self, where: str, reason: str) -> None:
        self.malformed[reason] += 1
        if len(self.problems) < SHOWN_PROBLEMS:
            self.problems.append(f"{where}: {reason}")

    def keep(self, exchange: Exchange, where: str) -> None:
        if exchange.request_id in self.exchanges:
            return self.refuse(where, "duplicate_request_id")
        self.exchanges[exchange.request_id] = exchange


def json_lines(paths: list[Path]) -> Iterator[tuple[str, dict | None]]:
    """(file:line, the line's JSON object or None when it is not one) for every non-empty
    line of the files."""
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise InputError("capture_unreadable", f"{path}: cannot read ({error})") from error
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                yield f"{path}:{number}", record if isinstance(record, dict) else None


def matrix(values, what: str) -> np.ndarray:
    """A batch of numbers as a float array of one row per instance (a flat list is one
    instance)."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (ValueError, TypeError) as error:
        raise Malformed(f"{what}_not_numeric") from error
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.size == 0 or not np.isfinite(array).all():
        raise Malformed(f"{what}_shape")
    return array


def _outputs(values) -> np.ndarray:
    """A batch of outputs: one integer class per instance (JSON integers) as labels (k,),
    else rows of scores (k, C) (a single score per row: a binary classifier's class 1)."""
    array = np.asarray(values) if isinstance(values, list | np.ndarray) else None
    if array is None or array.dtype.kind not in "iu":
        return matrix(values, "output")
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1 or array.size == 0:
        raise Malformed("output_shape")
    return array.astype(np.int64)


# SageMaker Data Capture ------------------------------------------------------------------

def _sagemaker_payload(part: dict, what: str):
    """The decoded `data` of an endpointInput or endpointOutput: CSV rows or JSON."""
    encoding, data = str(part.get("encoding", "")).upper(), part.get("data")
    if not isinstance(data, str):
        raise Malformed(f"{what}_missing")
    if encoding == "BASE64":
        try:
            data = base64.b64decode(data, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as error:
            raise Malformed(f"{what}_base64") from error
        encoding = "JSON" if "json" in str(part.get("observedContentType", "")) else "CSV"
    if encoding == "CSV":
        return [[float(cell) for cell in row] for row in csv.reader(io.StringIO(data)) if row]
    try:
        return json.loads(data)
    except ValueError as error:
        raise Malformed(f"{what}_json") from error


def _batch(payload, keys: tuple[str, ...], what: str):
    """The instances (or predictions) of a JSON payload: under one of `keys`, or the
    payload itself when it is a list."""
    if isinstance(payload, dict):
        found = next((payload[key] for key in keys if key in payload), None)
        if found is None:
            raise Malformed(f"{what}_missing")
        return found
    return payload


def sagemaker_exchange(record: dict) -> Exchange:
    """The exchange a Data Capture line logged."""
    try:
        capture, meta = record["captureData"], record["eventMetadata"]
        request_id = meta.get("inferenceId") or meta["eventId"]
        sent = _sagemaker_payload(capture["endpointInput"], "input")
        answered = _sagemaker_payload(capture["endpointOutput"], "output")
    except (KeyError, TypeError, AttributeError) as error:
        raise Malformed("not_a_capture_record") from error
    inputs = matrix(_batch(sent, ("instances", "inputs", "features"), "input"), "input")
    outputs = _outputs(_batch(answered, ("predictions", "probabilities", "scores"), "output"))
    return _checked_exchange(str(request_id), inputs, outputs)


def _checked_exchange(request_id: str, inputs: np.ndarray, outputs: np.ndarray) -> Exchange:
    if outputs.shape[0] != inputs.shape[0]:
        raise Malformed("batch_sizes_differ")
    return Exchange(request_id, inputs, outputs)


def read_sagemaker(paths: list[Path]) -> Side:
    """One variant's exchanges from its Data Capture files."""
    side = Side()
    for where, record in json_lines(paths):
        try:
            if record is None:
                raise Malformed("not_json")
            side.keep(sagemaker_exchange(record), where)
        except Malformed as problem:
            side.refuse(where, str(problem))
    return side


# KServe payload logger (CloudEvents) -----------------------------------------------------

def _event_data(event: dict):
    """The JSON payload of a structured-mode CloudEvent (`data`, or `data_base64`)."""
    if "data_base64" in event:
        try:
            return json.loads(base64.b64decode(event["data_base64"], validate=True))
        except (binascii.Error, ValueError) as error:
            raise Malformed("data_base64") from error
    data = event.get("data")
    if isinstance(data, str):
        try:
            return json.loads(data)
        except ValueError as error:
            raise Malformed("data_json") from error
    if data is None:
        raise Malformed("data_missing")
    return data


def _v2_tensor(tensors, what: str) -> np.ndarray:
    """The first tensor of a V2 `inputs` / `outputs` list, shaped by its `shape`."""
    try:
        tensor = tensors[0]
        return np.asarray(tensor["data"]).reshape(tensor["shape"])
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise Malformed(f"{what}_v2_tensor") from error


def kserve_values(payload, what: str):
    """The instances (requests) or predictions (responses) of a V1 or V2 payload."""
    if not isinstance(payload, dict):
        raise Malformed(f"{what}_not_an_object")
    v1, v2 = ("instances", "inputs") if what == "input" else ("predictions", "outputs")
    if v1 in payload and not (what == "input" and isinstance(payload[v1], list)
                              and payload[v1] and isinstance(payload[v1][0], dict)):
        return payload[v1]
    if v2 in payload:
        return _v2_tensor(payload[v2], what)
    raise Malformed(f"{what}_missing")


def read_kserve(paths: list[Path]) -> Side:
    """One version's exchanges from its payload logger's events: each request event joined
    with the response event of the same id."""
    side, requests, responses = Side(), {}, {}
    for where, event in json_lines(paths):
        try:
            if event is None:
                raise Malformed("not_json")
            kind, event_id = event.get("type"), event.get("id")
            if kind not in (KSERVE_REQUEST, KSERVE_RESPONSE) or not isinstance(event_id, str):
                raise Malformed("not_an_inference_event")
            half = requests if kind == KSERVE_REQUEST else responses
            if event_id in half:
                raise Malformed("duplicate_request_id")
            half[event_id] = (where, kserve_values(_event_data(event), "input" if half is
                                                   requests else "output"))
        except Malformed as problem:
            side.refuse(where, str(problem))
    for event_id in [event_id for event_id in requests if event_id in responses]:
        where, sent = requests[event_id]
        try:
            side.keep(_checked_exchange(event_id, matrix(sent, "input"),
                                        _outputs(responses[event_id][1])), where)
        except Malformed as problem:
            side.refuse(where, str(problem))
    side.unpaired_events = len(requests.keys() ^ responses.keys())
    return side


READERS = {"sagemaker": read_sagemaker, "kserve": read_kserve}


# Pairing the two versions -----------------------------------------------------------------

@dataclass(frozen=True)
class Imported:
    """The traffic set's arrays, both versions' predictions, and the counts of what was not
    paired or not readable."""

    x: np.ndarray
    ids: np.ndarray
    old: np.ndarray
    new: np.ndarray
    summary: dict


def pair_sides(old: Side, new: Side, *, scores: str) -> Imported:
    """The samples of the requests both versions answered (in the old side's order), their
    outputs as logits (`scores`: what the outputs are) or labels."""
    common = [rid for rid in old.exchanges if rid in new.exchanges]
    summary = {"paired_requests": len(common),
               "unpaired": {"old_only": len(old.exchanges.keys() - new.exchanges.keys()),
                            "new_only": len(new.exchanges.keys() - old.exchanges.keys()),
                            "old_events": old.unpaired_events,
                            "new_events": new.unpaired_events},
               "malformed": {"old": dict(old.malformed), "new": dict(new.malformed)},
               "problems": [*(f"old {p}" for p in old.problems),
                            *(f"new {p}" for p in new.problems)]}
    rows, ids, outputs = [], [], {"old": [], "new": []}
    for rid in common:
        first, second = old.exchanges[rid], new.exchanges[rid]
        if first.inputs.shape != second.inputs.shape or not np.allclose(first.inputs,
                                                                        second.inputs):
            summary["malformed"]["inputs_differ"] = summary["malformed"].get(
                "inputs_differ", 0) + 1
            continue
        rows.append(first.inputs)
        k = first.inputs.shape[0]
        ids += [rid] if k == 1 else [f"{rid}/{i}" for i in range(k)]
        outputs["old"].append(first.outputs)
        outputs["new"].append(second.outputs)
    if not rows:
        raise InputError("capture_nothing_paired", "no request was answered by both versions "
                         f"(summary: {json.dumps(summary)})")
    summary["samples"] = len(ids)
    return Imported(_stacked(rows, "input"), np.array(ids),
                    *(_predictions(outputs[side], scores) for side in ("old", "new")), summary)


def _stacked(parts: list[np.ndarray], what: str) -> np.ndarray:
    widths = {part.shape[1:] for part in parts}
    if len(widths) > 1:
        raise InputError("capture_shapes_differ", f"the logged {what}s have different shapes "
                         f"{sorted(widths)}")
    return np.concatenate(parts).astype(np.float32)


def _predictions(parts: list[np.ndarray], scores: str) -> np.ndarray:
    """One version's outputs: labels (N,) as they are, score rows as logits (N, C)."""
    stacked = np.concatenate(parts) if {part.ndim for part in parts} == {parts[0].ndim} else None
    if stacked is None or (stacked.ndim == 2 and len({part.shape[1] for part in parts}) > 1):
        raise InputError("capture_shapes_differ", "a version's outputs mix labels and scores "
                         "or have different numbers of classes")
    return stacked if stacked.ndim == 1 else to_logits(stacked, scores, source="outputs")


def import_capture(capture_format: str, old_paths: list[Path], new_paths: list[Path], *,
                   scores: str = PROBABILITIES) -> Imported:
    """The traffic set and predictions of two versions' capture files."""
    reader = READERS[capture_format]
    return pair_sides(reader(old_paths), reader(new_paths), scores=scores)


def write_import(imported: Imported, out: Path, classes: list[str] | None) -> list[Path]:
    """traffic.npz (x, ids, and `classes` when given), old.npy and new.npy in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    arrays = {"x": imported.x, "ids": imported.ids,
              **({"classes": np.array(classes)} if classes else {})}
    np.savez(out / "traffic.npz", **arrays)
    np.save(out / "old.npy", imported.old)
    np.save(out / "new.npy", imported.new)
    return [out / name for name in ("traffic.npz", "old.npy", "new.npy")]


def run_traffic_import(args: argparse.Namespace) -> int:
    """Write the traffic set and both predictions, then print what was paired, unpaired
    and malformed."""
    imported = import_capture(args.capture_format, args.old, args.new, scores=args.scores)
    written = write_import(imported, args.out, args.classes)
    print(json.dumps({**imported.summary, "written": [str(path) for path in written]},
                     indent=None if args.json else 2))
    left_out = sum(imported.summary["unpaired"].values()) + sum(
        sum(counts.values()) if isinstance(counts, dict) else counts
        for counts in imported.summary["malformed"].values())
    if left_out:
        print(f"flipgate traffic import: {left_out} records or requests were not paired or "
              "not readable (see unpaired, malformed and problems)", file=sys.stderr)
    return 0


def add_traffic_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate traffic` command and its `import` subcommand."""
    from flipgate.commands import Parser, comma_list

    traffic = commands.add_parser("traffic", help="traffic sets from serving systems' logs")
    sub = traffic.add_subparsers(dest="traffic_command", required=True, parser_class=Parser)
    imports = sub.add_parser("import", help="a traffic set and two versions' predictions from "
                             "SageMaker Data Capture or KServe payload-logger records")
    imports.add_argument("--format", dest="capture_format", choices=FORMATS, required=True)
    imports.add_argument("--old", type=Path, nargs="+", required=True, metavar="FILE",
                         help="the baseline's capture files (JSON lines)")
    imports.add_argument("--new", type=Path, nargs="+", required=True, metavar="FILE",
                         help="the candidate's capture files (JSON lines)")
    imports.add_argument("--out", type=Path, required=True, metavar="DIR",
                         help="where traffic.npz, old.npy and new.npy are written")
    imports.add_argument("--scores", choices=SCORE_KINDS, default=PROBABILITIES,
                         help="what score outputs are (default: probabilities)")
    imports.add_argument("--classes", type=comma_list, metavar="NAME,NAME",
                         help="the class names, stored as the set's `classes`")
    imports.add_argument("--json", action="store_true", help="the summary on one line")
    imports.set_defaults(run=run_traffic_import)
