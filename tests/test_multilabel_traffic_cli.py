"""`flipgate compare --multilabel` on the traffic of multi-label models (real digit
composites without their label sets): churn per label and per group of the set's `groups`
against numpy on the models' own probabilities, the disagreements' export (every sample
where any label differs, and which), Label Studio's multiple-choice configuration and tasks
checked by Label Studio's own code, its annotated export read back as the same label
matrix, and NFR_sample from the labels."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from flipgate.datasets import DIGIT_NAMES
from flipgate.formats.evalsets import load_evalset
from flipgate.traffic import read_labels_file
from tests.multilabel_reference import assert_group_churn_matches, group_churn_reference
from tests.multilabel_traffic_data import LabelTraffic, annotated_sets, label_traffic_files


@pytest.fixture(scope="module")
def traffic(tmp_path_factory) -> LabelTraffic:
    return label_traffic_files(tmp_path_factory.mktemp("multilabel-traffic"))


def compare(run_cli, traffic: LabelTraffic, *flags) -> dict:
    result = run_cli("compare", traffic.old, traffic.new, "--evalset", traffic.traffic,
                     "--multilabel", "--scores", "probabilities", "--json", *flags)
    assert result.code == 0, result.err
    return json.loads(result.out)


def nfr_sample(traffic: LabelTraffic) -> float:
    """The share of samples with a label the old model got right and the new one wrong."""
    (old, new), truth = traffic.decisions, traffic.truth
    return float(((old == truth) & (new != truth)).any(axis=1).mean())


def test_churn_per_label_and_per_sample_are_numpys(run_cli, traffic, tmp_path):
    old, new = traffic.decisions
    report = compare(run_cli, traffic, "--disagreements", tmp_path / "d.json")
    assert report["traffic"] and report["multilabel"] and report["nfr"] is None
    assert [row["changed"] for row in report["per_label"]] == (old != new).sum(0).tolist()
    assert [row["churn"] for row in report["per_label"]] == pytest.approx((old != new).mean(0))
    assert report["changed"] == traffic.changed.size > 0
    assert report["per_sample"]["churn"] == report["churn"] == traffic.changed.size / old.shape[0]
    assert report["pooled"]["churn"] == pytest.approx((old != new).mean())
    assert report["nfr_bounds"] == [0.0, report["churn"]] and report["quality"] is None
    assert_group_churn_matches(report, group_churn_reference(old, new, traffic.groups,
                                                             DIGIT_NAMES))


def test_the_export_lists_every_sample_where_any_label_differs(run_cli, traffic, tmp_path):
    old, new = traffic.decisions
    compare(run_cli, traffic, "--disagreements", tmp_path / "d.json")
    compare(run_cli, traffic, "--disagreements", tmp_path / "d.csv", "--format", "csv")
    rows = json.loads((tmp_path / "d.json").read_text())
    assert sorted(row["index"] for row in rows) == traffic.changed.tolist()
    for row in rows:
        i = row["index"]
        assert row["id"] == f"req-{i}" and row["image"].startswith("data:image/png;base64,")
        assert (row["old"], row["new"]) == (traffic.names(old[i]), traffic.names(new[i]))
        assert row["changed_labels"] == traffic.names(old[i] != new[i]) != []
    with (tmp_path / "d.csv").open() as table:
        read = list(csv.DictReader(table))
    assert [int(row["index"]) for row in read] == [row["index"] for row in rows]
    assert [json.loads(row["changed_labels"]) for row in read] == [
        row["changed_labels"] for row in rows]


def test_label_studio_multiple_choice_round_trip(run_cli, traffic, tmp_path):
    """The tasks and the multiple-choice configuration pass Label Studio's own checks; the
    annotated export (every disagreement given its true label set) reads back as the true
    label matrix, and `--labels` makes NFR_sample exact: numpy's."""
    from label_studio_sdk.converter import Converter
    from label_studio_sdk.label_interface import LabelInterface

    tasks_path, config_path = tmp_path / "tasks.json", tmp_path / "config.xml"
    compare(run_cli, traffic, "--disagreements", tasks_path, "--format", "label-studio",
            "--label-config", config_path)
    config = config_path.read_text()
    assert 'choice="multiple"' in config
    interface = LabelInterface(config)
    tasks = json.loads(tasks_path.read_text())
    export = annotated_sets(tasks, traffic.truth)
    for task in export:
        assert interface.validate_task({"data": task["data"]})
        assert all(interface.validate_prediction(p) for p in task["predictions"])
        assert interface.validate_annotation(task["annotations"][0])
    (tmp_path / "export.json").write_text(json.dumps(export))
    converter = Converter(config, str(tmp_path), download_resources=False)
    converter.convert_to_json_min(str(tmp_path / "export.json"), str(tmp_path / "min"),
                                  is_dir=False)
    by_label_studio = json.loads((tmp_path / "min" / "result.json").read_text())
    named = [traffic.names(traffic.truth[task["data"]["index"]]) for task in export]
    assert [_choices(task.get("label")) for task in by_label_studio] == named
    index, matrix = read_labels_file(tmp_path / "export.json", multilabel=True,
                                     evalset=load_evalset(traffic.traffic),
                                     class_names=[str(d) for d in range(10)], num_classes=10)
    assert np.array_equal(matrix, traffic.truth[index]) and sorted(index) == sorted(
        traffic.changed)
    report = compare(run_cli, traffic, "--labels", tmp_path / "export.json")
    assert report["disagreements"]["complete"]
    assert report["nfr"] == pytest.approx(nfr_sample(traffic)) and report["nfr"] > 0


def _choices(label) -> list[str]:
    """Label Studio's min-JSON label of a choices tag: one name, a list of them, or none."""
    if label is None:
        return []
    return sorted(label["choices"] if isinstance(label, dict) else
                  [label] if isinstance(label, str) else label)


def test_a_labelled_prefix_estimates_nfr_sample(run_cli, traffic, tmp_path):
    """Half of the export labelled (as a 0/1 matrix, and as padded label names: the same
    labels): NFR_sample estimated, numpy's value inside the interval."""
    rows = json.loads(_export(run_cli, traffic, tmp_path).read_text())
    half = np.array([row["index"] for row in rows[: len(rows) // 2]])
    np.savez(tmp_path / "matrix.npz", index=half, y=traffic.truth[half].astype(np.int8))
    names = np.full((half.size, 3), "")
    for row, i in enumerate(half):
        chosen = traffic.names(traffic.truth[i])
        names[row, :len(chosen)] = chosen
    np.savez(tmp_path / "names.npz", ids=np.array([f"req-{i}" for i in half]), y=names)
    by_matrix = compare(run_cli, traffic, "--labels", tmp_path / "matrix.npz")
    assert compare(run_cli, traffic, "--labels", tmp_path / "names.npz") == by_matrix
    labelled = by_matrix["disagreements"]
    assert labelled["labelled_prefix"] == half.size and not labelled["complete"]
    low, high = labelled["nfr_interval"]
    assert low <= nfr_sample(traffic) <= high and low <= labelled["nfr_estimate"] <= high


def _export(run_cli, traffic: LabelTraffic, folder: Path) -> Path:
    """The JSON export of the disagreements, written in `folder`."""
    compare(run_cli, traffic, "--disagreements", folder / "order.json")
    return folder / "order.json"


def test_label_sets_naming_a_label_the_line_lacks_are_refused(run_cli, traffic, tmp_path):
    np.savez(tmp_path / "eleven.npz", index=traffic.changed[:2],
             y=np.array([["3", "eleven"], ["4", ""]]))
    result = run_cli("compare", traffic.old, traffic.new, "--evalset", traffic.traffic,
                     "--multilabel", "--scores", "probabilities", "--labels",
                     tmp_path / "eleven.npz")
    assert result.code != 0 and "label 'eleven' names no class" in result.err
    np.savez(tmp_path / "nine.npz", index=traffic.changed[:2], y=np.ones((2, 9), np.int8))
    result = run_cli("compare", traffic.old, traffic.new, "--evalset", traffic.traffic,
                     "--multilabel", "--scores", "probabilities", "--labels",
                     tmp_path / "nine.npz")
    assert result.code != 0 and "9 label columns, but the labels are 10" in result.err
