"""Pairwise NFR/PFR/churn matrices: flipgate's linear algebra vs. a numpy loop over pairs.

    python benchmarks/metrics_bench.py [--versions 16] [--samples 1000000] [--classes 1000]

Predictions are synthetic but shaped like a real version history: every version is right on
75-92% of the samples, errors concentrate on hard samples, and wrong versions often agree on
one of a few confusable classes. Both implementations run in this process on the same data;
the script prints both times, the ratio, and checks that the matrices are equal.
"""

import argparse
import time

import numpy as np

from flipgate.metrics import pairwise_matrices


def version_history(versions: int, samples: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, samples)
    difficulty = rng.random(samples)
    accuracy = np.linspace(0.75, 0.92, versions)
    noise = rng.random((versions, samples)) * 0.5
    correct = (difficulty * 0.5 + noise) < accuracy[:, None]
    confusion = (labels + rng.integers(1, 4, (versions, samples))) % classes
    return np.where(correct, labels, confusion), labels


def loop_over_pairs(predictions: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """The straightforward way: masks for each ordered pair of versions."""
    versions = len(predictions)
    correct = predictions == labels
    out = {key: np.zeros((versions, versions)) for key in ("nfr", "pfr", "churn")}
    for i in range(versions):
        for j in range(versions):
            out["nfr"][i, j] = np.mean(correct[i] & ~correct[j])
            out["pfr"][i, j] = np.mean(~correct[i] & correct[j])
            out["churn"][i, j] = np.mean(predictions[i] != predictions[j])
    return out


def best_time(function, *args, repeats: int) -> tuple[float, dict]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function(*args)
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    predictions, labels = version_history(args.versions, args.samples, args.classes)
    fast_time, fast = best_time(pairwise_matrices, predictions, labels, repeats=args.repeats)
    loop_time, loop = best_time(loop_over_pairs, predictions, labels, repeats=args.repeats)
    for key in loop:
        np.testing.assert_allclose(fast[key], loop[key], rtol=0, atol=1e-12)
    print(f"V={args.versions} N={args.samples:,} C={args.classes}  (best of {args.repeats})")
    print(f"loop over pairs   : {loop_time:8.3f} s")
    print(f"pairwise_matrices : {fast_time:8.3f} s")
    print(f"speed-up          : {loop_time / fast_time:8.1f}x  (matrices identical)")


if __name__ == "__main__":
    main()
