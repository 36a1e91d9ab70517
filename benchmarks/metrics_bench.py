"""Pairwise NFR/PFR/churn matrices: flipgate's blocked counts vs. a numpy loop over pairs.

    python benchmarks/metrics_bench.py [--versions 16] [--samples 1000000] [--classes 1000]

Two synthetic version histories, both as compact predicted-class arrays (uint16 for 1,000
classes, as the server stores them): "correlated" is shaped like a real history (every version
right on 75-92% of the samples, errors concentrate on hard samples, wrong versions often agree
on one of a few confusable classes); "independent" has each version wrong on its own random
20% of the samples, with a random wrong class. Both implementations run in this process on the
same arrays; the script prints both times, the ratio, and checks the matrices are identical.
"""

import argparse
import time

import numpy as np

from flipgate.metrics import class_dtype, matrices_from_predictions


def correlated_history(versions: int, samples: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, samples)
    difficulty = rng.random(samples)
    accuracy = np.linspace(0.75, 0.92, versions)
    noise = rng.random((versions, samples)) * 0.5
    correct = (difficulty * 0.5 + noise) < accuracy[:, None]
    confusion = (labels + rng.integers(1, 4, (versions, samples))) % classes
    return _compact(np.where(correct, labels, confusion), labels, classes)


def independent_history(versions: int, samples: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, samples)
    wrong = rng.random((versions, samples)) < 0.2
    other = (labels + rng.integers(1, classes, (versions, samples))) % classes
    return _compact(np.where(wrong, other, labels), labels, classes)


HISTORIES = {"independent": independent_history, "correlated": correlated_history}


def _compact(predictions: np.ndarray, labels: np.ndarray, classes: int):
    dtype = class_dtype(classes)
    return [row.astype(dtype) for row in predictions], labels.astype(dtype)


def loop_over_pairs(predictions: list[np.ndarray], labels: np.ndarray) -> dict[str, np.ndarray]:
    """The straightforward way: masks for each ordered pair of versions."""
    versions = len(predictions)
    correct = [version == labels for version in predictions]
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


def compare_on(history: str, versions: int, samples: int, classes: int,
               repeats: int) -> tuple[float, float]:
    """(loop seconds, flipgate seconds) on one history; raises if the matrices differ."""
    predictions, labels = HISTORIES[history](versions, samples, classes)
    fast_time, fast = best_time(matrices_from_predictions, predictions, labels, repeats=repeats)
    loop_time, loop = best_time(loop_over_pairs, predictions, labels, repeats=repeats)
    for key in loop:
        if not np.array_equal(fast[key], loop[key]):
            raise AssertionError(f"{history}: {key} differs from the loop over pairs")
    return loop_time, fast_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"V={args.versions} N={args.samples:,} C={args.classes}  (best of {args.repeats}; "
          "matrices identical to the loop)")
    for history in HISTORIES:
        loop_time, fast_time = compare_on(history, args.versions, args.samples, args.classes,
                                          args.repeats)
        print(f"{history:12s} loop over pairs {loop_time:7.3f} s   matrices_from_predictions "
              f"{fast_time:7.3f} s   speed-up {loop_time / fast_time:5.1f}x")


if __name__ == "__main__":
    main()
