"""`flipgate compare` with predicted labels (.npy of shape (N,)): a classifier known only by
its answers, compared with another such one or with an ONNX model."""

import json

import numpy as np
import pytest

from flipgate.metrics import compare_labels, compare_logits
from flipgate.metrics.report import SCORE_KEYS_WITHOUT_SCORES


def test_labels_give_the_same_counts_as_the_logits_they_come_from(torch_export_pair):
    pair = torch_export_pair
    groups = np.arange(pair.evalset.n) % 3
    from_logits = compare_logits(pair.old_logits, pair.new_logits, pair.evalset.y,
                                 groups=groups)
    from_labels = compare_labels(pair.old_logits.argmax(1), pair.new_logits.argmax(1),
                                 pair.evalset.y, 10, groups=groups)
    assert from_labels.keys() == from_logits.keys()
    for key, value in from_labels.items():
        if key in SCORE_KEYS_WITHOUT_SCORES:
            assert value is None
        elif key == "prediction_difference":
            assert value["delta_h"] == from_logits[key]["delta_h"]
        elif key != "labels_only":
            assert value == from_logits[key], key


def test_cli_compares_labels_with_labels_and_with_an_onnx_model(torch_export_pair, run_cli,
                                                                 tmp_path):
    pair = torch_export_pair
    old, new, y = pair.old_logits.argmax(1), pair.new_logits.argmax(1), pair.evalset.y
    np.save(tmp_path / "old.npy", old)
    np.save(tmp_path / "new.npy", new.astype(np.int32))
    for old_model in (tmp_path / "old.npy", pair.old_onnx):
        result = run_cli("compare", old_model, tmp_path / "new.npy", "--evalset",
                         pair.evalset_path, "--json", "--device", "cpu")
        assert result.code == 0, result.err
        report = json.loads(result.out)
        assert report["negative_flips"] == int(((old == y) & (new != y)).sum())
        assert report["positive_flips"] == int(((old != y) & (new == y)).sum())
        assert report["churn"] == pytest.approx(float((old != new).mean()))
        assert report["labels_only"] and report["schurn"] is None


def test_cli_labels_report_prints_and_writes_html(torch_export_pair, run_cli, tmp_path):
    np.save(tmp_path / "old.npy", torch_export_pair.old_logits.argmax(1))
    page = tmp_path / "report.html"
    result = run_cli("compare", tmp_path / "old.npy", torch_export_pair.new_onnx, "--evalset",
                     torch_export_pair.evalset_path, "--html", page, "--device", "cpu")
    assert result.code == 0, result.err
    assert "Negative flips" in result.out
    assert "predicted labels only" in page.read_text()


@pytest.mark.parametrize(("labels", "message"), [
    (np.zeros(5, dtype=np.int64), "predicted labels for an eval set"),
    (np.array([-1] * 597), "must lie in"),
    (np.array(["cat"] * 597), "class names"),
])
def test_cli_refuses_bad_labels(torch_export_pair, run_cli, tmp_path, labels, message):
    np.save(tmp_path / "bad.npy", labels)
    result = run_cli("compare", tmp_path / "bad.npy", torch_export_pair.new_onnx, "--evalset",
                     torch_export_pair.evalset_path)
    assert result.code != 0 and message in result.err
