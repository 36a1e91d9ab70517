"""Classifier architectures, built from a spec string such as "mlp" or "mlp:hidden=256,256"."""

import math

from torch import nn


def mlp(sample_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] | None = None,
        ) -> nn.Sequential:
    """A ReLU MLP over flattened inputs; without `hidden`, one layer sized from the input."""
    features = math.prod(sample_shape)
    if hidden is None:
        hidden = (min(512, max(64, 2 ** round(math.log2(features) - 1))),)
    if not hidden or any(width < 1 for width in hidden):
        raise ValueError(f"hidden layer sizes must be positive integers, got {hidden}")
    layers: list[nn.Module] = [nn.Flatten()]
    for width_in, width_out in zip((features, *hidden), hidden, strict=False):
        layers += [nn.Linear(width_in, width_out), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden[-1], num_classes))


ARCHITECTURES = {"mlp": mlp}


def build_model(spec: str, sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build an architecture from "name" or "name:key=v1,v2" (e.g. "mlp:hidden=256,256")."""
    name, _, options = spec.partition(":")
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; choose from {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[name](sample_shape, num_classes, **_parse_options(options, spec))


def _parse_options(options: str, spec: str) -> dict[str, tuple[int, ...]]:
    parsed = {}
    for option in filter(None, options.split(";")):
        key, equals, values = option.partition("=")
        try:
            parsed[key.strip()] = tuple(int(v) for v in values.split(","))
        except ValueError:
            equals = ""
        if not equals:
            raise ValueError(f"cannot read option {option!r} of {spec!r}; write key=1,2")
    return parsed
