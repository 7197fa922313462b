"""Qwen3-Next and Kimi-Linear on the CPU: transformers' own path against ``linattn ... apply``.

    PYTHONPATH=src python benchmarks/transformers_cpu.py                 # the lead's run (long)
    PYTHONPATH=src python benchmarks/transformers_cpu.py --quick         # a dry run, ~minutes

transformers models of the real models' layer sizes, random weights from a config (nothing is
downloaded): Qwen3-Next (hidden 2,048; Gated DeltaNet with 16 query/key heads and 32 value heads
of 128, grouped value heads; gated attention with 16 heads of 256, 2 KV heads) and Kimi-Linear
(hidden 2,304; KDA with 32 heads of 128; MLA attention with 32 heads), a few layers in the real
models' pattern (three linear-attention layers, then one full-attention layer), a small
vocabulary and a small mixture of experts. Without ``apply`` the models run transformers' own
pure-PyTorch kernels (what it runs on the CPU without fla; with fla installed it binds fla's
Triton kernels, which cannot run on the CPU); with it, linattn's. float32, the same inputs for
both, timed in turns (theirs, ours, theirs, ...; wall-clock medians), for each thread count:

- op: the gated-delta kernel (grouped value heads) and the KDA kernel, as the layers call them,
  at each T (--op-lengths; default 4,096 and 16,384);
- layer: the linear-attention module's forward (projections, short convolution, norm included)
  at --layer-lengths (default 16,384);
- step: one decoding step of each kernel, the state [1, 32, 128, 128];
- model: whole-model prefill at each --model-lengths and then --decode-tokens decoding steps with
  the model's cache (tokens/s), the prefill split by layer type (how much the full-attention
  layers take), and the prefill's peak memory (resident memory above the memory before it).

Transformers' KDA fallback materialises a [B, H, T/64, 64, 64, K] decay tensor (17 GiB at
T = 16,384); a run whose estimate exceeds --max-gib is skipped and said so. Prints a table with
the ratios (transformers' time / linattn's) and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from linattn.experiments._timing import medians_in_turns, memory_supported, peak_extra_bytes
from linattn.integrations import transformers as hf

VOCAB = 1024
TARGETS = {"op gated_delta": 2.5, "op kda": 20.0, "layer": 1.5, "step": 1.0}


def qwen3_next(layers: int):
    """Qwen3-Next-80B-A3B's layer sizes (fewer experts), `layers` in its 3 linear : 1 pattern."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(
        vocab_size=VOCAB,
        hidden_size=2048,
        num_hidden_layers=layers,
        layer_types=pattern(layers),
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    )
    return Qwen3NextForCausalLM(config)


def kimi_linear(layers: int):
    """Kimi-Linear-48B-A3B's layer sizes (fewer experts), `layers` in its 3 KDA : 1 MLA pattern."""
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    config = KimiLinearConfig(
        vocab_size=VOCAB,
        hidden_size=2304,
        num_hidden_layers=layers,
        layer_types=pattern(layers),
        mlp_layer_types=["dense"] + ["sparse"] * (layers - 1),
        num_attention_heads=32,
        num_key_value_heads=32,
        linear_num_heads=32,
        linear_head_dim=128,
        num_experts=8,
        num_experts_per_token=2,
        moe_intermediate_size=1024,
        intermediate_size=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return KimiLinearForCausalLM(config)


def pattern(layers: int) -> list[str]:
    """Three linear-attention layers, then one full-attention layer, repeated."""
    return ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]


MODELS = {"qwen3_next": qwen3_next, "kimi_linear": kimi_linear}
KERNELS = {  # family: (its mechanism, its chunk kernel, its step kernel)
    "qwen3_next": (
        "gated_delta",
        "torch_chunk_gated_delta_rule",
        "torch_recurrent_gated_delta_rule",
    ),
    "kimi_linear": ("kda", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"),
}


@contextlib.contextmanager
def own_path(family: str) -> Iterator[None]:
    """transformers' pure-PyTorch kernels bound in the family's modeling module, then restored."""
    module = importlib.import_module(hf.module_name(family))
    bound = {name: getattr(module, name) for name in hf.FAMILIES[family] if hasattr(module, name)}
    try:
        for name, wrapper in bound.items():
            setattr(module, name, getattr(wrapper, "__wrapped__", wrapper))
        yield
    finally:
        for name, wrapper in bound.items():
            setattr(module, name, wrapper)


def theirs_and_ours(family: str) -> dict[str, tuple[Callable, Callable]]:
    """Each kernel name: (transformers' fallback, linattn's adapter)."""
    module = importlib.import_module(hf.module_name(family))
    return {
        name: (getattr(module, name).__wrapped__, hf.FAMILIES[family][name])
        for name in KERNELS[family][1:]
    }


def op_inputs(mechanism: str, T: int, step: bool = False) -> tuple:
    """What the layer passes its kernel (after the projections and the conv), float32."""
    gen = torch.Generator().manual_seed(0)
    H, HV, K = (16, 32, 128) if mechanism == "gated_delta" else (32, 32, 128)
    q, k = (torch.randn(1, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(1, T, HV, K, generator=gen)
    gate_shape = (1, T, HV) if mechanism == "gated_delta" else (1, T, HV, K)
    g = F.logsigmoid(torch.randn(*gate_shape, generator=gen) + 4.0)
    beta = torch.sigmoid(torch.randn(1, T, HV, generator=gen))
    state = 0.1 * torch.randn(1, HV, K, K, generator=gen) if step else None
    return (q, k, v, g, beta), state


def kda_fallback_gib(T: int) -> float:
    """The decay tensor transformers' KDA fallback builds: [1, 32, T/64, 64, 64, 128] float32."""
    return 32 * -(-T // 64) * 64 * 64 * 128 * 4 / 2**30


def timed_pair(fns: list[Callable], repeats: int) -> list[float]:
    """One warm-up call each, then the medians of `repeats` calls in turns (seconds)."""
    for fn in fns:
        fn()
    return medians_in_turns(fns, repeats)


def too_big(family: str, T: int, max_gib: float) -> str | None:
    """Why transformers' own path is not run at this T (None where it fits in ``max_gib``)."""
    if KERNELS[family][0] == "kda" and kda_fallback_gib(T) > max_gib:
        return f"transformers' KDA fallback needs ~{kda_fallback_gib(T):.0f} GiB"
    return None


def bench_ops(family: str, lengths: list[int], repeats: int, max_gib: float) -> list[dict]:
    """The chunk kernel at each T and the step, transformers' against linattn's."""
    mechanism, chunk, step = KERNELS[family]
    pairs = theirs_and_ours(family)
    rows = []
    for T in lengths:
        why = too_big(family, T, max_gib)
        if why:
            rows.append(skipped(f"op {mechanism}", T, why))
            continue
        args, _ = op_inputs(mechanism, T)
        kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
        fns = [lambda f=f, a=args, kw=kw: f(*a, **kw) for f in pairs[chunk]]
        rows.append(row(f"op {mechanism}", T, timed_pair(fns, repeats)))
    args, state = op_inputs(mechanism, 1, step=True)
    kw = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    fns = [lambda f=f: f(*args, **kw) for f in pairs[step]]
    rows.append(row(f"step {mechanism}", 1, timed_pair(fns, 20 * repeats)))
    return rows


def linear_layer(model: torch.nn.Module) -> torch.nn.Module:
    """The model's first linear-attention module (the first that calls a bound kernel)."""
    for module in model.modules():
        family = hf.family_of(type(module))
        if family is not None and hf.kernel_methods(type(module), set(hf.FAMILIES[family])):
            return module
    raise ValueError(f"{type(model).__name__} has no linear-attention layer")


def bench_layer(family: str, model, lengths: list[int], repeats: int, max_gib: float) -> list[dict]:
    """The linear-attention module's forward (projections included), with and without apply;
    linattn's alone where transformers' path would need more than ``max_gib``."""
    theirs = linear_layer(model)
    ours = hf.apply(copy.deepcopy(theirs))
    rows = []
    for T in lengths:
        x = torch.randn(1, T, model.config.hidden_size, generator=torch.Generator().manual_seed(0))

        def run_theirs(x=x):
            with own_path(family):
                return theirs(x)

        why = too_big(family, T, max_gib)
        if why:
            (alone,) = timed_pair([lambda x=x: ours(x)], repeats)
            rows.append(ours_alone(f"layer {family}", T, alone, why))
            continue
        times = timed_pair([run_theirs, lambda x=x: ours(x)], repeats)
        rows.append(row(f"layer {family}", T, times))
    return rows


class LayerClock:
    """Forward time of the model's layers by kind (linear attention, full attention), via hooks."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seconds = {"linear_attention": 0.0, "full_attention": 0.0}
        self.started = 0.0
        self.handles = []
        for kind, layer in zip(model.config.layer_types, model.model.layers, strict=True):
            attention = getattr(layer, "linear_attn", None) or layer.self_attn
            self.handles.append(attention.register_forward_pre_hook(self.start))
            self.handles.append(attention.register_forward_hook(self.stopper(kind)))

    def start(self, module: torch.nn.Module, args: tuple) -> None:
        self.started = time.perf_counter()

    def stopper(self, kind: str) -> Callable:
        def stop(module: torch.nn.Module, args: tuple, output: object) -> None:
            self.seconds[kind] += time.perf_counter() - self.started

        return stop

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def prefill_and_decode(model, ids: torch.Tensor, tokens: int) -> tuple[float, float, dict]:
    """Seconds of the prefill, decoding tokens per second, and the prefill's time by layer kind."""
    layers = LayerClock(model)
    start = time.perf_counter()
    out = model(ids, use_cache=True, logits_to_keep=1)
    prefill = time.perf_counter() - start
    split = dict(layers.seconds)
    layers.remove()
    token = out.logits[:, -1:].argmax(-1)
    start = time.perf_counter()
    for _ in range(tokens):
        out = model(token, past_key_values=out.past_key_values, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
    return prefill, tokens / (time.perf_counter() - start), split


@contextlib.contextmanager
def variant(family: str, model: torch.nn.Module, name: str) -> Iterator[None]:
    """The model on transformers' own kernels ("transformers") or with apply ("linattn")."""
    hf.disable()
    if name == "linattn":
        hf.apply(model)
    try:
        with own_path(family) if name == "transformers" else contextlib.nullcontext():
            yield
    finally:
        hf.disable()


def bench_model(
    family: str, model, lengths: list[int], tokens: int, memory: bool, max_gib: float
) -> list[dict]:
    """Whole-model prefill and decoding at each T (``model_rows``); a T whose run fails (out of
    memory in code neither side replaces, say) is a row that says so, and the others still run."""
    rows = []
    for T in lengths:
        try:
            rows.append(model_rows(family, model, T, tokens, memory, max_gib))
        except RuntimeError as error:
            why = str(error).strip().splitlines()[-1][:300]
            progress(f"model {family} T={T}: failed, {why}")
            rows.append({"name": f"model {family}", "T": T, "failed": why})
    return rows


def model_rows(family: str, model, T: int, tokens: int, memory: bool, max_gib: float) -> dict:
    """Prefill and decoding, twice each in turns, with and without apply (linattn's alone where
    transformers' path would need more than ``max_gib``); the peak memory of each prefill."""
    ids = torch.randint(3, VOCAB, (1, T), generator=torch.Generator().manual_seed(0))
    why = too_big(family, T, max_gib)
    names = ["linattn"] if why else ["transformers", "linattn"]
    runs: dict[str, list] = {name: [] for name in names}
    for name in [*runs, *runs]:  # theirs, ours, theirs, ours
        with variant(family, model, name):
            runs[name].append(prefill_and_decode(model, ids, tokens))
        prefill, decode, _ = runs[name][-1]
        progress(f"model {family} T={T} {name}: prefill {prefill:.2f} s, {decode:.2f} tok/s")
    entry = {"name": f"model {family}", "T": T}
    for name, results in runs.items():
        prefill, decode, split = min(results, key=lambda r: r[0])
        entry[name] = {"prefill_s": prefill, "decode_tok_s": decode, "split_s": split}
        if memory:
            with variant(family, model, name):
                peak = peak_extra_bytes(lambda ids=ids: model(ids, logits_to_keep=1))
            entry[name]["peak_mib"] = peak / 2**20
            progress(f"model {family} T={T} {name}: peak {entry[name]['peak_mib']:.0f} MiB")
    if why:
        entry["transformers_skipped"] = why
        progress(f"model {family} T={T} transformers: skipped, {why}")
    else:
        theirs, ours = entry["transformers"], entry["linattn"]
        entry["prefill_ratio"] = theirs["prefill_s"] / ours["prefill_s"]
        entry["decode_ratio"] = ours["decode_tok_s"] / theirs["decode_tok_s"]
    return entry


def row(name: str, T: int, times: list[float]) -> dict:
    theirs, ours = times
    progress(f"{name} T={T}: {theirs * 1e3:.1f} ms / {ours * 1e3:.1f} ms")
    return {
        "name": name,
        "T": T,
        "transformers_s": theirs,
        "linattn_s": ours,
        "ratio": theirs / ours,
    }


def ours_alone(name: str, T: int, ours: float, why: str) -> dict:
    """A row where only linattn ran: transformers' path was skipped, and says why."""
    progress(f"{name} T={T}: transformers skipped ({why}) / {ours * 1e3:.1f} ms")
    return {"name": name, "T": T, "transformers_skipped": why, "linattn_s": ours}


def skipped(name: str, T: int, why: str) -> dict:
    progress(f"{name} T={T}: skipped, {why}")
    return {"name": name, "T": T, "skipped": why}


def progress(message: str) -> None:
    """One line on stderr per measurement, with the time since the start."""
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", file=sys.stderr, flush=True)


STARTED = time.perf_counter()


def report(rows: list[dict]) -> str:
    """The table: each row's times and ratio, and the issue's target where it has one."""
    head = f"{'measurement':<26}{'T':>7}{'transformers':>14}{'linattn':>12}{'ratio':>8}  target"
    return "\n".join([head] + [line for r in rows for line in report_row(r)])


def report_row(r: dict) -> list[str]:
    label = f"{r['threads']}t {r['name']}"
    if "skipped" in r:
        return [f"{label:<26}{r['T']:>7}  skipped: {r['skipped']}"]
    if "failed" in r:
        return [f"{label:<26}{r['T']:>7}  failed: {r['failed']}"]
    if "transformers_skipped" in r and not r["name"].startswith("model"):
        ours = f"{'skipped':>14}{r['linattn_s'] * 1e3:>9.1f} ms"
        return [f"{label:<26}{r['T']:>7}{ours}  ({r['transformers_skipped']})"]
    if "transformers_skipped" in r:
        b = r["linattn"]
        peak = f"; peak MiB {b['peak_mib']:.0f}" if "peak_mib" in b else ""
        return [
            f"{label:<26}{r['T']:>7}{'skipped':>14}{b['prefill_s']:>10.2f} s  prefill "
            f"(full-attention layers {b['split_s']['full_attention']:.2f} s); "
            f"{r['transformers_skipped']}",
            f"{'':<26}{'decode tok/s':>7}{'':>14}{b['decode_tok_s']:>12.1f}{peak}",
        ]
    if r["name"].startswith("model"):
        a, b = r["transformers"], r["linattn"]
        full_a, full_b = a["split_s"]["full_attention"], b["split_s"]["full_attention"]
        full = f"full-attention layers {full_a:.2f} s / {full_b:.2f} s"
        peak = f"; peak MiB {a['peak_mib']:.0f} / {b['peak_mib']:.0f}" if "peak_mib" in a else ""
        return [
            f"{label:<26}{r['T']:>7}{a['prefill_s']:>12.2f} s{b['prefill_s']:>10.2f} s"
            f"{r['prefill_ratio']:>7.2f}x  prefill ({full})",
            f"{'':<26}{'decode tok/s':>7}{a['decode_tok_s']:>14.1f}{b['decode_tok_s']:>12.1f}"
            f"{r['decode_ratio']:>7.2f}x  {peak.lstrip('; ')}",
        ]
    words = r["name"].split()
    target = TARGETS.get(words[0] if words[0] != "op" else " ".join(words[:2]))
    met = target is not None and r["ratio"] >= target
    verdict = "" if target is None else f">= {target}x: {'met' if met else 'MISSED'}"
    theirs, ours = r["transformers_s"] * 1e3, r["linattn_s"] * 1e3
    times = f"{theirs:>11.1f} ms{ours:>9.1f} ms{r['ratio']:>7.2f}x"
    return [f"{label:<26}{r['T']:>7}{times}  {verdict}"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small T and few repeats: a dry run")
    parser.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    parser.add_argument("--op-lengths", default="4096,16384")
    parser.add_argument("--layer-lengths", default="16384")
    parser.add_argument("--model-lengths", default="4096,16384")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-gib", type=float, default=8.0, help="skip fallbacks needing more")
    parser.add_argument("--models", default="qwen3_next,kimi_linear")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("runs/transformers_cpu.json"))
    if "--quick" in (sys.argv[1:] if argv is None else argv):  # defaults only: flags still win
        parser.set_defaults(
            op_lengths="1024,2048", layer_lengths="2048", model_lengths="1024", decode_tokens=4
        )
        parser.set_defaults(repeats=3)
    args = parser.parse_args(argv)
    for name in ("threads", "op_lengths", "layer_lengths", "model_lengths", "models"):
        parts = [p for p in getattr(args, name).split(",") if p]  # "" measures none
        setattr(args, name, parts if name == "models" else [int(p) for p in parts])
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"--models: unknown {sorted(unknown)}; choose from {sorted(MODELS)}")
    return args


def reexec_for_memory() -> None:
    """Restart with glibc returning freed blocks at once, so that resident memory tracks live
    memory (``linattn.experiments._timing``'s method for peak memory)."""
    if memory_supported() and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    memory = not args.no_memory and memory_supported()
    if memory and argv is None:
        reexec_for_memory()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for family in args.models:
        torch.manual_seed(0)
        progress(f"building {family} ({args.layers} layers)")
        model = MODELS[family](args.layers).float().eval()
        for threads in args.threads:
            torch.set_num_threads(threads)
            with torch.no_grad():
                new = bench_ops(family, args.op_lengths, args.repeats, args.max_gib)
                new += bench_layer(family, model, args.layer_lengths, args.repeats, args.max_gib)
                new += bench_model(
                    family, model, args.model_lengths, args.decode_tokens, memory, args.max_gib
                )
            for r in new:
                r["threads"] = threads
            rows += new
            print(report(new), flush=True)
        del model
    meta = {
        "command": " ".join(["python", "benchmarks/transformers_cpu.py", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "clock": "wall, median of the runs in turns (model: the faster of two)",
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
