"""The gated Oja rule's layer, ``GatedOja``, around ``linattn.ops.gated_oja_rule`` (fla 0.6.0 has
the op, ``fla.ops.gated_oja_rule``, and no layer): linattn's recurrent block, as KDA's layer
with the decay on the value side:

    q, k, v = silu(conv(W_q x)), silu(conv(W_k x)), silu(conv(W_v x)),  each l2-normalised
    gv      = -exp(A_log) softplus(a_proj x + dt_bias)   (per value channel; a_proj low-rank)
    beta    = sigmoid(b_proj x)
    S_t     = S_{t-1} Diag(exp gv_t) (I - beta_t v_t v_t^T) + beta_t k_t v_t^T
    o_t     = S_t^T q_t / sqrt(K),   y = o_proj(rmsnorm(o) * weight * sigmoid(g_proj x))

A unit v_t and beta_t in (0, 1) make ``I - beta_t v_t v_t^T`` a contraction (Oja's rule keeps the
memory bounded). The state is the memory S [B, HV, K, V] and the convolution's last inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.layers.mixer import resolve_head_dim
from linattn.layers.modules import DecayGate, check_dt_range
from linattn.layers.recurrent import RecurrentMixer
from linattn.ops.gated_oja_rule import gated_oja_rule


class GatedOja(RecurrentMixer):
    """The gated Oja rule (Oja 1982; fla 0.6.0's ``gated_oja_rule``) as a layer (the module
    docstring).

    Args: d_model; n_heads (query/key heads H); head_dim (K, default d_model // n_heads);
    expand_v (V = K expand_v, default 1); num_v_heads (HV, a multiple of H; default H);
    decay_rank (the decay projection's rank, default V); dt_init_range ((1e-3, 1e-1)); and
    ``RecurrentMixer``'s keywords (short_conv, conv_size, output_gate, norm_eps 1e-5,
    chunk_size).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        expand_v: float = 1.0,
        num_v_heads: int | None = None,
        decay_rank: int | None = None,
        dt_init_range: tuple[float, float] = (1e-3, 1e-1),
        **kwargs,
    ) -> None:
        K = resolve_head_dim(d_model, n_heads, head_dim)
        V = round(K * expand_v)
        if V < 1 or abs(V - K * expand_v) > 1e-9:
            raise ValueError(
                f"head_dim * expand_v must be a whole number >= 1, got {K} * {expand_v}"
            )
        check_dt_range("dt_init_range", dt_init_range)
        kwargs.setdefault("gate_activation", "sigmoid")
        kwargs.setdefault("norm_eps", 1e-5)
        super().__init__(d_model, n_heads, V, K, num_v_heads=num_v_heads, **kwargs)
        HV = self.num_v_heads
        rank = V if decay_rank is None else decay_rank
        # DecayGate's per-channel gate over the value channels: [B, T, HV, V]
        self.decay = DecayGate(d_model, HV, V, "channel", rank=rank, dt_range=dt_init_range)
        self.b_proj = nn.Linear(d_model, HV, bias=False)

    def recurrence(self, x: Tensor, q, k, v, mode, S, keep):
        q, k, v = (F.normalize(t, dim=-1) for t in (q, k, v))
        gv = self.decay(x)
        beta = torch.sigmoid(self.b_proj(x))
        return gated_oja_rule(
            q, k, v, gv, beta, mode=mode, chunk_size=self.chunk_size, initial_state=S,
            output_final_state=keep,
        )  # fmt: skip
