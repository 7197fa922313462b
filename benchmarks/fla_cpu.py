"""fla 0.6.0's RWKV-7, RWKV-6, Gated DeltaProduct and Comba causal LMs on the CPU with ``enable()``.

    PYTHONPATH=src python benchmarks/fla_cpu.py                 # T = 4,096, 16 decoded tokens
    PYTHONPATH=src python benchmarks/fla_cpu.py --T 512 --layers 1 --tokens 4   # a dry run

fla's models (``fla.models``) built from configs (random weights, nothing downloaded) at hidden
1,024 and 4 layers (--hidden, --layers), vocabulary 1,024; fla's own code throughout, its
Triton-only ops and modules replaced by ``linattn.integrations.fla.enable()``. float32, one
thread (--threads), no gradients. Per model: the prefill of T tokens (a forward pass with the
cache, the last token's logits) and then --tokens greedy decoding steps with fla's cache, the
faster of --repeats runs; tokens per second by the wall clock and by this process's CPU time
(which stays near the idle machine's figure for one thread on a loaded machine). For a figure
that depends less on the machine, the same run times a 1,024 x 1,024 float32 matrix product by
CPU time (before and after each model): ``roof`` is the model's dense work (2 x its
non-embedding parameters x tokens) over its CPU time, as a fraction of that product's rate. A
family whose op linattn does not compute yet (RWKV-6 before its compat entry points) is a row
that says so. Prints a table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable

import torch

from linattn.experiments._timing import matmul_rate, use_clock
from linattn.integrations import fla as linattn_fla

VOCAB = 1024
# family -> (config class, model class, config options beyond hidden size, layers, vocabulary)
MODELS: dict[str, tuple[str, str, dict]] = {
    "rwkv7": ("RWKV7Config", "RWKV7ForCausalLM", {"head_dim": 64}),
    "rwkv6": ("RWKV6Config", "RWKV6ForCausalLM", {"num_heads": 16}),
    "gated_deltaproduct": (
        "GatedDeltaProductConfig",
        "GatedDeltaProductForCausalLM",
        {"head_dim": 128, "num_heads": 8, "num_householder": 2},
    ),
    "comba": ("CombaConfig", "CombaForCausalLM", {"head_dim": 128, "num_heads": 8}),
}


def build(family: str, hidden: int, layers: int) -> torch.nn.Module:
    import fla.models

    config_name, model_name, options = MODELS[family]
    config = getattr(fla.models, config_name)(
        hidden_size=hidden, num_hidden_layers=layers, vocab_size=VOCAB, **options
    )
    torch.manual_seed(0)
    return getattr(fla.models, model_name)(config).eval()


def timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    """fn()'s result, its wall-clock and its CPU time (s)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


@torch.no_grad()
def prefill_and_decode(model: torch.nn.Module, ids: torch.Tensor, tokens: int) -> dict:
    """The prefill of ids [1, T] then ``tokens`` greedy steps with fla's cache: seconds each."""
    out, wall, cpu = timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1))
    cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)  # [1, 1]

    def decode():
        nonlocal cache, token
        for _ in range(tokens):
            step = model(input_ids=token, past_key_values=cache, use_cache=True)
            cache, token = step.past_key_values, step.logits[:, -1:].argmax(-1)

    _, decode_wall, decode_cpu = timed(decode)
    return {"prefill": (wall, cpu), "decode": (decode_wall, decode_cpu)}


def bench(family: str, args: argparse.Namespace) -> dict:
    """One model's row: tokens/s (wall, CPU) of the prefill and the decoding, and its roof."""
    model = build(family, args.hidden, args.layers)
    dense = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    dense -= model.lm_head.weight.numel()  # the prefill computes one token's logits
    ids = torch.randint(3, VOCAB, (1, args.T), generator=torch.Generator().manual_seed(0))
    prefill_and_decode(model, ids[:, :128], 2)  # a warm-up: first-call costs are not timed
    rates, runs = [matmul_rate(1024)], []
    for _ in range(args.repeats):
        runs.append(prefill_and_decode(model, ids, args.tokens))
        rates.append(matmul_rate(1024))
    rate = sorted(rates)[len(rates) // 2]  # the matrix product's median in this run
    best = {part: min((r[part] for r in runs), key=lambda t: t[0]) for part in runs[0]}
    row = {"family": family, "T": args.T, "tokens": args.tokens, "dense_params": dense}
    row["matmul_cpu_gflops"] = rate / 1e9
    for part, count in (("prefill", args.T), ("decode", args.tokens)):
        wall, cpu = best[part]
        row[part] = {"wall_s": wall, "cpu_s": cpu, "tok_s": count / wall, "cpu_tok_s": count / cpu}
        row[part]["roof"] = 2 * dense * count / cpu / rate
    return row


def table(rows: list[dict]) -> str:
    head = "| model | T | prefill tok/s (wall / CPU) | roof | decoding tok/s (wall / CPU) | roof |"
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        if "failed" in row:
            lines.append(f"| {row['family']} | {row['T']} | {row['failed']} | | | |")
            continue
        p, d = row["prefill"], row["decode"]
        lines.append(
            f"| {row['family']} | {row['T']:,} | {p['tok_s']:,.0f} / {p['cpu_tok_s']:,.0f} | "
            f"{p['roof']:.2f} | {d['tok_s']:.1f} / {d['cpu_tok_s']:.1f} | {d['roof']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated families")
    parser.add_argument("--T", type=int, default=4096, help="prefill length")
    parser.add_argument("--tokens", type=int, default=16, help="decoded tokens after it")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None, help="JSON file for the rows")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    use_clock("cpu")  # the matrix product's rate by CPU time, as the roofs
    linattn_fla.enable()
    rows = []
    for family in args.models.split(","):
        try:
            rows.append(bench(family, args))
        except NotImplementedError as error:  # an op linattn.compat does not compute yet
            rows.append({"family": family, "T": args.T, "failed": str(error).split(";")[0]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.threads} thread(s), hidden {args.hidden}, {args.layers} layers")  # fmt: skip
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
