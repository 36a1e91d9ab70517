"""`flipgate train` end to end: every recipe trains, exports ONNX + record, and compare reads it.

The data are 200 random 6x6 images whose label (3 classes) is the brightest of three vertical
bands, so the "old" model can be written by hand as an exact linear classifier (conftest's
`linear_onnx`), independently of the training code under test.
"""

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from flipgate.formats.evalsets import load_evalset
from flipgate.inference import OnnxClassifier
from flipgate.train.config import TrainConfig
from flipgate.train.methods import METHODS, AntiDistill, Paragon, resolve_options
from flipgate.train.recipes import train

from ..conftest import linear_onnx

pytestmark = pytest.mark.slow

SAMPLES, SIDE, CLASSES = 200, 6, 3
ARCH = "mlp:hidden=16"
BANDS = [slice(0, 2), slice(2, 4), slice(4, 6)]  # label = argmax of the three column bands' sums

# One option flag per method, so the test also sees flags reach the recipe and the record.
# Ensembles get few members to keep the test fast.
OVERRIDES: dict[str, dict[str, object]] = {
    "baseline": {},
    "kd": {"temperature": 2.0},
    "fd": {"divergence": "lm"},
    "elodi": {"members": 2},
    "codistill": {"ramp_steps": 3},
    "entropy": {"alpha": 0.3},
    "anti_distill": {"members": 3},
    "paragon": {"members": 3},
}


def band_labels(x: np.ndarray) -> np.ndarray:
    sums = np.stack([x[:, :, band].sum(axis=(1, 2)) for band in BANDS], axis=1)
    return sums.argmax(axis=1).astype(np.int64)


def write_data(path: Path, labels_override: dict[int, int] | None = None) -> Path:
    x = np.random.default_rng(0).normal(size=(SAMPLES, SIDE, SIDE)).astype(np.float32)
    y = band_labels(x)
    for index, label in (labels_override or {}).items():
        y[index] = label
    np.savez(path, x=x, y=y)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The training set, a variant with a 4th class, and hand-written exact old models."""
    folder = tmp_path_factory.mktemp("recipes")
    weight = np.zeros((SIDE * SIDE, CLASSES))
    for column in range(SIDE):
        weight[np.arange(SIDE) * SIDE + column, column // 2] = 1.0
    shape = ("N", SIDE, SIDE)
    return {
        "data": write_data(folder / "data.npz"),
        "data4": write_data(folder / "data4.npz", {7: 3}),
        "old": linear_onnx(folder / "old.onnx", weight, np.zeros(CLASSES), shape),
        # The same predictions with logits three times as large.
        "old_x3": linear_onnx(folder / "old_x3.onnx", 3 * weight, np.zeros(CLASSES), shape),
    }


def flags(options: dict[str, object]) -> list[str]:
    return [item for name, value in options.items()
            for item in (f"--{name.replace('_', '-')}", str(value))]


def train_cli(run_cli, files, out: Path, method: str, *extra: str, old: bool | None = None,
              arch: str = ARCH, old_model: str = "old"):
    """Run `flipgate train`; the old model is passed where the recipe uses one (or if asked)."""
    if old is None:
        old = METHODS[method].old != "unused"
    args = ["train", "--method", method, "--arch", arch, "--train", files["data"], "--out", out,
            "--epochs", "1", *extra]
    return run_cli(*args, *(["--old", files[old_model]] if old else []))


def outputs(path: Path, x: np.ndarray) -> np.ndarray:
    return OnnxClassifier(path, device="cpu").predict(x)


def record_of(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_trains_exports_and_compares(method, files, tmp_path, run_cli):
    out = tmp_path / f"{method}.onnx"
    result = train_cli(run_cli, files, out, method, "--batch-size", "50",
                       *flags(OVERRIDES[method]))
    assert result.code == 0, result.err
    assert out.is_file() and out.with_suffix(".json").is_file()
    assert f"trained {method} ({ARCH}) on {SAMPLES} samples" in result.out

    record = record_of(out)
    defaults = asdict(resolve_options(method, None, has_old=METHODS[method].old != "unused"))
    assert record["method"] == method and record["arch"] == ARCH
    assert record["options"] == {**defaults, **OVERRIDES[method]}
    assert record["train"] == {"epochs": 1, "batch_size": 50, "lr": 0.001, "weight_decay": 0.0,
                               "seed": 0}
    assert record["samples"] == SAMPLES and record["num_classes"] == CLASSES
    assert record["targets_old_model"] is (METHODS[method].old != "unused")

    compared = run_cli("compare", files["old"], out, "--evalset", files["data"], "--json")
    assert compared.code == 0, compared.err
    report = json.loads(compared.out)
    assert report["n"] == SAMPLES and report["num_classes"] == CLASSES
    data = load_evalset(files["data"])
    assert report["er_old"] == 0.0  # the hand-written old model is exact
    new_errors = outputs(out, data.x).argmax(axis=1) != data.y
    assert report["er_new"] == pytest.approx(new_errors.mean())


@pytest.mark.parametrize("method", ["baseline", "elodi"])
def test_same_seed_gives_the_same_model_and_another_seed_another(method, files, tmp_path,
                                                                 run_cli):
    x = load_evalset(files["data"]).x
    found = {}
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        out = tmp_path / f"{name}.onnx"
        extra = ["--members", "2"] if method == "elodi" else []
        assert train_cli(run_cli, files, out, method, "--seed", seed, *extra).code == 0
        found[name] = outputs(out, x)
    np.testing.assert_array_equal(found["a"], found["b"])
    assert np.abs(found["a"] - found["c"]).max() > 1e-4


@pytest.mark.parametrize(("method", "options"),
                         [("paragon", Paragon(members=3)),
                          ("anti_distill", AntiDistill(members=3))])
def test_ensembles_export_one_graph_averaging_their_members(method, options, files, tmp_path,
                                                            run_cli):
    out = tmp_path / f"{method}.onnx"
    assert train_cli(run_cli, files, out, method, "--members", "3", "--seed", "4").code == 0
    graph = onnx.load(out).graph
    assert len(graph.input) == 1 and len(graph.output) == 1
    linear_layers = [node for node in graph.node if node.op_type in ("Gemm", "MatMul")]
    assert len(linear_layers) == 3 * 2  # every member's two Linear layers in the one graph

    # The same run through the Python API gives the members as torch modules.
    data = load_evalset(files["data"])
    trained = train(method, ARCH, data, CLASSES, TrainConfig(epochs=1, seed=4), options)
    members = list(trained.module.members)
    assert len(members) == 3
    with torch.no_grad():
        member_logits = np.stack([m(torch.from_numpy(data.x)).numpy() for m in members])
    assert np.abs(member_logits[0] - member_logits[1]).max() > 1e-3  # members really differ
    exported = outputs(out, data.x)
    np.testing.assert_allclose(exported, member_logits.mean(axis=0), atol=1e-5, rtol=1e-5)
    assert np.abs(exported - member_logits[0]).max() > 1e-4


def test_cnn_architecture_trains_against_an_old_model(files, tmp_path, run_cli):
    out = tmp_path / "fd_cnn.onnx"
    result = train_cli(run_cli, files, out, "fd", arch="cnn:channels=4,8")
    assert result.code == 0, result.err
    assert record_of(out)["arch"] == "cnn:channels=4,8"
    assert sum(node.op_type == "Conv" for node in onnx.load(out).graph.node) == 2
    compared = run_cli("compare", files["old"], out, "--evalset", files["data"], "--json")
    assert compared.code == 0 and json.loads(compared.out)["n"] == SAMPLES


def test_elodi_adds_the_legacy_term_with_weight_one_half_only_given_an_old_model(
        files, tmp_path, run_cli):
    x = load_evalset(files["data"]).x
    runs = {
        "no_old": ([], False),
        "old_default": ([], True),
        "old_half": (["--legacy-weight", "0.5"], True),
        "old_one": (["--legacy-weight", "1"], True),
    }
    found, records = {}, {}
    for name, (extra, old) in runs.items():
        out = tmp_path / f"{name}.onnx"
        result = train_cli(run_cli, files, out, "elodi", "--members", "2", "--lr", "0.01",
                           *extra, old=old)
        assert result.code == 0, result.err
        found[name], records[name] = outputs(out, x), record_of(out)

    assert records["no_old"]["targets_old_model"] is False
    assert records["old_default"]["targets_old_model"] is True
    # The record holds the weight the recipe applied, not the unset option.
    assert records["old_default"]["options"]["legacy_weight"] == 0.5
    assert records["no_old"]["options"]["legacy_weight"] is None
    assert records["old_half"]["options"]["legacy_weight"] == 0.5
    # The old model's logits change training, and the default weight is exactly 0.5 ...
    assert np.abs(found["old_default"] - found["no_old"]).max() > 1e-4
    np.testing.assert_array_equal(found["old_default"], found["old_half"])
    # ... while weight 1 leaves only the ensemble term, i.e. training without the old model.
    np.testing.assert_allclose(found["old_one"], found["no_old"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", ["kd", "fd", "elodi"])
def test_the_old_models_logits_shape_the_new_model(method, files, tmp_path, run_cli):
    """Two old models with equal predictions but different logits give different students."""
    x = load_evalset(files["data"]).x
    extra = ["--lr", "0.01", *(["--members", "2"] if method == "elodi" else [])]
    found = []
    for old_model in ("old", "old_x3"):
        out = tmp_path / f"{old_model}.onnx"
        result = train_cli(run_cli, files, out, method, *extra, old_model=old_model)
        assert result.code == 0, result.err
        found.append(outputs(out, x))
    assert np.abs(found[0] - found[1]).max() > 1e-4


# (method, extra args, give --old, data file, message the one stderr line must hold)
BAD = {
    "unknown method": ("nonsense", [], False, "data",
                       "argument --method: invalid choice: 'nonsense'"),
    "kd without --old": ("kd", [], False, "data",
                         "method 'kd' needs the old model (--old OLD.onnx)"),
    "fd without --old": ("fd", [], False, "data", "method 'fd' needs the old model"),
    "baseline with --old": ("baseline", [], True, "data",
                            "method 'baseline' does not use an old model; drop --old"),
    "option of another method": ("kd", ["--members", "3"], True, "data",
                                 "--members does not apply to --method kd (it takes --lam, "
                                 "--temperature)"),
    "invalid option value": ("elodi", ["--alpha", "2", "--members", "2"], False, "data",
                             "alpha must lie in [0, 1], got 2.0"),
    "option not a number": ("elodi", ["--k", "abc"], False, "data",
                            "argument --k: expected int, got 'abc'"),
    "zero epochs": ("baseline", ["--epochs", "0"], False, "data",
                    "argument --epochs: must be a positive integer, got 0"),
    "negative epochs": ("baseline", ["--epochs", "-3"], False, "data",
                        "argument --epochs: must be a positive integer, got -3"),
    "zero learning rate": ("baseline", ["--lr", "0"], False, "data", "lr must be > 0"),
    "infinite learning rate": ("baseline", ["--lr", "inf"], False, "data", "lr must be > 0"),
    "negative ensemble size": ("paragon", ["--members", "-1"], False, "data",
                               "members must lie in [1, 64] (an integer), got -1"),
    "labels beyond the old model's classes": (
        "kd", [], True, "data4", "labels must lie in [0, 3); label 3 at index 7 does not"),
    "unknown arch": ("baseline", ["--arch", "transformer"], False, "data",
                     "unknown architecture 'transformer'"),
    "unknown arch option": ("baseline", ["--arch", "mlp:width=3"], False, "data",
                            "unknown option 'width' in 'mlp:width=3'; accepted: ['hidden']"),
    "unreadable arch option": ("baseline", ["--arch", "mlp:hidden=abc"], False, "data",
                               "cannot read option 'hidden=abc' of 'mlp:hidden=abc'"),
    "legacy weight without --old": ("elodi", ["--legacy-weight", "0.5"], False, "data",
                                    "ELODI's legacy weight needs the old model (--old)"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_refused_with_one_line(case, files, tmp_path, run_cli):
    method, extra, old, data, message = BAD[case]
    out = tmp_path / "refused.onnx"
    args = ["train", "--method", method, "--arch", ARCH, "--train", files[data], "--out", out,
            "--epochs", "1", *extra, *(["--old", files["old"]] if old else [])]
    result = run_cli(*args)
    assert result.code == 2
    assert result.err.startswith("flipgate train: error: ")
    assert result.err.count("\n") == 1 and result.out == ""
    assert message in result.err
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_output_must_be_an_onnx_file(files, tmp_path, run_cli):
    out = tmp_path / "model.json"
    result = run_cli("train", "--method", "baseline", "--arch", ARCH, "--train", files["data"],
                     "--out", out, "--epochs", "1")
    assert result.code == 2 and "--out must name an .onnx file" in result.err
    assert not out.exists()
