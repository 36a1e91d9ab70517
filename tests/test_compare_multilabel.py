"""`flipgate compare` on a multi-label eval set (real digits side by side, labelled with the
set of digits they show): scikit-learn's multi-label exports through skl2onnx, checked
against numpy over the models' own ONNX Runtime outputs; thresholds, labels-only versions,
the reports, and the shapes that are refused."""

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.multioutput import MultiOutputClassifier

from flipgate.datasets import digit_composites, save_evalset, small_digits, split
from flipgate.errors import InputError
from flipgate.formats.evalsets import load_evalset
from tests.conftest import save_graph
from tests.multilabel_reference import (
    assert_groups_match,
    assert_matches,
    group_reference,
    reference,
)


@dataclass(frozen=True)
class DigitModels:
    """scikit-learn multi-label models of digit composites exported by skl2onnx, and the
    held-out composites (x flattened, as the models take them) they are compared on."""

    folder: Path
    evalset: Path
    x: np.ndarray
    y: np.ndarray
    models: dict[str, Path]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> DigitModels:
    from skl2onnx import to_onnx

    folder = tmp_path_factory.mktemp("multilabel")
    train_digits, eval_digits = split(small_digits(), 1000, seed=0)
    train, held_out = (digit_composites(n, seed=seed, digits=part) for n, seed, part in (
        (600, 1, train_digits), (300, 2, eval_digits)))
    x, y = train.x.reshape(train.n, -1), train.y.astype(np.int64)
    fitted = {  # name: (model, skl2onnx options)
        "ovr_zipmap": (OneVsRestClassifier(LogisticRegression(max_iter=500)).fit(
            x[:250], y[:250]), None),
        "multioutput": (MultiOutputClassifier(LogisticRegression(max_iter=500)).fit(x, y),
                        {"zipmap": False}),
        "ovr_tensor": (OneVsRestClassifier(LogisticRegression(C=0.1, max_iter=500)).fit(x, y),
                       {"zipmap": False}),
    }
    models = {}
    for name, (model, options) in fitted.items():
        models[name] = folder / f"{name}.onnx"
        models[name].write_bytes(to_onnx(model, x[:1], options=options).SerializeToString())
    flat = replace(held_out, x=held_out.x.reshape(held_out.n, -1))
    return DigitModels(folder, save_evalset(flat, folder / "composites.npz"), flat.x,
                       held_out.y, models)


def own_outputs(path: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A model's probability of each label and its own 0/1 label output, run by ONNX Runtime:
    a ZipMap's maps, a sequence of per-label (N, 2) tensors (column 1: present) or (N, L)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    label, probabilities = session.run(None, {session.get_inputs()[0].name: x})
    if isinstance(probabilities, list) and isinstance(probabilities[0], dict):
        probabilities = np.array([[row[key] for key in sorted(row)] for row in probabilities])
    elif isinstance(probabilities, list):
        probabilities = np.stack([tensor[:, 1] for tensor in probabilities], axis=1)
    return np.asarray(probabilities, dtype=np.float64), np.asarray(label)


def compare(run_cli, old: Path, new: Path, evalset: Path, *flags: str) -> dict:
    result = run_cli("compare", old, new, "--evalset", evalset, "--json", "--device", "cpu",
                     *flags)
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.mark.parametrize(("old", "new"), [("ovr_zipmap", "multioutput"),
                                          ("multioutput", "ovr_tensor")])
@pytest.mark.slow
def test_skl2onnx_exports_give_numpys_figures_of_their_own_outputs(run_cli, digits, old, new):
    report = compare(run_cli, digits.models[old], digits.models[new], digits.evalset)
    (old_p, old_label), (new_p, new_label) = (own_outputs(digits.models[name], digits.x)
                                              for name in (old, new))
    assert np.array_equal(old_p > 0.5, old_label) and np.array_equal(new_p > 0.5, new_label)
    assert_matches(report, reference(digits.y, old_label, new_label, old_p, new_p))
    assert report["label_names"] == [str(digit) for digit in range(10)]
    assert report["pooled"]["negative_flips"] > 0  # the check weighs some flips
    assert [report[side]["scores"] for side in ("old", "new")] == ["probabilities"] * 2
    assert report["old"]["thresholds"] == [0.5] * 10


def with_thresholds(source: Path, target: Path, thresholds: list[float]) -> Path:
    model = onnx.load(str(source))
    helper.set_model_props(model, {"thresholds": json.dumps(thresholds)})
    onnx.save(model, str(target))
    return target


@pytest.mark.slow
def test_thresholds_come_from_the_models_metadata_or_the_command(run_cli, digits, tmp_path):
    declared = [0.3, 0.7] * 5
    new = with_thresholds(digits.models["ovr_tensor"], tmp_path / "declared.onnx", declared)
    old_p, _ = own_outputs(digits.models["ovr_zipmap"], digits.x)
    new_p, _ = own_outputs(new, digits.x)
    report = compare(run_cli, digits.models["ovr_zipmap"], new, digits.evalset)
    assert report["new"]["thresholds"] == declared
    assert_matches(report, reference(digits.y, old_p > 0.5, new_p > np.array(declared),
                                     old_p, new_p))
    given = [0.2] * 10
    (tmp_path / "t.json").write_text(json.dumps(given))
    for flag in (",".join(map(str, given)), str(tmp_path / "t.json")):
        told = compare(run_cli, digits.models["ovr_zipmap"], new, digits.evalset,
                       "--new-thresholds", flag)
        assert told["new"]["thresholds"] == given
        assert_matches(told, reference(digits.y, old_p > 0.5, new_p > 0.2, old_p, new_p))


def sigmoid_model(path: Path, weight: np.ndarray, *, sigmoid: bool) -> Path:
    """A linear multi-label model x @ weight, ending in a Sigmoid or giving its logits."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z" if sigmoid else "scores"])]
    if sigmoid:
        nodes.append(helper.make_node("Sigmoid", ["z"], ["scores"]))
    graph = helper.make_graph(
        nodes, "multilabel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", weight.shape[0]])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", weight.shape[1]])],
        [numpy_helper.from_array(weight.astype(np.float32), "w")])
    return save_graph(graph, path)


@pytest.mark.slow
def test_logits_a_sigmoid_npy_scores_and_decisions(run_cli, digits, tmp_path):
    weight = np.random.default_rng(0).normal(0, 0.05, (digits.x.shape[1], 10))
    logits = sigmoid_model(tmp_path / "logits.onnx", weight, sigmoid=False)
    with_sigmoid = sigmoid_model(tmp_path / "sigmoid.onnx", weight, sigmoid=True)
    z = ort.InferenceSession(str(logits)).run(None, {"x": digits.x})[0].astype(np.float64)
    p = 1 / (1 + np.exp(-z))
    new_p, new_label = own_outputs(digits.models["multioutput"], digits.x)
    report = compare(run_cli, logits, digits.models["multioutput"], digits.evalset)
    assert report["old"]["scores"] == "logits"
    assert_matches(report, reference(digits.y, z > 0, new_label, p, new_p))
    by_sigmoid = compare(run_cli, with_sigmoid, digits.models["multioutput"], digits.evalset)
    assert by_sigmoid["old"]["scores"] == "probabilities"
    for row, same in zip(by_sigmoid["per_label"], report["per_label"], strict=True):
        assert row["negative_flips"] == same["negative_flips"]
        assert row["schurn"] == pytest.approx(same["schurn"], abs=1e-6)
    np.save(tmp_path / "old.npy", z.astype(np.float32))
    np.save(tmp_path / "new.npy", new_label.astype(np.uint8))
    labels_only = compare(run_cli, tmp_path / "old.npy", tmp_path / "new.npy", digits.evalset)
    assert labels_only["labels_only"] and labels_only["pooled"]["schurn"] is None
    assert_matches(labels_only, reference(digits.y, z > 0, new_label))
    np.save(tmp_path / "old_p.npy", p)
    as_probabilities = compare(run_cli, tmp_path / "old_p.npy", tmp_path / "new.npy",
                               digits.evalset, "--old-scores", "probabilities")
    assert as_probabilities["per_label"] == labels_only["per_label"]


@pytest.mark.slow
def test_terminal_and_html_reports_put_the_worst_label_first(run_cli, digits, tmp_path):
    page = tmp_path / "report.html"
    old, new = digits.models["ovr_zipmap"], digits.models["multioutput"]
    result = run_cli("compare", old, new, "--evalset", digits.evalset, "--html", page,
                     "--device", "cpu")
    assert result.code == 0, result.err
    report = compare(run_cli, old, new, digits.evalset)
    worst = max(report["per_label"], key=lambda row: (row["nfr"], row["negative_flips"]))
    first_row = re.search(r"┡[━╇]+┩\n│ (\S+) ", result.out[result.out.index("Per label"):])
    assert first_row and first_row.group(1) == worst["name"]
    text = page.read_text()
    table = text[text.index("Per label, highest NFR first"):]
    assert re.search(r"<tbody><tr><td>(\S+?)</td>", table).group(1) == worst["name"]
    assert f"Label {worst['name']}: {worst['negative_flips']} negative flips" in text
    gallery = text[text.index(f"Label {worst['name']}: "):]
    first_card = gallery[:gallery.index("</li>")]
    index = int(re.search(r'data-index="(\d+)"', first_card).group(1))
    assert index in report["flipped_indices"][worst["name"]]
    assert "<img src=\"data:image/png;base64," in first_card


def test_groups_of_the_set_are_in_every_report(run_cli, tmp_path):
    """The JSON's per-group rows equal numpy's; the terminal and the HTML page show them."""
    rng = np.random.default_rng(0)
    y = rng.random((240, 4)) < 0.3
    groups = rng.choice(np.array(["clinic-a", "clinic-b", "clinic-c"]), 240)
    old = np.where(rng.random(y.shape) < 0.1, ~y, y)
    new = old.copy()
    new[groups == "clinic-b", 1] = ~y[groups == "clinic-b", 1]  # b's label 1 all wrong
    np.savez(evalset := tmp_path / "set.npz", x=rng.random((240, 3)), y=y.astype(np.int8),
             groups=groups, classes=np.array(["cough", "fever", "rash", "ache"]))
    for name, decisions in (("old", old), ("new", new)):
        np.save(tmp_path / f"{name}.npy", decisions.astype(np.uint8))
    sides = (tmp_path / "old.npy", tmp_path / "new.npy")
    report = compare(run_cli, *sides, evalset)
    assert_groups_match(report, group_reference(y, old, new, groups))
    worst = max(report["per_group"], key=lambda row: row["nfr"])
    assert (worst["group"], worst["worst_labels"][0]["name"]) == ("clinic-b", "fever")
    shown = run_cli("compare", *sides, "--evalset", evalset, "--html", tmp_path / "r.html")
    assert shown.code == 0, shown.err
    terminal = shown.out[shown.out.index("Per group"):]
    assert re.search(rf"│ clinic-b +│ +{worst['n']} │ +{100 * worst['nfr']:.2f}% │", terminal)
    assert f"fever ({worst['worst_labels'][0]['negative_flips']})" in terminal
    page = (tmp_path / "r.html").read_text()
    row = re.search(r"<tr><td>clinic-b</td>(.*?)</tr>", page[page.index("Per group"):])
    assert row and f"<td>{100 * worst['nfr']:.2f}%</td>" in row.group(1)


@pytest.mark.slow
def test_label_name_sets_mapped_by_classes_equal_the_matrix(run_cli, digits, tmp_path):
    evalset = load_evalset(digits.evalset, multilabel=True)
    names = np.array([[str(d) for d in np.flatnonzero(row)] + [""] * (3 - row.sum())
                      for row in evalset.y])
    named = tmp_path / "named.npz"
    np.savez(named, x=evalset.x, y=names, classes=np.array(evalset.classes))
    old, new = digits.models["ovr_zipmap"], digits.models["multioutput"]
    assert compare(run_cli, old, new, named) == compare(run_cli, old, new, digits.evalset)


def refused(run_cli, old: Path, new: Path, evalset: Path, *flags: str) -> str:
    result = run_cli("compare", old, new, "--evalset", evalset, "--json", "--device", "cpu",
                     *flags)
    assert result.code == 2
    return json.loads(result.out)["error"]["code"] + ": " + result.err


@pytest.mark.slow
def test_what_disagrees_with_the_set_is_refused_clearly(run_cli, digits, tmp_path):
    evalset = load_evalset(digits.evalset, multilabel=True)
    old, new = digits.models["ovr_zipmap"], digits.models["multioutput"]
    nine = tmp_path / "nine.npz"
    np.savez(nine, x=evalset.x, y=evalset.y[:, :9])
    assert "label_count_mismatch" in refused(run_cli, old, new, nine)
    assert "the model scores 10 labels but the eval set's y has 9" in refused(
        run_cli, old, new, nine)
    assert "invalid_thresholds: flipgate compare: error: " \
           f"{new}: 3 thresholds for 10 labels" in refused(
               run_cli, old, new, digits.evalset, "--new-thresholds", "0.1,0.2,0.3")
    assert "strictly between 0 and 1" in refused(run_cli, old, new, digits.evalset,
                                                 "--thresholds", ",".join(["1.5"] * 10))
    counts = tmp_path / "counts.npz"
    np.savez(counts, x=evalset.x, y=evalset.y.astype(np.int64) * 2)
    assert "labels_not_binary" in refused(run_cli, old, new, counts)
    names_alone = tmp_path / "names.npz"
    np.savez(names_alone, x=evalset.x, y=np.full((evalset.n, 2), "3"))
    assert "labels_need_class_names" in refused(run_cli, old, new, names_alone)
    np.save(tmp_path / "short.npy", np.zeros((evalset.n, 9), np.float32))
    assert "label_count_mismatch" in refused(run_cli, tmp_path / "short.npy", new,
                                             digits.evalset)


@pytest.mark.slow
def test_a_softmax_is_no_multilabel_output_and_thresholds_need_one(run_cli, digits, tmp_path,
                                                                  torch_export_pair):
    weight = np.zeros((digits.x.shape[1], 10))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["z"]),
         helper.make_node("Softmax", ["z"], ["probabilities"], axis=1)], "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", weight.shape[0]])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(weight.astype(np.float32), "w")])
    softmax = save_graph(graph, tmp_path / "softmax.onnx")
    assert "multilabel_softmax" in refused(run_cli, softmax, digits.models["multioutput"],
                                           digits.evalset)
    pair = torch_export_pair
    assert "thresholds_need_multilabel" in refused(
        run_cli, pair.old_onnx, pair.new_onnx, pair.evalset_path, "--thresholds", "0.5")


def test_only_a_caller_that_asks_reads_a_label_matrix(tmp_path):
    """The server and training read eval sets without `multilabel`: they refuse y (N, L)."""
    path = tmp_path / "e.npz"
    np.savez(path, x=np.zeros((4, 3), np.float32), y=np.eye(4, 2, dtype=np.int64))
    with pytest.raises(InputError, match="y must be a 1-D array of integer or string labels"):
        load_evalset(path)
    assert load_evalset(path, multilabel=True).y.tolist() == np.eye(4, 2, dtype=bool).tolist()


def test_digit_composites_are_deterministic_and_labelled_by_their_digits():
    digits = small_digits()
    first, again = (digit_composites(50, seed=3, digits=digits) for _ in range(2))
    assert np.array_equal(first.x, again.x) and np.array_equal(first.y, again.y)
    assert not np.array_equal(first.x, digit_composites(50, seed=4, digits=digits).x)
    assert first.x.shape == (50, 8, 24) and first.classes == tuple("0123456789")
    slots = first.x.reshape(50, 8, 3, 8).transpose(0, 2, 1, 3).reshape(50, 3, -1)
    for image, labels in zip(slots, first.y, strict=True):
        shown = [row for row in image if row.any()]
        matches = {int(digits.y[np.flatnonzero((digits.x.reshape(-1, 64) == row).all(1))[0]])
                   for row in shown}
        assert 2 <= len(shown) <= 3 and matches == set(np.flatnonzero(labels).tolist())
