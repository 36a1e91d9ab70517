"""flipgate at its users' scale: the pair report on N × 1,000 logits files, and the matrices.

    python benchmarks/scale_bench.py [--sizes 50000,200000,1000000] [--classes 1000]
                                     [--chunk-size ROWS] [--matrix-samples 1000000]
                                     [--versions 16] [--dir DIR] [--skip-matrices]

For each N, two float32 logits files are written (chunk by chunk) under a temporary folder.
Each measurement runs in its own subprocess on the files memory-mapped (`np.load(...,
mmap_mode="r")`), as the server reads them:
- floor: one argmax pass over both files (the least any pair report must do), timed before
  and after the report; the faster of the two is the floor;
- report: `compare_logits` on the two files, its time and its peak RSS (VmHWM) minus the
  peak RSS of a subprocess that only imports numpy (the interpreter + numpy baseline).
Then `benchmarks/metrics_bench.py`'s comparison of the matrices with a loop over pairs, on
its independent-error and correlated histories. Run it on a quiet machine: `uptime` is
printed before and after.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from metrics_bench import HISTORIES, compare_on  # the script's folder is on sys.path

WRITE_ROWS = 20_000
BASELINE = "import numpy, scale_bench; print(scale_bench.peak_rss_kib())"


def peak_rss_kib() -> int:
    """This process's peak resident memory (VmHWM: ru_maxrss would include the parent's RSS at
    the fork, which Linux carries across exec)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))


def write_pair(folder: Path, n: int, classes: int, seed: int = 0) -> tuple[Path, Path, Path]:
    """old.npy, new.npy (float32, written chunk by chunk) and labels.npy; new is old plus noise
    with a small bonus on the true class, so both models are mostly right and some flips occur."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    paths = folder / "old.npy", folder / "new.npy", folder / "labels.npy"
    np.save(paths[2], labels)
    header = {"descr": "<f4", "fortran_order": False, "shape": (n, classes)}
    with paths[0].open("wb") as old_file, paths[1].open("wb") as new_file:
        for file in (old_file, new_file):
            np.lib.format.write_array_header_2_0(file, header)
        for start in range(0, n, WRITE_ROWS):
            rows = np.arange(min(WRITE_ROWS, n - start))
            old = rng.standard_normal((rows.size, classes), dtype=np.float32)
            old[rows, labels[start : start + rows.size]] += 3.5
            new = 0.9 * old + 0.45 * rng.standard_normal(old.shape, dtype=np.float32)
            new[rows, labels[start : start + rows.size]] += 0.3
            old_file.write(old.tobytes())
            new_file.write(new.tobytes())
    return paths


def run_case(case: str, folder: Path, chunk_size: int | None) -> dict:
    """Run this script's `--case` in a fresh interpreter; its JSON result."""
    command = [sys.executable, __file__, "--case", case, "--dir", str(folder)]
    if chunk_size:
        command += ["--chunk-size", str(chunk_size)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def case_main(case: str, folder: Path, chunk_size: int | None) -> None:
    """Inside the subprocess: time the floor or the report on the memory-mapped files."""
    from flipgate.metrics import compare_logits
    from flipgate.metrics.chunks import chunk_rows, release, sample_ranges

    old, new = (np.load(folder / f"{name}.npy", mmap_mode="r") for name in ("old", "new"))
    labels = np.load(folder / "labels.npy")
    start = time.perf_counter()
    if case == "floor":
        for logits in (old, new):
            for first, stop in sample_ranges(len(logits), chunk_rows(logits.shape[1], chunk_size)):
                logits[first:stop].argmax(axis=1)
                release(logits, first, stop)
        result = {}
    else:
        report = compare_logits(old, new, labels, chunk_size=chunk_size)
        result = {key: report[key] for key in ("nfr", "negative_flips", "churn", "schurn")}
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_kib": peak_rss_kib(), **result}))


def pair_row(n: int, classes: int, chunk_size: int | None, baseline_kib: int) -> dict:
    """Write the files of one size, measure floor / report / floor, delete the files."""
    with tempfile.TemporaryDirectory(prefix="flipgate-scale-") as name:
        folder = Path(name)
        start = time.perf_counter()
        write_pair(folder, n, classes)
        print(f"  N={n:,}: wrote 2 × {n * classes * 4 / 2**30:.2f} GiB in "
              f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
        floors = [run_case("floor", folder, chunk_size)]
        report = run_case("report", folder, chunk_size)
        floors.append(run_case("floor", folder, chunk_size))
    floor = min(f["seconds"] for f in floors)
    return {"n": n, "report_s": report["seconds"], "floor_s": floor,
            "ratio": report["seconds"] / floor,
            "rss_mib": (report["peak_kib"] - baseline_kib) / 1024,
            "negative_flips": report["negative_flips"], "nfr": report["nfr"]}


def print_pair_table(rows: list[dict], classes: int) -> None:
    print(f"\nPair report (compare_logits) on two memory-mapped float32 files, C = {classes:,}")
    print("| N | report | argmax floor | report / floor | peak RSS above baseline | "
          "negative flips |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['n']:,} | {row['report_s']:.1f} s | {row['floor_s']:.2f} s | "
              f"{row['ratio']:.1f}× | {row['rss_mib']:.0f} MiB | {row['negative_flips']:,} |")


def print_matrix_table(args: argparse.Namespace) -> None:
    print(f"\nPairwise matrices, V = {args.versions} versions × N = {args.matrix_samples:,}, "
          f"C = {args.classes:,} (uint16 predicted classes; identical to the loop)")
    print("| history | loop over pairs | matrices_from_predictions | speed-up |")
    print("|---|---|---|---|")
    for history in HISTORIES:
        loop, fast = compare_on(history, args.versions, args.matrix_samples, args.classes, 3)
        print(f"| {history} | {loop:.3f} s | {fast:.3f} s | {loop / fast:.1f}× |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50000,200000,1000000")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--versions", type=int, default=16)
    parser.add_argument("--matrix-samples", type=int, default=1_000_000)
    parser.add_argument("--skip-matrices", action="store_true")
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=("floor", "report"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        case_main(args.case, args.dir, args.chunk_size)
        return
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} CPUs)")
    baseline_kib = int(subprocess.run([sys.executable, "-c", BASELINE], capture_output=True,
                                      text=True, check=True, cwd=Path(__file__).parent).stdout)
    sizes = [int(size) for size in args.sizes.split(",") if size]
    print_pair_table([pair_row(n, args.classes, args.chunk_size, baseline_kib) for n in sizes],
                     args.classes)
    if not args.skip_matrices:
        print_matrix_table(args)
    print(f"\nload after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
