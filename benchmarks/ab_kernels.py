"""A/B timing of the fused C++ chunk kernels of two commits in ONE process, calls interleaved.

    python benchmarks/ab_kernels.py OLD_REV [--T 16384] [--pairs 9] [--backward] [--threads 1]
        [--clock wall|cpu]

Separate processes of the same code differ by up to 1.5x on this shared machine (linear attention's
forward at T = 16,384: 48 ms in one process, 71 ms in the next), so ``ab.py``'s process-level
medians resolve only large changes. Here the old commit's ``csrc/`` sources (``git show
OLD_REV:...``; one ``chunk.cpp`` up to 26bdc42, a file per concern since, with subfolders such as
``csrc/rules/`` from issue 29 on) are compiled under another op namespace (``linattn_ab_old``)
beside the working tree's kernels (``linattn_native``), and each pair of calls runs old and new
back to back in alternating order on the same inputs, one thread (``--threads``: more): two builds
of the same source differ by about 3% this way. It times ``chunk_forward`` (and ``chunk_backward``
with ``--backward``) directly, each with its own commit's signature (from issue 29 on, the
mechanism follows as ``rule`` and ``gate``; before, the kernels read it from beta and g), and it
leaves the Python around them out (time that separately, e.g. at a tiny T). Reported per mechanism:
the minimum of each, the median of the new / old ratios of the pairs, and whether the two gave the
same bits (every output, and every gradient with ``--backward``; ``--gate-scale 400`` steepens the
gates so that the per-channel products halve)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import cpp_extension

from linattn.ops import native

CSRC = "src/linattn/ops/csrc"


def load_old(rev: str) -> object:
    """The kernels of ``rev``, compiled under the namespace ``linattn_ab_old``."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
        return done.stdout.decode()

    folder = Path(tempfile.mkdtemp(prefix="linattn-ab-"))
    for path in git("ls-tree", "-r", "--name-only", f"{rev}:{CSRC}").split():
        text = git("show", f"{rev}:{CSRC}/{path}")
        for macro in ("TORCH_LIBRARY", "TORCH_LIBRARY_IMPL"):
            text = text.replace(f"{macro}(linattn_native", f"{macro}(linattn_ab_old")
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    cpp_extension.load(
        name="linattn_ab_old",
        sources=[str(path) for path in sorted(folder.rglob("*.cpp"))],
        extra_cflags=native.FLAGS,
        build_directory=str(folder),
        is_python_module=False,
    )
    return torch.ops.linattn_ab_old


# The rows: name -> (rule, the key of beta's input, of g's input (``inputs``; None: none), gate).
ROWS = {
    "linear": ("additive", None, None, "none"),
    "scalar_decay": ("additive", None, "g scalar", "head"),
    "gla": ("additive", None, "g channel", "channel"),
    "delta": ("delta", "beta", None, "none"),
    "gated_delta": ("delta", "beta", "g scalar", "head"),
    "kda": ("delta", "beta", "g channel", "channel"),
    "dplr": ("dplr", "ab", None, "none"),  # the dplr rule on the delta rule's row
    "dplr_head": ("dplr", "ab", "g scalar", "head"),
    "dplr_channel": ("dplr", "ab", "g channel", "channel"),
}


def mechanism_args(op: object, rule: str, gate: str) -> tuple[str, ...]:
    """The trailing ``rule, gate`` arguments where ``op``'s schema has them (issue 29 on), else
    none (its kernels read the mechanism from beta and g: the additive and delta rules only)."""
    names = [a.name for a in op.default._schema.arguments]
    if "rule" not in names:
        return ()
    return (rule, gate)


def inputs(T: int, H: int = 8, K: int = 64, gate_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The bench's inputs in the kernels' layout [B, H, T, ...] (views of [B, T, H, ...]), the
    log-gates times ``gate_scale``."""
    gen = torch.Generator().manual_seed(0)

    def rows(*tail: int) -> torch.Tensor:
        return torch.randn(1, T, H, *tail, generator=gen)

    x = {"q": rows(K), "k": F.normalize(rows(K), dim=-1), "v": rows(K)}
    x["beta"] = torch.sigmoid(torch.randn(1, T, H, generator=gen))
    x["g channel"] = gate_scale * F.logsigmoid(rows(K) + 4.0)
    x["g scalar"] = x["g channel"][..., :1].contiguous()
    # the dplr rule's inputs [a | b]: a = -beta kk, b = kk, kk a unit direction other than k
    kk = F.normalize(rows(K), dim=-1)
    x["ab"] = torch.cat([-x["beta"][..., None] * kk, kk], -1)
    return {name: t.transpose(1, 2) for name, t in x.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the old commit (a git revision)")
    parser.add_argument("--T", type=int, default=16384)
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    parser.add_argument("--gate-scale", type=float, default=1.0, help="multiplies the log-gates")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's intra-op threads")
    parser.add_argument(
        "--mechanisms",
        nargs="*",
        help="the rows to time (default: the six of the additive and delta rules; the dplr "
        "rule's, dplr dplr_head dplr_channel, on request)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time; cpu: this process's CPU time (steadier on a loaded machine)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not native.available():
        raise SystemExit(f"the working tree's kernels are not available: {native.reason()}")
    old, new = load_old(args.old), torch.ops.linattn_native
    x = inputs(args.T, gate_scale=args.gate_scale)
    H, K, scale, C = x["q"].shape[1], x["q"].shape[-1], x["q"].shape[-1] ** -0.5, 64
    S0 = torch.zeros(1, H, K, K)
    mechanisms = {  # name: (rule, beta, g, gate)
        name: (rule, x.get(beta), x.get(g), gate) for name, (rule, beta, g, gate) in ROWS.items()
    }
    if args.mechanisms:
        unknown = set(args.mechanisms) - set(mechanisms)
        if unknown:
            parser.error(f"--mechanisms: unknown {sorted(unknown)}; choose from {list(mechanisms)}")
        mechanisms = {name: mechanisms[name] for name in args.mechanisms}
    else:  # the dplr rule's rows on request (issue 30 on)
        mechanisms = {name: row for name, row in mechanisms.items() if row[0] != "dplr"}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    row = "fwd+bwd" if args.backward else "fwd"
    threads = f"{args.threads} thread{'s' * (args.threads > 1)}"
    print(
        f"T = {args.T}, {threads}, {args.pairs} pairs, {args.clock} clock; old {args.old}, "
        "new: the working tree"
    )
    print(f"| {row} | old min ms | new min ms | min / min | median of pair ratios | same bits |")
    print("|---|---:|---:|---:|---:|---|")
    for name, (rule, beta, g, gate) in mechanisms.items():
        call = (x["q"], x["k"], x["v"], beta, g, S0, scale, C)
        times: dict[str, list[float]] = {"old": [], "new": []}
        results: dict[str, list[torch.Tensor]] = {}
        for pair in range(args.pairs + 1):  # the first pair warms up
            for label in ("old", "new") if pair % 2 else ("new", "old"):
                lib = old if label == "old" else new
                mech = mechanism_args(lib.chunk_forward, rule, gate)
                start = clock()
                o, S, states = lib.chunk_forward(*call, args.backward, *mech)
                grads = []
                if args.backward:
                    grads = lib.chunk_backward(
                        *call[:5], states, torch.ones_like(o), torch.zeros_like(S), scale, C, *mech
                    )
                if pair:
                    times[label].append(clock() - start)
                results[label] = [o, S, states, *grads]
        o_min, n_min = min(times["old"]) * 1e3, min(times["new"]) * 1e3
        ratio = statistics.median(n / o for o, n in zip(times["old"], times["new"], strict=True))
        same = all(map(torch.equal, results["old"], results["new"]))
        print(
            f"| {name} | {o_min:.1f} | {n_min:.1f} | {n_min / o_min:.3f} | {ratio:.3f} "
            f"| {'yes' if same else 'NO'} |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
