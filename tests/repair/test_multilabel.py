"""Repairs of multi-label models (one sigmoid logit per label) on real MNIST composites: the
ensemble averages each label's probability, interpolation blends the weights, both carry the
mixed thresholds and choose the old model's share on per-label flips."""

import json

import numpy as np
import onnx
import pytest
import torch
from scipy.special import expit

from flipgate.cli import main
from flipgate.datasets import digit_composites, save_evalset
from flipgate.errors import InputError
from flipgate.inference import MultiLabelOnnx
from flipgate.metrics.multilabel import compare_multilabel, predicted_labels
from flipgate.repair import Limits, ensemble, ensemble_graph, interpolate, interpolate_graph
from flipgate.train.config import TrainConfig
from flipgate.train.recipes import train
from tests.conftest import numpy_mlp

LABELS = 10
OLD_THRESHOLDS = [0.3, 0.6, 0.5, 0.4, 0.7, 0.5, 0.5, 0.35, 0.65, 0.5]


@pytest.fixture(scope="module")
def composites(digits):
    """Training composites from the training digits, calibration ones from the others."""
    train_digits, calibration_digits = digits
    return (digit_composites(600, seed=0, digits=train_digits),
            digit_composites(300, seed=1, digits=calibration_digits))


@pytest.fixture(scope="module")
def label_models(tmp_path_factory, composites):
    """Old (declaring per-label thresholds) and new multi-label mlps from two seeds, their
    torch modules, and the calibration set as an .npz."""
    folder = tmp_path_factory.mktemp("multilabel_models")
    train_set, calibration = composites
    paths, modules = {"calibration": save_evalset(calibration, folder / "calibration.npz")}, {}
    for name, seed in (("old", 0), ("new", 1)):
        trained = train("baseline", "mlp:hidden=16", train_set, LABELS,
                        TrainConfig(epochs=2, seed=seed))
        paths[name] = trained.save(folder / f"{name}.onnx", train_set.sample_shape)
        modules[name] = trained.module
    model = onnx.load(str(paths["old"]))
    onnx.helper.set_model_props(model, {"thresholds": json.dumps(OLD_THRESHOLDS)})
    onnx.save(model, str(paths["old"]))
    return paths, modules


def probabilities(path, data) -> np.ndarray:
    model = MultiLabelOnnx(path, device="cpu")
    return model.predict(model.feeds(data))


def thresholds_of(path) -> np.ndarray | None:
    return MultiLabelOnnx(path, device="cpu").spec.thresholds


def saved(model: onnx.ModelProto, path):
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_probability_ensemble_averages_each_labels_probability(label_models, composites,
                                                               tmp_path, weight):
    paths, _ = label_models
    calibration = composites[1]
    path = saved(ensemble_graph(paths["old"], paths["new"], weight, probabilities=True,
                                multilabel=True), tmp_path / "ensemble.onnx")
    expected = (weight * probabilities(paths["old"], calibration)
                + (1 - weight) * probabilities(paths["new"], calibration))
    np.testing.assert_allclose(probabilities(path, calibration), expected, atol=1e-5)
    np.testing.assert_allclose(thresholds_of(path),
                               weight * np.array(OLD_THRESHOLDS) + (1 - weight) * 0.5)


def test_logit_ensemble_averages_each_labels_logit(label_models, composites, tmp_path):
    paths, modules = label_models
    x = torch.from_numpy(composites[1].x)
    path = saved(ensemble_graph(paths["old"], paths["new"], 0.25, multilabel=True),
                 tmp_path / "ensemble.onnx")
    with torch.no_grad():
        mixed = 0.25 * modules["old"](x).numpy() + 0.75 * modules["new"](x).numpy()
    np.testing.assert_allclose(probabilities(path, composites[1]), expit(mixed), atol=1e-5)


def test_interpolation_scores_each_label_with_the_blended_weights(label_models, composites,
                                                                  tmp_path):
    paths, modules = label_models
    states = {name: {key: value.numpy() for key, value in module.state_dict().items()}
              for name, module in modules.items()}
    blended = {key: 0.4 * states["old"][key] + 0.6 * states["new"][key] for key in states["old"]}
    path = saved(interpolate_graph(paths["old"], paths["new"], 0.4, multilabel=True),
                 tmp_path / "interpolated.onnx")
    np.testing.assert_allclose(probabilities(path, composites[1]),
                               expit(numpy_mlp(blended, composites[1].x)), atol=1e-5)
    np.testing.assert_allclose(thresholds_of(path), 0.4 * np.array(OLD_THRESHOLDS) + 0.6 * 0.5)


def flips(y: np.ndarray, old: np.ndarray, new: np.ndarray) -> tuple[float, float]:
    """NFR_sample and the Hamming-loss increase of decisions `new` against `old`, in numpy."""
    turned_wrong = (old == y) & (new != y)
    return turned_wrong.any(axis=1).mean(), (new != y).mean() - (old != y).mean()


@pytest.mark.parametrize("repair", ["ensemble", "interpolate"])
def test_the_share_is_chosen_on_per_label_flips(label_models, composites, tmp_path, repair):
    paths, _ = label_models
    calibration = composites[1]
    old = probabilities(paths["old"], calibration)
    new = probabilities(paths["new"], calibration)
    untreated = compare_multilabel(calibration.y, old, new,
                                   thresholds=(OLD_THRESHOLDS, None))["per_sample"]["nfr"]
    limits = Limits(max_nfr=0.4 * untreated, max_er_increase=0.02)
    out = tmp_path / "repaired.onnx"
    if repair == "ensemble":
        result = ensemble(paths["old"], paths["new"], out, calibration=paths["calibration"],
                          limits=limits, probabilities=True)
    else:
        result = interpolate(paths["old"], paths["new"], paths["calibration"], out, limits)
    assert result.curve[0].share == 0 and result.curve[0].nfr == pytest.approx(untreated)
    old_decisions = predicted_labels(old, OLD_THRESHOLDS)
    repaired = predicted_labels(probabilities(out, calibration), thresholds_of(out))
    nfr, er_increase = flips(calibration.y, old_decisions, repaired)
    chosen = next(point for point in result.curve if point.share == result.share)
    assert chosen.nfr == pytest.approx(nfr) and chosen.er_increase == pytest.approx(er_increase)
    assert nfr <= limits.max_nfr and er_increase <= limits.max_er_increase
    assert untreated > 0  # the untreated update flips, so the search had something to do


@pytest.mark.parametrize("repair", ["ensemble", "interpolate"])
def test_thresholds_given_replace_what_the_models_declare(label_models, composites, tmp_path,
                                                          repair):
    """The old model decides at the given t_old on the curve, the repair at the given mix."""
    paths, _ = label_models
    calibration = composites[1]
    t_old, t_new = [0.2] * LABELS, [0.8] * LABELS
    out = tmp_path / "repaired.onnx"
    limits = Limits(max_nfr=1.0, max_er_increase=1.0)  # any share passes: 0 is chosen
    if repair == "ensemble":
        result = ensemble(paths["old"], paths["new"], out, calibration=calibration,
                          limits=limits, thresholds=(t_old, t_new))
    else:
        result = interpolate(paths["old"], paths["new"], calibration, out, limits,
                             thresholds=(t_old, t_new))
    np.testing.assert_allclose(thresholds_of(out), result.share * 0.2 + (1 - result.share) * 0.8)
    old, new = (probabilities(paths[name], calibration) for name in ("old", "new"))
    nfr, _ = flips(calibration.y, old > 0.2, new > 0.8)
    assert result.curve[0].share == 0 and result.curve[0].nfr == pytest.approx(nfr)
    assert nfr > 0  # the given thresholds decide otherwise than 0.5 and the metadata's


def test_models_declared_multi_label_need_a_multi_label_calibration_set(models, label_models,
                                                                        tmp_path):
    paths, _ = label_models
    with pytest.raises(InputError, match="0/1 label matrix") as refused:
        ensemble(paths["old"], paths["new"], tmp_path / "out.onnx",
                 calibration=models["calibration"], multilabel=True)
    assert refused.value.code == "calibration_not_multilabel"


def test_command_writes_a_multi_label_probability_ensemble(label_models, composites, tmp_path,
                                                           capsys):
    paths, _ = label_models
    out = tmp_path / "fixed.onnx"
    assert main(["repair", "ensemble", str(paths["old"]), str(paths["new"]), "--weight", "0.5",
                 "--probabilities", "--multilabel", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weight"] == 0.5
    expected = 0.5 * (probabilities(paths["old"], composites[1])
                      + probabilities(paths["new"], composites[1]))
    np.testing.assert_allclose(probabilities(out, composites[1]), expected, atol=1e-5)
