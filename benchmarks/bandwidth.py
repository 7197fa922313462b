"""Memory bandwidth and matrix-product rate of this machine at each thread count.

    python benchmarks/bandwidth.py [--threads 1,2] [--mib 512] [--rounds 7]

Bandwidth: a copy between two reused float32 tensors of --mib MiB each (far beyond the caches),
counted as read + write bytes, torch threads set per count; the matrix-product rate of
``linattn.experiments._timing.matmul_rate`` at the same count. Counts are timed in turns and the
median of --rounds is reported. The chunk form's bytes per operation are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from linattn.experiments._args import int_list
from linattn.experiments._timing import matmul_rate


def copy_rate(src: torch.Tensor, dst: torch.Tensor) -> float:
    """Bytes per second of one dst.copy_(src), read plus write."""
    start = time.perf_counter()
    dst.copy_(src)
    return 2 * src.numel() * src.element_size() / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int_list, default=[1, 2])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n = args.mib * 2**20 // 4
    src, dst = torch.randn(n), torch.empty(n)
    dst.copy_(src)  # pages faulted in once
    copies: dict[int, list[float]] = {t: [] for t in args.threads}
    products: dict[int, list[float]] = {t: [] for t in args.threads}
    for turn in range(args.rounds):
        for t in args.threads if turn % 2 == 0 else args.threads[::-1]:
            torch.set_num_threads(t)
            copies[t].append(copy_rate(src, dst))
            products[t].append(matmul_rate(repeats=1))
    print(f"| threads | copy GB/s (read + write, {args.mib} MiB) | matrix product GFLOP/s | "
          "bytes per operation at that rate |")  # fmt: skip
    print("|---:|---:|---:|---:|")
    for t in args.threads:
        bw, mm = statistics.median(copies[t]), statistics.median(products[t])
        print(f"| {t} | {bw / 1e9:.1f} | {mm / 1e9:.0f} | {bw / mm:.3f} |")


if __name__ == "__main__":
    main()
