"""Bytes of the generation cache of every block and of the whole model, per context length.

Spec sections 5 and 9: a softmax block's KV cache grows with the context t (2 t D numbers per head);
every recurrent block keeps a fixed-size memory (plus its short convolution's last inputs), the same
at t = 1,024 and at t = 131,072. The numbers come from the cache itself: the model is built on the
``meta`` device (no weights allocated), ``model.new_cache`` lays out its tensors, and
``Cache.nbytes_per_block_at(t)`` counts them after t tokens.

``--preset NAME`` (``linattn.models.presets``) compares a preset with its all-attention counterpart
(``softmax_counterpart``: every block the preset's attention block): the reduction of the whole
generation cache, ``1 - bytes(preset) / bytes(counterpart)``, at each context. For
``kimi_linear`` (3 KDA : 1 MLA) it is set beside the Kimi Linear report's "up to 75% less KV cache
at 1M context" (Kimi Team, 2025, arXiv:2510.26692): with one MLA block in four, the latents are a
quarter of the all-MLA model's; the KDA states, a fixed few hundred KiB, take the rest.
"""

from __future__ import annotations

import argparse
import json

import torch

from linattn.experiments._args import name_list
from linattn.models import MIXERS, CausalLM, LMConfig
from linattn.models.presets import PRESETS, preset, softmax_counterpart

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def compute_memory(
    config: LMConfig,
    contexts: tuple[int, ...] = (1024, 16384, 131072),
    dtype: torch.dtype = torch.bfloat16,
    batch_size: int = 1,
) -> dict:
    """Cache bytes per block and in total at each context length in ``contexts``.

    Returns ``{"config", "dtype", "batch_size", "contexts", "blocks": [{"index", "mixer",
    "bytes": [...], "numbers": [...]}], "total": [...]}``; ``bytes[i]`` is at ``contexts[i]``.
    Recurrent states are float32 whatever the model dtype (float64 for float64); the KV cache and
    the convolution state are in the model dtype.
    """
    if not contexts or any(
        isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in contexts
    ):
        raise ValueError(f"contexts must be integers >= 0, got {contexts!r}")
    with torch.device("meta"):
        model = CausalLM(config).to(dtype)
    cache = model.new_cache(batch_size, device="meta")
    per_t = [cache.nbytes_per_block_at(t) for t in contexts]  # [len(contexts)][n_blocks]
    blocks = [
        {
            "index": i,
            "mixer": name,
            "bytes": [sizes[i] for sizes in per_t],
        }
        for i, name in enumerate(config.mixers)
    ]
    return {
        "config": config.to_dict(),
        "dtype": str(dtype).removeprefix("torch."),
        "batch_size": batch_size,
        "contexts": list(contexts),
        "blocks": blocks,
        "total": [sum(sizes) for sizes in per_t],
    }


def human_bytes(n: int) -> str:
    """1536 -> '1.500 KiB': three decimals, so that a normaliser column or a conv state shows."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.3f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def memory_markdown(result: dict) -> str:
    """The Markdown table: one row per block and one for the whole model, one column per t."""
    contexts = result["contexts"]
    header = "| block | mixer | " + " | ".join(f"t = {t:,}" for t in contexts) + " |"
    rule = "|---|---|" + "---:|" * len(contexts)
    rows = [
        f"| {b['index']} | {b['mixer']} | " + " | ".join(human_bytes(x) for x in b["bytes"]) + " |"
        for b in result["blocks"]
    ]
    rows.append(
        "| all | whole model | "
        + " | ".join(f"**{human_bytes(x)}**" for x in result["total"])
        + " |"
    )
    c = result["config"]
    head_dim = c["head_dim"] or c["d_model"] // c["n_heads"]
    title = (
        f"Generation cache, batch size {result['batch_size']}, {result['dtype']} model "
        f"(d_model {c['d_model']}, {c['n_heads']} heads of dimension {head_dim}; recurrent "
        "states in float32)"
    )
    return "\n".join([title, "", header, rule, *rows])


# The report's figure (Kimi Team, 2025): the KV cache of Kimi Linear against full MLA, 1M tokens.
KIMI_LINEAR_REPORT = {"reduction": 0.75, "context": 1_048_576}
PRESET_CONTEXTS = (1024, 16384, 131072, 1_048_576)


def compare_with_counterpart(
    config: LMConfig, contexts: tuple[int, ...], dtype: torch.dtype, batch_size: int = 1
) -> dict:
    """``compute_memory`` of ``config`` and of its all-attention counterpart, and the reduction
    ``1 - total / counterpart total`` at each context."""
    ours = compute_memory(config, contexts, dtype, batch_size)
    counterpart = compute_memory(softmax_counterpart(config), contexts, dtype, batch_size)
    reduction = [
        1 - a / b if b else 0.0 for a, b in zip(ours["total"], counterpart["total"], strict=True)
    ]
    return {"model": ours, "counterpart": counterpart, "reduction": reduction}


def comparison_markdown(name: str, comparison: dict) -> str:
    """Both tables and one line per context: the reduction (and the report's, for Kimi Linear)."""
    attention = comparison["counterpart"]["config"]["mixers"][0]
    lines = [
        f"Preset {name}:",
        "",
        memory_markdown(comparison["model"]),
        "",
        f"Its counterpart, every block {attention}:",
        "",
        memory_markdown(comparison["counterpart"]),
        "",
    ]
    for t, r in zip(comparison["model"]["contexts"], comparison["reduction"], strict=True):
        lines.append(f"- t = {t:,}: the cache is {100 * r:.2f}% smaller than all-{attention}'s")
    if name == "kimi_linear":
        report = KIMI_LINEAR_REPORT
        lines.append(
            f"- the Kimi Linear report: up to {100 * report['reduction']:.0f}% less KV cache "
            f"at {report['context']:,} tokens (3 KDA : 1 MLA)"
        )
    return "\n".join(lines)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return values


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        default=None,
        help="a model preset (its own sizes), compared with its all-attention counterpart",
    )
    parser.add_argument("--d-model", type=int, default=None, help="width (default 2048)")
    parser.add_argument("--n-heads", type=int, default=None, help="heads per mixer (default 16)")
    parser.add_argument("--head-dim", type=int, default=None, help="default d_model / n_heads")
    parser.add_argument(
        "--mixers",
        type=name_list(MIXERS, "mixers"),
        default=None,
        help="comma-separated mixer names, one per block (default: one block of each: "
        + ",".join(MIXERS)
        + "; a Kimi-Linear-style hybrid is kda,kda,kda,softmax)",
    )
    parser.add_argument("--taylor-dim", type=int, default=16, help="key dim of 'taylor' (16)")
    parser.add_argument("--no-short-conv", action="store_true", help="mixers without short conv")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument(
        "--contexts",
        type=_int_list,
        default=None,
        help="e.g. 1024,16384,131072 (the default; with --preset also 1048576)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")


def run(args: argparse.Namespace) -> int:
    if isinstance(args.batch_size, bool) or args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    dtype = DTYPES[args.dtype]
    if args.preset is not None:
        return _run_preset(args, dtype)
    config = LMConfig(
        vocab_size=256,
        d_model=2048 if args.d_model is None else args.d_model,
        n_heads=16 if args.n_heads is None else args.n_heads,
        head_dim=args.head_dim,
        mixers=MIXERS if args.mixers is None else args.mixers,
        taylor_dim=args.taylor_dim,
        short_conv=False if args.no_short_conv else None,
        max_seq_len=None,
    )
    contexts = (1024, 16384, 131072) if args.contexts is None else args.contexts
    result = compute_memory(config, contexts, dtype, args.batch_size)
    print(json.dumps(result, indent=2) if args.json else memory_markdown(result))
    return 0


def _run_preset(args: argparse.Namespace, dtype: torch.dtype) -> int:
    given = [
        f for f in ("d_model", "n_heads", "head_dim", "mixers") if getattr(args, f) is not None
    ]
    if given:
        flags = ", ".join("--" + f.replace("_", "-") for f in given)
        raise ValueError(f"--preset sets the model's sizes; drop {flags}")
    config = preset(args.preset, short_conv=False if args.no_short_conv else None, max_seq_len=None)
    contexts = PRESET_CONTEXTS if args.contexts is None else args.contexts
    comparison = compare_with_counterpart(config, contexts, dtype, args.batch_size)
    if args.json:
        print(json.dumps({"preset": args.preset, **comparison}, indent=2))
    else:
        print(comparison_markdown(args.preset, comparison))
    return 0
