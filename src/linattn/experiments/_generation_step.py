"""The generation step of `linattn bench`: one token of the recurrent form against softmax decoding.

A recurrent step reads and writes a fixed state [B, H, K, V]; a softmax decoding step reads the
whole KV cache of t tokens (section 9). Both are timed as the public calls a decoder makes:
``linattn.ops.recurrent_step`` (every input validated, the state updated in place) and PyTorch's
scaled_dot_product_attention of one query over the cache (the append of the new key and value to a
preallocated cache is not timed). For comparison the delta rule's step is also timed as its kernel
alone (``recurrent.step``, no checks) and as a call of the sequence op ``delta_rule`` with T = 1
and an initial state (whole-sequence checks, layout changes and a new state per call).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linattn.experiments._timing import median_time
from linattn.ops import delta_rule, recurrent_step
from linattn.ops.recurrent import step
from linattn.ops.rules import named
from linattn.reference.costs import (
    delta_state_numbers,
    delta_step_ops,
    kv_cache_numbers,
    linear_step_ops,
    softmax_step_ops,
)

BYTES = 4  # float32

DELTA = named("delta")  # the rule of the step timed alone


def step_times(H: int, K: int, repeats: int) -> dict[str, float]:
    """Median seconds of one step (B = 1): linear attention and the delta rule, three ways."""
    gen = torch.Generator().manual_seed(0)
    q, v = torch.randn(1, H, K, generator=gen), torch.randn(1, H, K, generator=gen)  # [B, H, D]
    k = F.normalize(torch.randn(1, H, K, generator=gen), dim=-1)
    beta = torch.full((1, H), 0.5)
    S = torch.randn(1, H, K, K, generator=gen)
    times = {}
    with torch.no_grad():
        # The additive rule's state grows by k v^T per step; a tiny v keeps it far from overflow
        # (made once, outside the timed call).
        state, v_small = S.clone(), v * 1e-6
        times["linear"], _ = median_time(
            lambda: recurrent_step(state, q, k, v_small), repeats, warmup=3
        )
        state = S.clone()  # the delta rule's state stays bounded (beta = 0.5, unit keys)
        times["delta"], _ = median_time(
            lambda: recurrent_step(state, q, k, v, beta), repeats, warmup=3
        )
        times["delta_kernel"], _ = median_time(
            lambda: step(state, q, k, v, beta, None, DELTA, inplace=True), repeats, warmup=3
        )
        q1, k1, v1, b1 = q[:, None], k[:, None], v[:, None], beta[:, None]  # [B, 1, H, D]
        times["delta_op"], _ = median_time(
            lambda: delta_rule(
                q1, k1, v1, b1, mode="recurrent", initial_state=S, output_final_state=True
            ),
            repeats,
            warmup=3,
        )
    return times


def softmax_step_time(t: int, H: int, K: int, repeats: int) -> float:
    """Median seconds of one softmax decoding step: one query over a KV cache of t tokens."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, 1, K, generator=gen)
    k_cache = torch.randn(1, H, t, K, generator=gen)  # [B, H, t, K]: SDPA's layout
    v_cache = torch.randn(1, H, t, K, generator=gen)
    with torch.no_grad():
        seconds, _ = median_time(
            lambda: F.scaled_dot_product_attention(q, k_cache, v_cache), repeats, warmup=2
        )
    return seconds


def generation_rows(ts: list[int], H: int, K: int, repeats: int) -> list[dict]:
    """One row per cache length t: the step times, their ratio, and bytes of state and cache."""
    rows = []
    for t in ts:
        recurrent = step_times(H, K, repeats)  # timed again at every t: the same fixed state
        softmax = softmax_step_time(t, H, K, repeats)
        rows.append(
            {
                "t": t,
                "H": H,
                "K": K,
                "softmax_step_s": softmax,
                "linear_step_s": recurrent["linear"],
                "delta_step_s": recurrent["delta"],
                "delta_kernel_step_s": recurrent["delta_kernel"],
                "delta_op_step_s": recurrent["delta_op"],
                "softmax_over_delta_kernel": softmax / recurrent["delta_kernel"],
                "softmax_over_linear": softmax / recurrent["linear"],
                "softmax_over_delta": softmax / recurrent["delta"],
                "softmax_step_ops": H * softmax_step_ops(t, K),
                "linear_step_ops": H * linear_step_ops(K, K),
                "delta_step_ops": H * delta_step_ops(K, K),
                "cache_bytes": BYTES * H * kv_cache_numbers(t, K),
                "state_bytes": BYTES * H * delta_state_numbers(K, K),
            }
        )
    return rows


def generation_markdown(rows: list[dict]) -> str:
    """The generation-step table as Markdown."""
    lines = [
        f"**Generation step** (B = 1, H = {rows[0]['H']}, K = V = {rows[0]['K']}, float32; median)",
        "",
        "| cache t | softmax step | linear step | delta step | softmax / delta | "
        "delta kernel | delta_rule(T = 1) | KV cache | state | cache / state |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['t']:,} | {r['softmax_step_s'] * 1e6:,.0f} us | "
            f"{r['linear_step_s'] * 1e6:,.0f} us | {r['delta_step_s'] * 1e6:,.0f} us | "
            f"{r['softmax_over_delta']:,.0f}x | {r['delta_kernel_step_s'] * 1e6:,.0f} us | "
            f"{r['delta_op_step_s'] * 1e6:,.0f} us | {r['cache_bytes'] / 2**20:,.0f} MiB | "
            f"{r['state_bytes'] / 2**10:,.0f} KiB | {r['cache_bytes'] / r['state_bytes']:,.0f} |"
        )
    return "\n".join(lines)
