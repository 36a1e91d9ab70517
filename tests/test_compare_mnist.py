"""`flipgate compare` on real MNIST models, checked against an independent computation."""

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from scipy.stats import binomtest

pytestmark = pytest.mark.slow


def torch_predictions(model: torch.nn.Module, x: np.ndarray) -> list[int]:
    with torch.no_grad():
        return model(torch.from_numpy(x)).argmax(dim=1).tolist()


def independent_counts(old: list[int], new: list[int], labels: list[int]) -> dict:
    """Plain Python over the samples: no flipgate code involved."""
    negative = [i for i, (o, n, y) in enumerate(zip(old, new, labels, strict=True))
                if o == y and n != y]
    positive = [i for i, (o, n, y) in enumerate(zip(old, new, labels, strict=True))
                if o != y and n == y]
    total = len(labels)
    return {
        "n": total,
        "er_old": sum(o != y for o, y in zip(old, labels, strict=True)) / total,
        "er_new": sum(n != y for n, y in zip(new, labels, strict=True)) / total,
        "nfr": len(negative) / total,
        "pfr": len(positive) / total,
        "churn": sum(o != n for o, n in zip(old, new, strict=True)) / total,
        "negative": negative,
        "positive": positive,
    }


@pytest.fixture(scope="module")
def expected(mnist_pair) -> dict:
    x, labels = mnist_pair.evalset.x, mnist_pair.evalset.y.tolist()
    return independent_counts(torch_predictions(mnist_pair.old_torch, x),
                              torch_predictions(mnist_pair.new_torch, x), labels)


def test_json_report_matches_independent_computation(mnist_pair, expected, run_cli):
    result = run_cli("compare", mnist_pair.old_onnx, mnist_pair.new_onnx,
                     "--evalset", mnist_pair.evalset_path, "--json", "--batch-size", "300")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    for key in ("n", "er_old", "er_new", "nfr", "pfr", "churn"):
        assert report[key] == pytest.approx(expected[key], abs=1e-12), key
    assert report["flipped_indices"] == {"negative": expected["negative"],
                                         "positive": expected["positive"]}
    assert report["negative_flips"] == len(expected["negative"]) > 0
    assert report["mcnemar_p"] == pytest.approx(
        binomtest(len(expected["negative"]), len(expected["negative"]) + len(expected["positive"]),
                  0.5, alternative="greater").pvalue)
    assert report["nfr_ci"][0] < report["nfr"] < report["nfr_ci"][1]
    labels = mnist_pair.evalset.y
    by_class = [sum(labels[i] == c for i in expected["negative"]) for c in range(10)]
    assert [row["negative_flips"] for row in report["per_class"]] == by_class
    assert report["old"]["provider"] == "CPUExecutionProvider"


def test_precomputed_logits_give_the_same_flips(mnist_pair, expected, run_cli, tmp_path):
    paths = []
    for name, model in (("old", mnist_pair.old_torch), ("new", mnist_pair.new_torch)):
        with torch.no_grad():
            logits = model(torch.from_numpy(mnist_pair.evalset.x)).numpy()
        np.save(tmp_path / f"{name}.npy", logits)
        paths.append(tmp_path / f"{name}.npy")
    result = run_cli("compare", *paths, "--evalset", mnist_pair.evalset_path, "--json")
    report = json.loads(result.out)
    assert report["flipped_indices"]["negative"] == expected["negative"]
    assert report["old"]["provider"] == "precomputed"


class TagCounter(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)


def test_terminal_and_html_reports(mnist_pair, expected, run_cli, tmp_path):
    page = tmp_path / "report.html"
    result = run_cli("compare", mnist_pair.old_onnx, mnist_pair.new_onnx,
                     "--evalset", mnist_pair.evalset_path, "--html", page)
    assert result.code == 0
    assert f"{100 * expected['nfr']:.2f}%" in result.out
    assert "Per class" in result.out and "Verdict hints" in result.out
    parser = TagCounter()
    parser.feed(page.read_text())
    assert parser.tags.count("svg") == 4 and "script" not in parser.tags
    assert f"wrote {page}" in result.err


def demo_predictions(folder: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Each demo model's predicted classes on the demo's eval set, by plain ONNX Runtime."""
    with np.load(folder / "mnist-eval.npz", allow_pickle=False) as evalset:
        x, labels = evalset["x"], evalset["y"]
    predicted = {}
    for version, file in (("1", "old.onnx"), ("2", "fd.onnx"), ("3", "new.onnx")):
        session = onnxruntime.InferenceSession(folder / file, providers=["CPUExecutionProvider"])
        predicted[version] = session.run(None, {session.get_inputs()[0].name: x})[0].argmax(1)
    return predicted, labels


def pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def check_demo_numbers(stdout: str, predicted: dict[str, np.ndarray], labels: np.ndarray) -> None:
    """Every number the demo prints about versions 1, 2 and 3 equals plain numpy over the
    models' own predictions: the two reports (local and served), the gate's table, the matrix."""
    def nfr(old, new):
        return np.mean((predicted[old] == labels) & (predicted[new] != labels))

    def churn(old, new):
        return np.mean(predicted[old] != predicted[new])

    er = {version: np.mean(classes != labels) for version, classes in predicted.items()}
    local, _, served = stdout.partition("The same update through flipgate serve")
    for report in (local, served):  # both compare version 1 (old.onnx) with 3 (new.onnx)
        flips = int(np.sum((predicted["1"] == labels) & (predicted["3"] != labels)))
        assert re.search(rf"Negative flips\s*│\s*{flips}\s", report), report
        assert re.search(rf"│\s*{pct(nfr('1', '3'))} \(95% CI", report), report
        assert f"{pct(er['1'])} → {pct(er['3'])}" in report
        assert re.search(rf"{pct(churn('1', '3'))} \(old-correct", report), report
    decisions = re.findall(r"│ (\S+)\s+│ (\S+)\s+│ (approve|block|pending)\s+│ (\S+)\s+│ "
                           r"(\S+ pts|—)", served)
    rows = {candidate: (baseline, verdict, shown_nfr, points)
            for candidate, baseline, verdict, shown_nfr, points in decisions}
    assert rows["1"] == ("—", "approve", "—", "—")
    for candidate, baseline in (("2", "1"), ("3", "2")):
        points = f"{100 * (er[candidate] - er[baseline]):+.2f} pts"
        verdict = "approve" if nfr(baseline, candidate) <= 0.01 else "block"
        assert rows[candidate] == (baseline, verdict, pct(nfr(baseline, candidate)), points)
    assert f"on mnist-eval: NFR {nfr('2', '3'):.4g} is above the maximum 0.01" in served
    assert [row[1] for row in rows.values()] == ["approve", "approve", "block", "approve"]
    matrix = served.partition("NFR (churn) for every pair of versions")[2]
    for old in "123":
        cells = re.search(rf"│ {old}\s+│(.*)\n", matrix).group(1)
        expected = [f"{pct(nfr(old, new))} ({pct(churn(old, new))})" for new in "123"]
        assert [cell.strip() for cell in cells.split("│")[:3]] == expected, cells
    repaired = rows["3-elodi"]
    assert repaired[:2] == ("2", "approve") and float(repaired[2].rstrip("%")) <= 1.0


def test_demo_command_runs_end_to_end(tmp_path):
    flipgate = Path(sys.executable).with_name("flipgate")
    done = subprocess.run([flipgate, "demo", "--data-dir", tmp_path], capture_output=True,
                          text=True, check=False, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    local, _, served = done.stdout.partition("The same update through flipgate serve")
    assert "Verdict hints" in local and served, done.stdout
    folder = tmp_path / "demo"
    assert {p.name for p in folder.iterdir()} >= {"old.onnx", "new.onnx", "fd.onnx",
                                                  "mnist-eval.npz", "mnist-train.npz",
                                                  "report.html", "server"}
    check_demo_numbers(done.stdout, *demo_predictions(folder))
    assert "mnist: NFR (churn) for every pair of versions" in served
    assert "The dashboard of this line: http://127.0.0.1:8000/ui/lines/mnist" in served
