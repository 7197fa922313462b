"""Bytes each rank contributes to context parallelism's collectives, at several slice lengths.

Run under torchrun (``torchrun --nproc-per-node 2 -m linattn.experiments.cp_bytes --lengths
4096 65536``) or through ``linattn cp-bytes``, which starts the processes itself on 127.0.0.1. For
every mechanism and slice length T, each rank runs a forward and backward pass of the
context-parallel op on a random slice of T tokens inside ``count_bytes()``; rank 0 prints one row
per (mechanism, T) with the bytes it contributed, by collective:

- ``descriptor``: the shape check (10 int64 numbers);
- ``maps``: the slice's affine map, M (None, [B, H, 1|K, 1] or [B, H, K, K]) and N [B, H, K, V];
- ``map_grads`` (backward): one slot per rank for the map gradients, plus S_0's when it has one.

None of these depends on T. With ``--json PATH`` rank 0 also writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

import linattn.distributed as ld
from linattn.experiments._args import check_memory, output_file

# mechanism -> (function, beta?, gate)
MECHANISMS = {
    "linear": ("linear_attention", False, None),
    "scalar_decay": ("linear_attention", False, "scalar"),
    "gla": ("linear_attention", False, "channel"),
    "deltanet": ("delta_rule", True, None),
    "gated_deltanet": ("delta_rule", True, "scalar"),
    "kda": ("delta_rule", True, "channel"),
}


def _options(parser: argparse.ArgumentParser) -> None:
    """The options shared by this module under torchrun and ``linattn cp-bytes``."""
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[4096, 65536],
        help="slice lengths T per rank (default: 4096 65536)",
    )
    parser.add_argument(
        "--mechanisms",
        nargs="+",
        default=list(MECHANISMS),
        choices=list(MECHANISMS),
        help="default: all",
    )
    parser.add_argument("--batch", type=int, default=1, help="B (default 1)")
    parser.add_argument("--heads", type=int, default=2, help="H (default 2)")
    parser.add_argument("--key-dim", type=int, default=16, help="K (default 16)")
    parser.add_argument("--value-dim", type=int, default=16, help="V (default 16)")
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--json-out", default=None, help="also write the rows to this JSON file")


def _inputs(mechanism: str, T: int, args: argparse.Namespace, seed: int) -> dict:
    _, delta, gate = MECHANISMS[mechanism]
    B, H, K, V = args.batch, args.heads, args.key_dim, args.value_dim
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen),
    }
    if delta:
        x["beta"] = torch.rand(B, T, H, generator=gen)
    if gate is not None:
        shape = (B, T, H) if gate == "scalar" else (B, T, H, K)
        x["g"] = torch.nn.functional.logsigmoid(torch.randn(*shape, generator=gen) + 4.0)
    # S_0 is replicated (the same on every rank; the call compares a checksum), the slices not.
    x["initial_state"] = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(0))
    return {n: t.requires_grad_() for n, t in x.items()}


def measure(mechanism: str, T: int, args: argparse.Namespace) -> dict:
    """Forward + backward of one context-parallel call on a slice of T tokens; bytes by op."""
    fn_name, delta, _ = MECHANISMS[mechanism]
    x = _inputs(mechanism, T, args, seed=dist.get_rank())
    x["initial_state"] = x["initial_state"].detach().requires_grad_()
    fn = getattr(ld, fn_name)
    start = time.perf_counter()
    with ld.count_bytes() as counter:
        state = x.pop("initial_state")
        beta = [x.pop("beta")] if delta else []
        o, _ = fn(
            x["q"],
            x["k"],
            x["v"],
            *beta,
            x.get("g"),
            chunk_size=args.chunk_size,
            initial_state=state,
        )
        o.square().mean().backward()
    return {
        "mechanism": mechanism,
        "T": T,
        "bytes": counter.total,
        **{f"bytes_{op}": n for op, n in counter.by_op.items()},
        "seconds": round(time.perf_counter() - start, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun: every rank measures; rank 0 prints its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _options(parser)
    parser.add_argument("--timeout", type=float, default=600.0, help="process group timeout, s")
    args = parser.parse_args(argv)
    if args.json_out:
        # Before the process group: nothing to measure in vain.
        output_file("--json-out", args.json_out)
    ld.init_process_group("gloo", timeout=args.timeout)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        rows = [measure(m, T, args) for m in args.mechanisms for T in args.lengths]
        if rank == 0 and args.json:
            print(json.dumps({"world_size": world, "rows": rows}, indent=1))
        elif rank == 0:
            B, H, K, V = args.batch, args.heads, args.key_dim, args.value_dim
            print(
                f"bytes each rank contributes to collectives, forward + backward; {world} ranks, "
                f"B={B} H={H} K={K} V={V}, float32"
            )
            print(
                f"{'mechanism':<16}{'T per rank':>12}{'descriptor':>12}{'maps':>10}"
                f"{'map_grads':>11}{'total':>10}{'seconds':>9}"
            )
            for r in rows:
                print(
                    f"{r['mechanism']:<16}{r['T']:>12}{r['bytes_descriptor']:>12}"
                    f"{r['bytes_maps']:>10}{r['bytes_map_grads']:>11}{r['bytes']:>10}"
                    f"{r['seconds']:>9}"
                )
        if rank == 0 and args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.json_out, "w") as f:
                json.dump({"world_size": world, "rows": rows}, f, indent=1)
    finally:
        dist.destroy_process_group()
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    """``linattn cp-bytes``: the measurement's options plus the number of local processes."""
    _options(parser)
    parser.add_argument("--nproc", type=int, default=2, help="local processes (default 2)")


def memory_needed(args: argparse.Namespace) -> int:
    """Bytes of the float32 inputs q, k, v, g and their gradients [B, T, H, K or V] on every rank
    at the longest slice (a lower bound of the ranks' peak together)."""
    T, B, H = max(args.lengths), args.batch, args.heads
    return 4 * args.nproc * 2 * B * T * H * (3 * args.key_dim + args.value_dim)


def run(args: argparse.Namespace) -> int:
    """Start ``--nproc`` ranks on 127.0.0.1 running this module; print rank 0's table."""
    from linattn.experiments.launch import run_local

    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {args.nproc}")
    for name in ("batch", "heads", "key_dim", "value_dim", "chunk_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.lengths) < 1:
        raise ValueError(f"--lengths must be >= 1, got {args.lengths}")
    sizes = " ".join(
        [f"--lengths {max(args.lengths)}", f"--nproc {args.nproc}"]
        + [f"--{n.replace('_', '-')} {getattr(args, n)}" for n in ("batch", "heads", "key_dim")]
        + [f"--value-dim {args.value_dim}"]
    )
    check_memory(sizes, memory_needed(args))
    if args.json_out:
        output_file("--json-out", args.json_out)  # here, once, not in a traceback from every rank
    forwarded = ["--lengths", *map(str, args.lengths), "--mechanisms", *args.mechanisms]
    for name in ("batch", "heads", "key_dim", "value_dim", "chunk_size"):
        forwarded += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.json_out:
        forwarded += ["--json-out", args.json_out]
    if args.json:
        forwarded.append("--json")
    argv = ["-m", "linattn.experiments.cp_bytes", *forwarded]
    results = run_local(argv, args.nproc, deadline=3600)
    print(results[0].output, end="")
    failed = [r for r in results if r.returncode != 0]
    for r in failed:
        print(f"rank {r.rank} failed (exit status {r.returncode}):\n{r.output[-2000:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
