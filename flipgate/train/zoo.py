"""Classifier architectures, built from a spec string such as "cnn:channels=16,32".

A spec is "name", "name:key=v1,v2;key2=v3" for a zoo architecture, or "package.module:factory"
for a custom one, called as factory(sample_shape, num_classes). Option values reach a zoo factory
as a tuple of ints where its signature annotates the option with a tuple, else as one int.
No model here uses BatchNorm or in-place ops: ensembles are trained stacked under torch.func.vmap.
"""

import importlib
import inspect
import math
import types
import typing
from collections.abc import Callable

import torch
from torch import nn

SampleShape = tuple[int, ...]
MAX_LAYERS = 8  # hidden layers, conv stages or blocks per stage
MAX_WIDTH = 4096  # units or channels of one layer


def mlp(sample_shape: SampleShape, num_classes: int, hidden: tuple[int, ...] | None = None,
        ) -> nn.Sequential:
    """A ReLU MLP over flattened inputs; without `hidden`, one layer sized from the input."""
    features = math.prod(sample_shape)
    if hidden is None:
        hidden = (min(512, max(64, 2 ** round(math.log2(features) - 1))),)
    _check_widths("hidden", hidden)
    layers: list[nn.Module] = [nn.Flatten()]
    for width_in, width_out in zip((features, *hidden), hidden, strict=False):
        layers += [nn.Linear(width_in, width_out), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden[-1], num_classes))


def cnn(sample_shape: SampleShape, num_classes: int, channels: tuple[int, ...] = (32, 64),
        ) -> nn.Sequential:
    """Stages of conv3x3, GroupNorm, ReLU and 2x2 max-pool, then a linear head over the whole
    feature map (LeNet-style)."""
    _check_widths("channels", channels)
    to_image, width_in = _image_input(sample_shape, downsamplings=len(channels))
    layers: list[nn.Module] = [to_image]
    for width_out in channels:
        layers += [_conv_norm(width_in, width_out, 3), nn.ReLU(), nn.MaxPool2d(2)]
        width_in = width_out
    return _with_flat_head(layers, sample_shape, num_classes)


class BasicBlock(nn.Module):
    """Two conv3x3-GroupNorm layers with a residual shortcut, projected by a 1x1 conv if needed."""

    def __init__(self, width_in: int, width_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_norm(width_in, width_out, 3, stride), nn.ReLU(),
                                  _conv_norm(width_out, width_out, 3))
        reshaped = stride != 1 or width_in != width_out
        self.shortcut = _conv_norm(width_in, width_out, 1, stride) if reshaped else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet(sample_shape: SampleShape, num_classes: int, widths: tuple[int, ...] = (16, 32, 64),
           blocks: int = 1) -> nn.Sequential:
    """A small ResNet: a conv stem, stages of BasicBlocks (stride 2 between them), a linear head
    over the whole feature map."""
    _check_widths("widths", widths)
    if not 1 <= blocks <= MAX_LAYERS:
        raise ValueError(f"blocks must be a positive integer, at most {MAX_LAYERS}; got {blocks}")
    to_image, channels = _image_input(sample_shape, downsamplings=len(widths) - 1)
    layers: list[nn.Module] = [to_image, _conv_norm(channels, widths[0], 3), nn.ReLU()]
    for stage, (width_in, width_out) in enumerate(zip(widths[:1] + widths, widths, strict=False)):
        layers.append(BasicBlock(width_in, width_out, stride=1 if stage == 0 else 2))
        layers += [BasicBlock(width_out, width_out, stride=1) for _ in range(blocks - 1)]
    return _with_flat_head(layers, sample_shape, num_classes)


ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {"mlp": mlp, "cnn": cnn, "resnet": resnet}


def build_model(spec: str, sample_shape: SampleShape, num_classes: int) -> nn.Module:
    """Build a model from a zoo spec ("resnet:widths=16,32;blocks=1") or "module.path:factory"."""
    name, _, options = spec.partition(":")
    if name in ARCHITECTURES:
        factory = ARCHITECTURES[name]
        return factory(sample_shape, num_classes, **_parse_options(factory, options, spec))
    if "." in name:
        return _build_custom(name, options, spec, sample_shape, num_classes)
    raise ValueError(f"unknown architecture {name!r}; choose from {sorted(ARCHITECTURES)} "
                     "or name a factory as package.module:function")


def _build_custom(module_name: str, attribute: str, spec: str, sample_shape: SampleShape,
                  num_classes: int) -> nn.Module:
    """Import `module_name`, call its `attribute`(sample_shape, num_classes), check the result."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(f"architecture {spec!r}: cannot import {module_name!r} ({error})",
                         ) from error
    factory = getattr(module, attribute, None) if attribute else None
    if not callable(factory):
        raise ValueError(f"architecture {spec!r}: module {module_name!r} has no factory "
                         f"{attribute!r}; write package.module:function")
    model = factory(sample_shape, num_classes)
    if not isinstance(model, nn.Module):
        raise ValueError(f"architecture {spec!r} returned {type(model).__name__}, not an nn.Module")
    return model


def _parse_options(factory: Callable[..., nn.Module], options: str, spec: str,
                   ) -> dict[str, int | tuple[int, ...]]:
    """Read "key=v1,v2;key2=v3" into the factory's keyword arguments (tuples or single ints)."""
    accepted = _option_kinds(factory)
    parsed: dict[str, int | tuple[int, ...]] = {}
    for option in filter(None, options.split(";")):
        key, equals, text = (part.strip() for part in option.partition("="))
        if key not in accepted:
            raise ValueError(f"unknown option {key!r} in {spec!r}; accepted: {sorted(accepted)}")
        try:
            values = tuple(int(value) for value in text.split(","))
        except ValueError:
            equals = ""
        if not equals or (not accepted[key] and len(values) != 1):
            form = "1,2" if accepted[key] else "1"
            raise ValueError(f"cannot read option {option!r} of {spec!r}; write {key}={form}")
        parsed[key] = values if accepted[key] else values[0]
    return parsed


def _option_kinds(factory: Callable[..., nn.Module]) -> dict[str, bool]:
    """The factory's options after (sample_shape, num_classes), each mapped to 'takes a tuple'."""
    hints = typing.get_type_hints(factory)
    names = list(inspect.signature(factory).parameters)[2:]
    return {name: _is_tuple_type(hints.get(name)) for name in names}


def _is_tuple_type(annotation: object) -> bool:
    """Whether an annotation is a tuple type, alone or in a union like `tuple[int, ...] | None`."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return any(_is_tuple_type(member) for member in typing.get_args(annotation))
    return annotation is tuple or typing.get_origin(annotation) is tuple


def _check_widths(name: str, widths: tuple[int, ...]) -> None:
    """Refuse an empty tuple of layer widths, more than MAX_LAYERS, or a width outside
    [1, MAX_WIDTH]."""
    if not 1 <= len(widths) <= MAX_LAYERS or any(not 1 <= width <= MAX_WIDTH for width in widths):
        raise ValueError(f"{name} must be positive integers, 1 to {MAX_LAYERS} of them, each "
                         f"at most {MAX_WIDTH}; got {widths}")


def _image_input(sample_shape: SampleShape, downsamplings: int) -> tuple[nn.Module, int]:
    """A module turning (N, *sample_shape) into (N, C, H, W) images, and the channel count C."""
    if len(sample_shape) not in (2, 3):
        raise ValueError("image models need samples shaped (H, W) or (C, H, W), "
                         f"got {sample_shape}")
    if min(sample_shape[-2:]) < 2 ** downsamplings:
        raise ValueError(f"samples of shape {sample_shape} are too small to be halved "
                         f"{downsamplings} times; use fewer stages")
    if len(sample_shape) == 2:
        return nn.Unflatten(1, (1, sample_shape[0])), 1
    return nn.Identity(), sample_shape[0]


def _conv_norm(width_in: int, width_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    """A bias-free conv (same padding) followed by GroupNorm with up to 8 groups."""
    return nn.Sequential(
        nn.Conv2d(width_in, width_out, kernel, stride, padding=kernel // 2, bias=False),
        nn.GroupNorm(math.gcd(8, width_out), width_out),
    )


def _with_flat_head(layers: list[nn.Module], sample_shape: SampleShape, num_classes: int,
                    ) -> nn.Sequential:
    """`layers`, then a linear layer from their whole output feature map to the logits.

    Global average pooling here would discard where the strokes are: after two or three stages
    on 28x28 digits the receptive field is too small for pooled features to tell digits apart
    (the zoo's cnn underfitted at 46-48% error that way)."""
    with torch.no_grad():
        features = nn.Sequential(*layers)(torch.zeros(1, *sample_shape)).numel()
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(features, num_classes))
