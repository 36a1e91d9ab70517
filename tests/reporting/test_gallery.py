"""The flip gallery: PNGs that decode to the samples, the most confident flips first, and
`flipgate compare --html` with and without it."""

import base64
import io
import re

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from flipgate.datasets import save_evalset
from flipgate.formats.evalsets import EvalSet
from flipgate.metrics import compare_logits
from flipgate.metrics.probs import softmax
from flipgate.reporting.gallery import (
    IMAGE,
    TABLE,
    TEXT,
    FlipSample,
    SampleView,
    gallery_from_arrays,
    gallery_html,
    is_image,
    png_bytes,
)
from tests.conftest import linear_onnx

IMAGE_SOURCES = re.compile(r'<img src="data:image/png;base64,([^"]+)"')


@pytest.mark.parametrize("shape", [(5, 7), (1, 5, 7), (3, 5, 7)])
def test_png_decodes_to_the_sample_scaled_to_bytes(shape):
    sample = np.random.default_rng(0).normal(size=shape)
    image = np.asarray(Image.open(io.BytesIO(png_bytes(sample))))
    expected = sample[0] if len(shape) == 3 and shape[0] == 1 else sample
    expected = np.moveaxis(expected, 0, -1) if len(shape) == 3 and shape[0] == 3 else expected
    scaled = (expected - expected.min()) / (expected.max() - expected.min()) * 255
    assert image.shape == expected.shape
    assert np.abs(image.astype(float) - scaled).max() <= 0.5


def test_a_constant_sample_is_a_black_image():
    assert np.asarray(Image.open(io.BytesIO(png_bytes(np.full((4, 4), 3.0))))).max() == 0


def test_image_shapes():
    assert is_image((28, 28)) and is_image((1, 28, 28)) and is_image((3, 32, 32))
    assert not is_image((64,)) and not is_image((4, 28, 28)) and not is_image((2, 3, 4, 5))


def test_gallery_holds_the_negative_flips_most_confident_first():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 200)
    old, new = rng.normal(size=(200, 4)), rng.normal(size=(200, 4)) * 3
    x = rng.normal(size=(200, 6, 6))
    samples, total = gallery_from_arrays(old, new, labels, {"x": x}, limit=10)
    expected = compare_logits(old, new, labels)
    assert total == expected["negative_flips"] > 10 and len(samples) == 10
    confidence = softmax(new).max(axis=1)
    flipped = np.array(expected["flipped_indices"]["negative"])
    assert [s.index for s in samples] == list(flipped[np.argsort(-confidence[flipped])][:10])
    for s in samples:
        assert s.label == labels[s.index] == s.old_pred != s.new_pred == new[s.index].argmax()
        assert s.new_confidence == pytest.approx(confidence[s.index])
        assert np.array_equal(s.values["x"], x[s.index])


def test_other_shapes_are_a_table_of_rows_and_names_are_escaped():
    sample = FlipSample(3, 0, 0, 1, 0.9, 0.8, {"x": np.arange(40.0)})
    page = gallery_html([sample], SampleView(TABLE, ("x",)), class_names=["<b>cat</b>", "dog"])
    assert "<img" not in page and 'data-index="3"' in page
    assert "&lt;b&gt;cat&lt;/b&gt;" in page and "<b>cat" not in page
    assert "0, 1, 2" in page and "…" in page  # long rows are cut


@pytest.fixture
def digit_models(tmp_path):
    """Two linear classifiers of 8x8 digit images and an eval set of 300 digits."""
    data = load_digits()
    x, y = (data.images[:300] / 16).astype(np.float32), data.target[:300]
    flat = x.reshape(300, -1)
    means = np.stack([flat[y == c].mean(0) for c in range(10)])
    rng = np.random.default_rng(0)
    paths = [linear_onnx(tmp_path / f"{name}.onnx", (means + noise).T, np.zeros(10), ("N", 8, 8))
             for name, noise in (("old", 0), ("new", rng.normal(0, 0.25, means.shape)))]
    return paths, save_evalset(EvalSet(x, y), tmp_path / "digits.npz")


@pytest.mark.slow
def test_compare_html_has_the_gallery_unless_left_out(run_cli, digit_models, tmp_path):
    (old, new), evalset = digit_models
    with_gallery, without = tmp_path / "with.html", tmp_path / "without.html"
    assert run_cli("compare", old, new, "--evalset", evalset, "--html", with_gallery).code == 0
    assert run_cli("compare", old, new, "--evalset", evalset, "--html", without,
                   "--no-gallery").code == 0
    report = run_cli("compare", old, new, "--evalset", evalset, "--json")
    flips = int(re.search(r'"negative_flips": (\d+)', report.out).group(1))
    page = with_gallery.read_text()
    images = IMAGE_SOURCES.findall(page)
    assert len(images) == flips > 0 and f"Negative flips ({flips})" in page
    for encoded in images:
        assert Image.open(io.BytesIO(base64.b64decode(encoded))).size == (8, 8)
    assert "<img" not in without.read_text() and 'class="gallery"' not in without.read_text()


def flip_of(values: dict) -> FlipSample:
    return FlipSample(7, 0, 0, 1, 0.9, 0.6, values)


def test_text_is_shown_as_text_never_as_a_picture():
    arrays = {"input_ids": np.ones((3, 8), np.int64), "attention_mask": np.ones((3, 8), np.int64),
              "text": np.array(["a <b>bold</b> claim", "b", "c"])}
    view = SampleView.of_arrays(arrays)
    assert view == SampleView(TEXT, ("text",))
    page = gallery_html([flip_of({"text": arrays["text"][0]})], view, ["spam", "ham"])
    assert "<img" not in page and "a &lt;b&gt;bold&lt;/b&gt; claim" in page
    assert "<td>spam</td>" in page and "ham (0.60)" in page


def test_token_ids_stand_in_for_missing_text():
    ids = np.array([[101, 2023, 0]])
    view = SampleView.of_arrays({"input_ids": ids, "attention_mask": ids > 0})
    assert view == SampleView(TEXT, ("input_ids",))
    assert "101 2023 0" in gallery_html([flip_of({"input_ids": ids[0]})], view)


def test_tabular_samples_are_feature_values_by_column():
    columns = {"alcohol": np.array([13.25, 12.0]), "hue_level": np.array(["mid", "low"])}
    view = SampleView.of_arrays({**columns, "y": np.zeros(2, int)})
    assert view == SampleView(TABLE, ("alcohol", "hue_level"))
    page = gallery_html([flip_of({name: array[0] for name, array in columns.items()})], view)
    assert "alcohol=13.2, hue_level=mid" in page


def test_an_images_array_is_drawn_in_its_own_colours():
    rgb = np.zeros((2, 4, 5, 3), np.uint8)
    rgb[0, :, :, 0] = 200
    view = SampleView.of_arrays({"input_ids": np.ones((2, 3), np.int64), "images": rgb})
    assert view == SampleView(IMAGE, ("images",))
    drawn = np.asarray(Image.open(io.BytesIO(png_bytes(rgb[0]))))
    assert drawn.shape == (4, 5, 3) and (drawn == rgb[0]).all()
