"""The flip gallery: the negatively flipped samples of a comparison, each drawn as a small
PNG (image eval sets) or shown as a table row (other shapes), with its label and both models'
predictions and confidences, the most confidently wrong first.

PNGs are written with zlib and struct and embedded as data: URIs, so a page that shows them
loads nothing.
"""

import base64
import html
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from flipgate.metrics.probs import softmax
from flipgate.reporting.rows import class_label

MAX_TABLE_VALUES = 16  # values of a non-image sample shown in its table row
MAX_TEXT_CHARS = 400  # characters of a text sample shown
NOT_SHOWN = ("y", "classes", "groups", "ids")  # eval-set arrays that are not the samples
IMAGE, TEXT, TABLE = "image", "text", "table"
GALLERY_CSS = """
.gallery { display: grid; grid-template-columns: repeat(auto-fill, minmax(132px, 1fr));
           gap: .6rem; padding: 0; list-style: none; }
.flip { border: 1px solid #e1e4e8; border-radius: 6px; padding: .45rem; font-size: .78rem;
        background: #fff; }
.flip img { width: 100%; image-rendering: pixelated; background: #000; display: block; }
.flip dl { display: grid; grid-template-columns: auto 1fr; gap: 0 .4rem; margin: .35rem 0 0; }
.flip dt { color: #6a737d; } .flip dd { margin: 0; font-variant-numeric: tabular-nums; }
.flip .new { color: #b31d28; font-weight: 600; }
"""


@dataclass(frozen=True)
class FlipSample:
    """One negatively flipped sample: the old model was right, the new one is wrong."""

    index: int
    label: int
    old_pred: int
    new_pred: int
    old_confidence: float
    new_confidence: float
    values: Mapping[str, np.ndarray]  # this sample's row of each array the gallery shows


@dataclass(frozen=True)
class SampleView:
    """How the gallery shows an eval set's samples (IMAGE, TEXT or TABLE) and which of its
    arrays it reads for that."""

    kind: str
    arrays: tuple[str, ...]

    @classmethod
    def of(cls, shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]]) -> "SampleView":
        """The view of an eval set whose arrays have these (shape, dtype): its `images`, its
        `text`, an image-shaped single input, token ids, or else every input's values."""
        if "images" in shapes:
            return cls(IMAGE, ("images",))
        if "text" in shapes:
            return cls(TEXT, ("text",))
        inputs = tuple(name for name in shapes if name not in (*NOT_SHOWN, "images", "text"))
        if len(inputs) == 1 and is_image(shapes[inputs[0]][0][1:]) \
                and shapes[inputs[0]][1].kind == "f":
            return cls(IMAGE, inputs)
        if "input_ids" in inputs:
            return cls(TEXT, ("input_ids",))
        return cls(TABLE, inputs)

    @classmethod
    def of_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "SampleView":
        return cls.of({name: (array.shape, array.dtype) for name, array in arrays.items()})


def is_image(sample_shape: Sequence[int]) -> bool:
    """Whether samples of this shape are drawn: (H, W), (1, H, W) or (3, H, W)."""
    return len(sample_shape) == 2 or (len(sample_shape) == 3 and sample_shape[0] in (1, 3))


def by_new_confidence(indices: np.ndarray, new_logits: np.ndarray) -> np.ndarray:
    """`indices` ordered by the new model's confidence on them, highest first; `new_logits`
    holds the new model's logits of exactly those samples, in the same order."""
    confidence = softmax(np.asarray(new_logits, dtype=np.float64)).max(axis=1)
    return np.asarray(indices)[np.argsort(-confidence, kind="stable")]


def flip_samples(indices: np.ndarray, labels: np.ndarray, old_logits: np.ndarray,
                 new_logits: np.ndarray, rows: Mapping[str, np.ndarray]) -> list[FlipSample]:
    """The gallery entries of `indices`; the other arrays (and each of `rows`, by the name of
    the eval-set array it comes from) hold those samples' rows in order."""
    old_probs = softmax(np.asarray(old_logits, dtype=np.float64))
    new_probs = softmax(np.asarray(new_logits, dtype=np.float64))
    return [FlipSample(int(index), int(labels[i]), int(old_probs[i].argmax()),
                       int(new_probs[i].argmax()), float(old_probs[i].max()),
                       float(new_probs[i].max()),
                       {name: np.asarray(row[i]) for name, row in rows.items()})
            for i, index in enumerate(indices)]


def gallery_from_arrays(old_logits: np.ndarray, new_logits: np.ndarray, labels: np.ndarray,
                        arrays: Mapping[str, np.ndarray],
                        limit: int) -> tuple[list[FlipSample], int]:
    """The `limit` most confident negative flips of a comparison held in memory (`arrays`:
    the eval-set arrays the gallery shows, by name), and how many there are."""
    negative = np.flatnonzero((old_logits.argmax(1) == labels) & (new_logits.argmax(1) != labels))
    shown = by_new_confidence(negative, new_logits[negative])[:limit]
    return flip_samples(shown, labels[shown], old_logits[shown], new_logits[shown],
                        {name: array[shown] for name, array in arrays.items()}), int(negative.size)


def png_bytes(sample: np.ndarray) -> bytes:
    """A grayscale (H, W) / (1, H, W) or RGB (3, H, W) sample as a PNG, scaled to 0..255;
    uint8 samples (an eval set's `images`: (H, W) or (H, W, 3)) are drawn as they are."""
    if sample.dtype == np.uint8:
        return _png(sample, rgb=sample.ndim == 3)
    values = np.asarray(sample, dtype=np.float64)
    values = values[0] if values.ndim == 3 and values.shape[0] == 1 else values
    rgb = values.ndim == 3
    if rgb:
        values = np.moveaxis(values, 0, -1)
    low, high = np.nanmin(values), np.nanmax(values)
    scaled = np.zeros_like(values) if high <= low else (values - low) / (high - low)
    return _png(np.nan_to_num(scaled * 255).round().astype(np.uint8), rgb=rgb)


def _png(pixels: np.ndarray, *, rgb: bool) -> bytes:
    """(H, W) or (H, W, 3) uint8 pixels as a PNG."""
    height, width = pixels.shape[:2]
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2 if rgb else 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + b"".join(
        _chunk(kind, data) for kind, data in ((b"IHDR", header), (b"IDAT", zlib.compress(raw)),
                                              (b"IEND", b"")))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_data_uri(sample: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(sample)).decode()


def gallery_html(samples: Sequence[FlipSample], view: SampleView,
                 class_names: list[str] | None = None) -> str:
    """Pictures as a grid of cards; text and feature values as a table of rows."""
    if not samples:
        return '<p class="empty">No negative flips.</p>'
    if view.kind == IMAGE:
        return f'<ul class="gallery">{"".join(_card(s, class_names) for s in samples)}</ul>'
    return _rows_table(samples, view, class_names)


def _name(index: int, class_names: list[str] | None) -> str:
    return html.escape(class_label(index, class_names))


def _card(sample: FlipSample, class_names: list[str] | None) -> str:
    label, old, new = (_name(i, class_names) for i in
                       (sample.label, sample.old_pred, sample.new_pred))
    return (f'<li class="flip" data-index="{sample.index}">'
            f'<img src="{png_data_uri(next(iter(sample.values.values())))}" '
            f'alt="sample {sample.index}, label {label}">'
            f"<dl><dt>sample</dt><dd>#{sample.index}</dd><dt>label</dt><dd>{label}</dd>"
            f"<dt>old</dt><dd>{old} ({sample.old_confidence:.2f})</dd>"
            f'<dt>new</dt><dd class="new">{new} ({sample.new_confidence:.2f})</dd></dl></li>')


def _rows_table(samples: Sequence[FlipSample], view: SampleView,
                class_names: list[str] | None) -> str:
    head = "".join(f"<th>{name}</th>" for name in
                   ("sample", "label", "old (conf.)", "new (conf.)", view.kind))
    rows = []
    for s in samples:
        values = html.escape(_shown(s.values, view))
        rows.append(f'<tr class="flip-row" data-index="{s.index}"><td>#{s.index}</td>'
                    f"<td>{_name(s.label, class_names)}</td>"
                    f"<td>{_name(s.old_pred, class_names)} ({s.old_confidence:.2f})</td>"
                    f"<td>{_name(s.new_pred, class_names)} ({s.new_confidence:.2f})</td>"
                    f'<td class="{view.kind}">{values}</td></tr>')
    return (f'<table class="flips"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def _shown(values: Mapping[str, np.ndarray], view: SampleView) -> str:
    """A sample as text: its string, its token ids, or its feature values by array name."""
    if view.kind == TEXT:
        text = str(values[view.arrays[0]]) if view.arrays == ("text",) else " ".join(
            str(v) for v in values[view.arrays[0]].ravel())
        return text[:MAX_TEXT_CHARS] + ("…" if len(text) > MAX_TEXT_CHARS else "")
    return values_text(values)


def values_text(values: Mapping[str, np.ndarray], max_values: int = MAX_TABLE_VALUES) -> str:
    """A sample's feature values as text: the first `max_values` of each array's row, named
    by the array unless the only one is `x`."""
    named = len(values) > 1 or "x" not in values
    return ", ".join(f"{name}={_values(row, max_values)}" if named
                     else _values(row, max_values) for name, row in values.items())


def _values(row: np.ndarray, max_values: int) -> str:
    """The first `max_values` values of a sample's row of one array ("…" for the rest)."""
    flat = np.asarray(row).ravel()
    shown = [v if isinstance(v, str) else f"{v:.3g}" for v in flat[:max_values].tolist()]
    text = ", ".join(shown) + (", …" if flat.size > max_values else "")
    return text if flat.size == 1 else f"[{text}]"
