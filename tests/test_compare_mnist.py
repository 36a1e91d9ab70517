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

from flipgate.processes import free_port
from tests.reasons import rate_figures

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
    measured, (low, high), limit = rate_figures(served.partition("on mnist-eval: NFR ")[2])
    assert measured == pytest.approx(nfr("2", "3"), abs=5e-5) and limit == 0.01
    assert low < measured < high
    assert [row[1] for row in rows.values()] == ["approve", "approve", "block", "approve"]
    matrix = served.partition("NFR (churn) for every pair of versions")[2]
    for old in "123":
        cells = re.search(rf"│ {old}\s+│(.*)\n", matrix).group(1)
        expected = [f"{pct(nfr(old, new))} ({pct(churn(old, new))})" for new in "123"]
        assert [cell.strip() for cell in cells.split("│")[:3]] == expected, cells
    repaired = rows["3-elodi"]
    assert repaired[:2] == ("2", "approve") and float(repaired[2].rstrip("%")) <= 1.0


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`flipgate demo` run once, as the README's first command runs it; its output and its
    data folder (flipgate-data, beside which the README's tour starts)."""
    data = tmp_path_factory.mktemp("demo") / "flipgate-data"
    done = subprocess.run([Path(sys.executable).with_name("flipgate"), "demo", "--data-dir", data],
                          capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})
    return done, data


def test_demo_command_runs_end_to_end(demo_run):
    done, data = demo_run
    assert done.returncode == 0, done.stderr
    local, _, served = done.stdout.partition("The same update through flipgate serve")
    assert "Verdict hints" in local and served, done.stdout
    folder = data / "demo"
    assert {p.name for p in folder.iterdir()} >= {"old.onnx", "new.onnx", "fd.onnx",
                                                  "mnist-eval.npz", "mnist-train.npz",
                                                  "report.html", "server"}
    check_demo_numbers(done.stdout, *demo_predictions(folder))
    assert "mnist: NFR (churn) for every pair of versions" in served
    assert "The dashboard of this line: http://127.0.0.1:8000/ui/lines/mnist" in served


def readme_tour(port: int) -> str:
    """The README's five-minute tour as a script, its server on `port` instead of 8000."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    tour = re.search(r"\n## A five-minute tour\n.*?```sh\n(.*?)```", readme, re.S).group(1)
    return (tour.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            .replace("flipgate serve &", f"flipgate serve --port {port} &"))


def test_the_readme_tour_walks_on_the_demo(demo_run):
    """Every command of the tour succeeds on the demo's files, and its last, `flipgate gate`,
    ends with a verdict on the repair it registered: exit 0 approve, 1 block."""
    done, data = demo_run
    assert done.returncode == 0, done.stderr
    *commands, gate = readme_tour(free_port()).rstrip("\n").split("\n")
    assert gate.startswith("flipgate gate ")
    script = "\n".join(["trap 'kill %1; wait' EXIT", "set -e", *commands,
                        f"{gate} || code=$?", 'echo "gate exit ${code:-0}"'])
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith("FLIPGATE_")} | {"PATH": path, "COLUMNS": "200"}
    walked = subprocess.run(["bash", "-c", script], cwd=data.parent, capture_output=True,
                            text=True, check=False, timeout=300, env=environment)
    assert walked.returncode == 0, walked.stdout + walked.stderr
    verdict = re.search(r"^(APPROVE|BLOCK): mnist:4 against mnist:3-elodi", walked.stdout, re.M)
    assert verdict, walked.stdout + walked.stderr
    assert f"gate exit {['APPROVE', 'BLOCK'].index(verdict.group(1))}" in walked.stdout
    assert (data / "demo" / "ensemble.onnx").is_file()
