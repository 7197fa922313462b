"""``RWKV6``: RWKV-6 "Finch" time mixing (Peng et al. 2024, "Eagle and Finch: RWKV with
Matrix-Valued States and Dynamic Recurrence", section 4), as fla 0.6.0's ``RWKV6Attention``
defines it. With the token shift delta_t = x_{t-1} - x_t (x_0: the previous call's last token,
zeros at first) and five data-dependent mixes (r, w, k, v, g):

    z = tanh(W_down (x + delta * mu_x))                   [5, R]: one rank-R slice per branch
    m_n = W_up,n z_n + b_n,   x_n = x + delta * m_n       (n = r, w, k, v, g)
    r, k, v, g = W_r x_r, W_k x_k, W_v x_v, W_g x_g
    w = -exp(LoRA_w(x_w))                                 (the log-decay per key channel; tanh LoRA)
    S_t = Diag(exp w_t) S_{t-1} + k_t v_t^T,   o_t = S_{t-1}^T r_t + (sum_c r_tc u_c k_tc) v_t
    y = W_o (GroupNorm_heads(o) * silu(g))

with the bonus u [H, K] and scale 1. The memory is ``linattn.ops.rwkv6`` (registry entry "rwkv6",
spec section 10); the decoding state is S [B, H, K, V] and the last token's x (``"shift"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers._reference import check_type, load
from linattn.layers.mixer import State, StateSpec, TokenMixer, check_positive, state_dtype
from linattn.layers.modules import LoRA, token_shift

if TYPE_CHECKING:
    from linattn.models.config import LMConfig

BRANCHES = ("r", "w", "k", "v", "g")  # the five mixes, in fla's order


def _width(name: str, d_model: int, expand: float, n_heads: int) -> int:
    """``expand * d_model``, an integer multiple of ``n_heads``, checked."""
    width = expand * d_model
    if not (width >= n_heads and float(width).is_integer() and int(width) % n_heads == 0):
        raise ValueError(
            f"{name} * d_model must be a positive multiple of n_heads ({n_heads}), got "
            f"{expand} * {d_model} = {width}"
        )
    return int(width)


class RWKV6(TokenMixer):
    """RWKV-6 time mixing (the module docstring). Args (fla's names and defaults): ``d_model``;
    ``n_heads`` (4); ``expand_k`` (0.5), ``expand_v`` (1): key and value widths over the heads;
    ``proj_low_rank_dim`` R (32): the mixes' rank; ``gate_low_rank_dim`` (64): the decay LoRA's
    rank; ``norm_eps`` (1e-5): the group norm's; ``chunk_size``."""

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        *,
        expand_k: float = 0.5,
        expand_v: float = 1.0,
        proj_low_rank_dim: int = 32,
        gate_low_rank_dim: int = 64,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        check_positive("n_heads", n_heads)
        check_positive("proj_low_rank_dim", proj_low_rank_dim)
        check_positive("gate_low_rank_dim", gate_low_rank_dim)
        Kd = _width("expand_k", d_model, expand_k, n_heads)
        Vd = _width("expand_v", d_model, expand_v, n_heads)
        self.n_heads, self.key_dim, self.head_dim = n_heads, Kd // n_heads, Vd // n_heads
        self.rank, self.norm_eps = proj_low_rank_dim, norm_eps
        R = proj_low_rank_dim
        self.mu_x = nn.Parameter(torch.zeros(d_model))
        self.x_down = nn.Linear(d_model, 5 * R, bias=False)
        self.x_up = nn.Linear(5 * R, d_model, bias=False)  # [d_model, 5 R]: slice n is branch n
        self.x_bias = nn.Parameter(torch.zeros(5, d_model))
        self.r_proj = nn.Linear(d_model, Kd, bias=False)
        self.w_lora = LoRA(d_model, gate_low_rank_dim, Kd, activation="tanh")
        self.k_proj = nn.Linear(d_model, Kd, bias=False)
        self.v_proj = nn.Linear(d_model, Vd, bias=False)
        self.g_proj = nn.Linear(d_model, Vd, bias=False)
        self.bonus = nn.Parameter(torch.zeros(n_heads, self.key_dim))
        self.norm_weight = nn.Parameter(torch.ones(Vd))
        self.norm_bias = nn.Parameter(torch.zeros(Vd))
        self.o_proj = nn.Linear(Vd, d_model, bias=False)
        with torch.no_grad():
            self.reset_rwkv_parameters()

    def reset_rwkv_parameters(self, depth: float = 0.5) -> None:
        """The mixes, decay offsets and bonus as the RWKV-6 code (RWKV-LM's ``RWKV_Tmix_x060``)
        initialises them, its two depth ratios both ``depth`` in [0, 1) (layer / layers; the
        default a middle layer), with
        c = channel / d_model and n the key channel over all heads:
        ``mu_x, mu_w, mu_k = 1 - c^(1 - depth)``, ``mu_v = 1 - c^(1 - depth) - 0.3 depth``,
        ``mu_r, mu_g = 1 - c^((1 - depth) / 2)``; the decay offset (``w_lora.bias``)
        ``-6 + 5 (n / (N - 1))^(0.7 + 1.3 depth)``, slow to fast decays over the channels; the
        bonus ``depth (1 - n / (N - 1)) + 0.1 ((n + 1) mod 3 - 1)``. Without it the LM's init
        (zero offsets) starts every channel at a decay of exp(-1) per token."""
        if not 0 <= depth < 1:
            raise ValueError(f"depth must lie in [0, 1), got {depth!r}")
        c = torch.arange(self.d_model, dtype=torch.float64) / self.d_model
        late = 1 - depth
        mu = {
            "r": 1 - c ** (late / 2), "w": 1 - c**late, "k": 1 - c**late,
            "v": 1 - c**late - 0.3 * depth, "g": 1 - c ** (late / 2),
        }  # fmt: skip
        N = self.n_heads * self.key_dim
        n = torch.arange(N, dtype=torch.float64) / max(N - 1, 1)
        decay = -6 + 5 * n ** (0.7 + 1.3 * depth)
        zigzag = 0.1 * ((torch.arange(N) + 1) % 3 - 1).to(torch.float64)
        bonus = depth * (1 - n) + zigzag
        self.mu_x.copy_((1 - c**late).to(self.mu_x.dtype))
        self.x_bias.copy_(torch.stack([mu[b] for b in BRANCHES]).to(self.x_bias.dtype))
        self.w_lora.bias.copy_(decay.to(self.w_lora.bias.dtype))
        self.bonus.copy_(bonus.view(self.n_heads, self.key_dim).to(self.bonus.dtype))

    @classmethod
    def from_config(cls, config: LMConfig) -> RWKV6:
        """The mixer ``"rwkv6"`` of ``LMConfig.mixers``: the config's ``n_heads``, ``norm_eps``
        and ``chunk_size``; fla's widths otherwise."""
        kwargs = {} if config.chunk_size is None else {"chunk_size": config.chunk_size}
        return cls(config.d_model, config.n_heads, norm_eps=config.norm_eps, **kwargs)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``S``: [B, H, K, V], float32 (float64 for a float64 model); ``shift``: the last
        token's x [B, d_model], the model's dtype."""
        S = (batch_size, self.n_heads, self.key_dim, self.head_dim)
        return {"S": (S, state_dtype(dtype)), "shift": ((batch_size, self.d_model), dtype)}

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, D = x.shape
        H, K, V, R = self.n_heads, self.key_dim, self.head_dim, self.rank
        delta, last = token_shift(x, None if state is None else state["shift"])
        z = torch.tanh(self.x_down(x + delta * self.mu_x)).view(B, T, 5, R)
        up = self.x_up.weight.view(D, 5, R)
        mixes = torch.einsum("btnr,dnr->btnd", z, up) + self.x_bias  # [B, T, 5, D]
        x_r, x_w, x_k, x_v, x_g = (x + delta * m for m in mixes.unbind(2))
        r = self.r_proj(x_r).view(B, T, H, K)
        k = self.k_proj(x_k).view(B, T, H, K)
        v = self.v_proj(x_v).view(B, T, H, V)
        w = -torch.exp(self.w_lora(x_w)).view(B, T, H, K)
        o, S = ops.rwkv6(
            r, k, v, w, self.bonus, scale=1.0, mode=self.pick_mode(T, state),
            chunk_size=self.chunk_size, initial_state=None if state is None else state["S"],
            output_final_state=state is not None,
        )  # fmt: skip
        o = F.group_norm(o.reshape(B * T, H * V), H, self.norm_weight, self.norm_bias,
                         self.norm_eps).view(B, T, H * V)  # fmt: skip
        y = self.o_proj(o * F.silu(self.g_proj(x_g)))
        new = None if state is None else {"S": S.to(state_dtype(x.dtype)), "shift": last}
        return y, new

    @classmethod
    def from_fla(cls, module: nn.Module) -> RWKV6:
        """Our RWKV-6 with the options and weights of fla's ``RWKV6Attention``."""
        check_type(module, "RWKV6Attention", "fla")
        norm = module.g_norm
        if norm.weight is None or norm.bias is None or norm.is_rms_norm:
            raise ValueError("only fla's RWKV6Attention with an affine group norm with bias")
        # fla binds its gate by name (ACT2FN); what it computes is compared on a few points
        x = torch.linspace(-3, 3, 7, dtype=torch.float64)
        if not torch.allclose(module.gate_fn(x.float()).double(), F.silu(x), atol=1e-6):
            raise ValueError("only fla's RWKV6Attention with gate_fn 'swish'")
        layer = cls(
            module.hidden_size, module.num_heads, expand_k=module.expand_k,
            expand_v=module.expand_v, proj_low_rank_dim=module.proj_low_rank_dim,
            gate_low_rank_dim=module.gate_low_rank_dim, norm_eps=norm.eps,
        )  # fmt: skip
        w_lora = module.w_proj.linear.lora
        weights = {
            "mu_x": module.x_proj[0].mu,
            "x_down.weight": module.x_proj[0].linear.weight,
            "x_up.weight": module.x_proj[2].weight,
            "x_bias": module.x_bias,
            "r_proj.weight": module.r_proj.linear.weight,
            "w_lora.down.weight": w_lora[0].weight,
            "w_lora.up.weight": w_lora[2].weight,
            "w_lora.bias": w_lora[2].bias,
            "k_proj.weight": module.k_proj.linear.weight,
            "v_proj.weight": module.v_proj.linear.weight,
            "g_proj.weight": module.g_proj.linear.weight,
            "bonus": module.bonus,
            "norm_weight": norm.weight,
            "norm_bias": norm.bias,
            "o_proj.weight": module.o_proj.weight,
        }
        return load(layer, weights, module.o_proj.weight)
