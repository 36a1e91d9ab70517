"""`flipgate compare` on real MNIST models, checked against an independent computation."""

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
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
    # The server computed the logits itself and reports the same flips as the local compare.
    negative_flips = re.findall(r"Negative flips\s*│\s*(\d+)", done.stdout)
    assert len(negative_flips) == 2 and negative_flips[0] == negative_flips[1]
    assert "mnist: NFR (churn) for every pair of versions" in served
    # The gate: 2 (FD towards 1) approved, 3 (plain) blocked, its ELODI repair approved.
    decisions = re.findall(r"│ (\S+)\s+│ (\S+)\s+│ (approve|block|pending) ", served)
    assert decisions == [("1", "—", "approve"), ("2", "1", "approve"), ("3", "2", "block"),
                         ("3-elodi", "2", "approve")], served
    assert "on mnist-eval: NFR 0.0156 is above the maximum 0.01" in served
    assert "The dashboard of this line: http://127.0.0.1:8000/ui/lines/mnist" in served
