"""``MultiScaleRetention``: RetNet's retention layer (Sun et al. 2023, section 2.2, "Retentive
Network: A Successor to Transformer for Large Language Models"), as fla 0.6.0's
``MultiScaleRetention`` defines it:

    q, k, v = W_q x, W_k x, W_v x                      (no activation, no short convolution)
    q, k <- RoPE(q), RoPE(k)                           (pairs (i, i + K/2), base 10000)
    S_t = gamma_h S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t / sqrt(K),  gamma_h = 1 - 2^(-5 - h)
    y = W_o (rmsnorm(o) * weight * silu(W_g x))        (per head; fla's swish output gate)

The memory is the scalar-decay one with a constant decay per head (registry entry "retention",
spec section 10), computed by ``linattn.ops.linear_attention``. The decoding state also counts
the tokens seen (``"position"``), the rotary embedding's offset.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from linattn import ops
from linattn.layers._reference import check_type, load_fla, require
from linattn.layers.mixer import State, StateSpec
from linattn.layers.recurrent import RecurrentMixer
from linattn.layers.softmax import rotary


def retention_log_decays(H: int, dtype: torch.dtype, device=None) -> Tensor:
    """RetNet's log-decays log(1 - 2^(-5 - h)), h = 0 .. H - 1, computed in float64."""
    h = torch.arange(H, dtype=torch.float64, device=device)
    return torch.log1p(-(2.0 ** (-5.0 - h))).to(dtype)


class MultiScaleRetention(RecurrentMixer):
    """RetNet's multi-scale retention (the module docstring).

    Args (besides ``chunk_size`` and ``mode`` of ``RecurrentMixer``): ``d_model``, ``n_heads``;
    ``expand_k``, ``expand_v``: the key and value widths ``expand * d_model`` over the heads
    (fla's names and defaults 1 and 2); ``output_gate``: the swish gate (default True; without
    it, the per-head RMSNorm alone); ``rope_base``: 10000; ``norm_eps``: 1e-5.
    """

    silu_without_conv = False  # q, k, v enter RoPE and the op as projected

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        expand_k: float = 1.0,
        expand_v: float = 2.0,
        output_gate: bool = True,
        rope_base: float = 10000.0,
        norm_eps: float = 1e-5,
        **kwargs,
    ) -> None:
        for name in ("short_conv", "head_dim", "key_dim", "num_v_heads", "gate_activation"):
            if name in kwargs:
                raise TypeError(f"MultiScaleRetention does not take {name}")
        key_dim = _per_head("expand_k", d_model, n_heads, expand_k)
        head_dim = _per_head("expand_v", d_model, n_heads, expand_v)
        super().__init__(
            d_model, n_heads, head_dim, key_dim, short_conv=False, output_gate=output_gate,
            norm_eps=norm_eps, **kwargs,
        )  # fmt: skip
        self.rope_base = float(rope_base)
        self._start: int = 0

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``RecurrentMixer``'s, and ``position``: the tokens seen, [B] int64 (RoPE's offset)."""
        return {**super().state_spec(batch_size, dtype), "position": ((batch_size,), torch.long)}

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        if state is None:
            self._start = 0
            return super().mix(x, None)
        positions = state["position"]
        if positions.numel() and bool((positions != positions[0]).any()):
            raise ValueError("state['position'] must be the same for every sequence of the batch")
        self._start = int(positions[0]) if positions.numel() else 0
        y, new = super().mix(x, {n: t for n, t in state.items() if n != "position"})
        new["position"] = positions + x.shape[1]
        return y, new

    def recurrence(self, x, q, k, v, mode, S, keep):
        q, k = rotary(q, self._start, self.rope_base), rotary(k, self._start, self.rope_base)
        B, T, H = q.shape[:3]
        g = retention_log_decays(H, q.dtype, q.device).expand(B, T, H)
        return ops.linear_attention(
            q, k, v, g, mode=mode, chunk_size=self.chunk_size, initial_state=S,
            output_final_state=keep,
        )  # fmt: skip

    @classmethod
    def from_fla(cls, module: nn.Module) -> MultiScaleRetention:
        """Our layer with the options and weights of fla's ``MultiScaleRetention``."""
        check_type(module, "MultiScaleRetention", "fla")
        if not type(module).__module__.startswith("fla."):  # ours has fla's class name
            raise TypeError(
                f"module must be fla's MultiScaleRetention, got {type(module).__module__}"
            )
        require(module, num_kv_groups=1, feature_map_fn=None, use_short_conv=False)
        if module.use_output_gate:
            require(module, fuse_norm_and_gate=True)  # gate_fn 'swish', norm then gate
        norm = module.g_norm_swish_gate if module.use_output_gate else module.g_norm
        if norm.weight is None:
            raise ValueError("MultiScaleRetention with elementwise_affine=False is not supported")
        if getattr(module.rotary, "interleaved", False) or module.rotary.scale_base is not None:
            raise ValueError("only fla's default rotary embedding (not interleaved, no XPos)")
        layer = cls(
            module.hidden_size, module.num_heads, expand_k=module.expand_k,
            expand_v=module.expand_v, output_gate=module.use_output_gate,
            rope_base=module.rotary.base, norm_eps=norm.eps,
        )  # fmt: skip
        return load_fla(layer, module, {"o_norm.weight": norm.weight}, gate=module.use_output_gate)


def _per_head(name: str, d_model: int, n_heads: int, expand: float) -> int:
    """``expand * d_model / n_heads``, which must be a positive integer."""
    width = expand * d_model / n_heads
    if not (width >= 1 and float(width).is_integer()):
        raise ValueError(
            f"{name} * d_model / n_heads must be a positive integer, got {expand} * {d_model} / "
            f"{n_heads} = {width}"
        )
    return int(width)
