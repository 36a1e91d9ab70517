"""The architecture zoo: shapes, spec options, custom factories, vmap ensembles and ONNX export."""

import copy
import sys

import numpy as np
import pytest
import torch
from torch import nn

from flipgate.export import export_onnx
from flipgate.inference import OnnxClassifier
from flipgate.train.zoo import BasicBlock, build_model

ZOO = ["mlp", "cnn", "resnet"]
SHAPES = [(28, 28), (3, 32, 32)]
CUSTOM_PACKAGE = "zoo_test_custom"


def members(spec: str, sample_shape: tuple[int, ...], count: int) -> list[nn.Module]:
    """`count` models of one spec, each initialised from its own seed."""
    models = []
    for seed in range(count):
        torch.manual_seed(seed)
        models.append(build_model(spec, sample_shape, 10))
    return models


def layers(model: nn.Module, kind: type[nn.Module]) -> list[nn.Module]:
    """The submodules of `model` of one type, in order."""
    return [module for module in model.modules() if isinstance(module, kind)]


@pytest.mark.parametrize("sample_shape", SHAPES)
@pytest.mark.parametrize("spec", ZOO)
def test_models_output_logits_per_sample(spec: str, sample_shape: tuple[int, ...]) -> None:
    model = build_model(spec, sample_shape, 7)
    assert model(torch.randn(5, *sample_shape)).shape == (5, 7)


def test_zoo_has_no_batchnorm() -> None:
    for spec in ZOO:
        assert not layers(build_model(spec, (3, 32, 32), 10), nn.modules.batchnorm._BatchNorm)


def test_mlp_sizes_its_hidden_layer_from_the_data_unless_told() -> None:
    default = [layer.out_features for layer in layers(build_model("mlp", (28, 28), 10), nn.Linear)]
    chosen = build_model("mlp:hidden=256,256", (28, 28), 10)
    assert default == [512, 10]
    assert [layer.out_features for layer in layers(chosen, nn.Linear)] == [256, 256, 10]


def test_tuple_options_reach_the_factory_as_tuples() -> None:
    model = build_model("cnn:channels=16,32", (28, 28), 10)
    assert [conv.out_channels for conv in layers(model, nn.Conv2d)] == [16, 32]


def test_scalar_options_reach_the_factory_as_ints() -> None:
    one = build_model("resnet:widths=16,32;blocks=1", (28, 28), 10)
    two = build_model("resnet: blocks = 2 ", (28, 28), 10)
    assert len(layers(one, BasicBlock)) == 2
    assert len(layers(two, BasicBlock)) == 6


@pytest.mark.parametrize(("spec", "message"), [
    ("vgg", "unknown architecture 'vgg'"),
    ("cnn:width=16", r"unknown option 'width'.*accepted: \['channels'\]"),
    ("resnet:depth=3", r"accepted: \['blocks', 'widths'\]"),
    ("resnet:blocks=1,2", "write blocks=1"),
    ("cnn:channels=a", "write channels=1,2"),
    ("cnn:channels", "write channels=1,2"),
    ("mlp:hidden=0", "hidden must be positive"),
    ("cnn:channels=8,8,8,8,8,8", "too small"),
])
def test_bad_specs_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(spec, (28, 28), 10)


@pytest.mark.parametrize("sample_shape", [(784,), (1, 1, 28, 28)])
@pytest.mark.parametrize("spec", ["cnn", "resnet"])
def test_image_models_refuse_other_sample_shapes(spec: str, sample_shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"\(H, W\) or \(C, H, W\)"):
        build_model(spec, sample_shape, 10)


@pytest.fixture
def custom_package(tmp_path, monkeypatch):
    """An importable package whose `models` module holds a good and a bad factory."""
    package = tmp_path / CUSTOM_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(
        "from torch import nn\n\n"
        "def tiny(sample_shape, num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))\n\n"
        "def not_a_model(sample_shape, num_classes):\n"
        "    return 42\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{CUSTOM_PACKAGE}.models"
    for name in [name for name in sys.modules if name.split(".")[0] == CUSTOM_PACKAGE]:
        del sys.modules[name]


def test_custom_factory_is_imported_and_called(custom_package: str) -> None:
    model = build_model(f"{custom_package}:tiny", (28, 28), 4)
    assert model(torch.randn(3, 28, 28)).shape == (3, 4)


@pytest.mark.parametrize(("suffix", "message"), [
    (":missing", "has no factory 'missing'"),
    ("", "has no factory ''"),
    (":not_a_model", "returned int, not an nn.Module"),
    ("_absent:tiny", "cannot import"),
])
def test_bad_custom_factories_are_refused(custom_package: str, suffix: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(f"{custom_package}{suffix}", (28, 28), 4)


@pytest.mark.parametrize("sample_shape", SHAPES)
@pytest.mark.parametrize("spec", ZOO)
def test_stacked_members_train_under_vmap(spec: str, sample_shape: tuple[int, ...]) -> None:
    models = members(spec, sample_shape, 3)
    params, buffers = torch.func.stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    x = torch.randn(3, 4, *sample_shape)

    def forward(p, b, batch):
        return torch.func.functional_call(base, (p, b), (batch,))

    stacked = torch.func.vmap(forward)(params, buffers, x)
    stacked.sum().backward()
    with torch.no_grad():
        expected = torch.stack([model(batch) for model, batch in zip(models, x, strict=True)])
    assert torch.allclose(stacked, expected, atol=1e-5)
    assert all(param.grad is not None and param.grad.abs().sum() > 0 for param in params.values())


# GroupNorm's batch-size check is traced as a constant; the exported graph does not use it.
@pytest.mark.parametrize("sample_shape", SHAPES)
@pytest.mark.parametrize("spec", ZOO)
def test_models_export_to_onnx(tmp_path, spec: str, sample_shape: tuple[int, ...]) -> None:
    (model,) = members(spec, sample_shape, 1)
    x = torch.randn(6, *sample_shape)
    path = export_onnx(model, sample_shape, tmp_path / "model.onnx")
    with torch.no_grad():
        expected = model.eval()(x).numpy()
    np.testing.assert_allclose(OnnxClassifier(path).predict(x.numpy()), expected, atol=1e-4)


@pytest.fixture(scope="module")
def digits_split():
    """1,200 real MNIST training digits shaped (1, 28, 28) and 1,000 held-out ones."""
    from flipgate.datasets import mnist_digits, split
    from flipgate.formats.evalsets import EvalSet

    train, held_out = split(mnist_digits(), 1200, seed=0)
    as_images = [EvalSet(s.x.reshape(-1, 1, 28, 28), s.y) for s in (train, held_out)]
    return as_images[0], EvalSet(as_images[1].x[:1000], as_images[1].y[:1000])


@pytest.mark.slow
def test_image_models_beat_the_mlp_on_real_digits(digits_split):
    """The zoo's cnn and resnet learn 28x28 digits (one short epoch): lower error than mlp."""
    from flipgate.train.config import TrainConfig
    from flipgate.train.recipes import train

    train_set, held_out = digits_split
    errors = {}
    for spec in ZOO:
        model = train("baseline", spec, train_set, 10, TrainConfig(epochs=1, batch_size=32)).module
        with torch.no_grad():
            predicted = model(torch.from_numpy(held_out.x)).argmax(dim=1).numpy()
        errors[spec] = float(np.mean(predicted != held_out.y))
    assert errors["cnn"] < errors["mlp"] and errors["resnet"] < errors["mlp"], errors
    assert errors["cnn"] < 0.15 and errors["resnet"] < 0.15, errors
