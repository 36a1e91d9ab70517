"""`flipgate compare` on a traffic set (sklearn's digits with `y` removed): the traffic
report, the disagreements' export in each format, labels read back (an .npz, or a Label
Studio export checked with Label Studio's own code) and NFR exact from them."""

import csv
import json

import numpy as np
import pytest

from tests.traffic_digits import NAMES, Digits, annotated, digits_files


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
