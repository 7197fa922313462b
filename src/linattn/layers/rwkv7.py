"""RWKV-7 "Goose" time mixing (Peng et al., 2025), as its paper and fla 0.6.0's ``RWKV7Attention``
define it (fla for what the paper leaves open). The memory is the generalized delta rule's
(spec section 8 generalised; ``linattn.ops.rwkv7``):

    S_t = Diag(exp w_t) S_{t-1} - kappa_t ((kappa_t * a_t)^T S_{t-1}) + k_t v_t^T,   o_t = S_t^T r_t

with, from the token-shifted inputs ``x_t + (x_{t-1} - x_t) * mu_*`` (one mix per branch):

    r = W_r x_r,  k0 = W_k x_k,  v = W_v x_v
    w = -exp(-1/2) sigmoid(LoRA_w(x_w))           the log-decay, in [-0.607, 0): decay in (0.545, 1]
    a = sigmoid(LoRA_a(x_a))                      the in-context learning rate, per key channel
    kappa = normalize(k0 * k_k)                   per head, unit length (the erase direction)
    k = k0 (1 + (a - 1) k_a)                      the written key
    v <- lerp(v, v_first, sigmoid(LoRA_v(x_v)))   the value residual (every layer but the first)
    o <- GroupNorm_heads(o) + ((r * k * r_k).sum per head) v      the bonus of the current token
    y = W_o (o * LoRA_g(x_g))                     the output gate (LoRA_g has a sigmoid inside)

``v_first`` is the first RWKV-7 layer's v: that layer (``first_layer=True``) writes it into the
``shared`` dict the model passes along its blocks, and the later ones read it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers.mixer import State, StateSpec, TokenMixer, check_positive, state_dtype
from linattn.layers.modules import LoRA, token_shift
from linattn.ops.checks import flag
from linattn.ops.rules import dplr

# w = -exp(-1/2) sigmoid(.): the log-decay's lower bound (fla's 0.6065306597126334)
W_SCALE = math.exp(-0.5)
BRANCHES = ("r", "w", "k", "v", "a", "g")  # the six token-shift mixes, in fla's order


def lora_rank(d_model: int, multiplier: float, factor: float = 1.0) -> int:
    """fla's default LoRA width: ``multiplier sqrt(d_model) factor``, rounded to a multiple of
    32, at least 32 (factor = head_dim / 64 for the decay, a and value LoRAs)."""
    return max(32, int(round(multiplier * d_model**0.5 * factor / 32) * 32))


class RWKV7(TokenMixer):
    """RWKV-7 time mixing (the module docstring has the formulas).

    Args (fla's names in brackets):
        d_model: width of the residual stream [hidden_size]; also the key width H K.
        n_heads: heads H; the key dimension per head is K = d_model / H.
        head_dim: value dimension V per head (default K) [value_dim / num_heads].
        first_layer: this layer makes ``v_first`` (fla's ``layer_idx == 0``: no value LoRA);
            False: it mixes in the first layer's, read from ``shared["v_first"]``.
        decay_rank, a_rank, v_rank, gate_rank: LoRA widths (default fla's, ``lora_rank``).
        norm_eps: the group norm's epsilon is ``K * norm_eps`` (fla's).
        chunk_size: block length of the op's chunk form (32, the generalized rule's fastest).
    """

    shares_values = True

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        first_layer: bool = True,
        decay_rank: int | None = None,
        a_rank: int | None = None,
        v_rank: int | None = None,
        gate_rank: int | None = None,
        norm_eps: float = 1e-5,
        chunk_size: int = dplr.CHUNK_SIZE,
    ) -> None:
        super().__init__(d_model, chunk_size)
        check_positive("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        H, K = n_heads, d_model // n_heads
        V = K if head_dim is None else head_dim
        check_positive("head_dim", V)
        self.n_heads, self.key_dim, self.head_dim = H, K, V
        self.first_layer = flag("first_layer", first_layer)
        factor = K / 64
        given = dict(w=decay_rank, a=a_rank, v=v_rank, g=gate_rank)
        default = dict(
            w=lora_rank(d_model, 2.5, factor),
            a=lora_rank(d_model, 2.5, factor),
            v=lora_rank(d_model, 1.7, factor),
            g=lora_rank(d_model, 5.0),
        )
        ranks = {n: default[n] if given[n] is None else given[n] for n in given}
        for n, name in zip(given, ("decay_rank", "a_rank", "v_rank", "gate_rank"), strict=True):
            check_positive(name, ranks[n])
        self.mu = nn.Parameter(torch.zeros(len(BRANCHES), d_model))  # the token-shift mixes
        self.k_k = nn.Parameter(torch.zeros(d_model))
        self.k_a = nn.Parameter(torch.zeros(d_model))
        self.r_k = nn.Parameter(torch.zeros(H, K))
        self.r_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, H * V, bias=False)
        self.o_proj = nn.Linear(H * V, d_model, bias=False)
        self.w_lora = LoRA(d_model, ranks["w"], d_model, "tanh")
        self.v_lora = None if self.first_layer else LoRA(d_model, ranks["v"], H * V)
        self.a_lora = LoRA(d_model, ranks["a"], d_model)
        self.g_lora = LoRA(d_model, ranks["g"], H * V, "sigmoid", bias=False)
        self.g_norm = nn.GroupNorm(H, H * V, eps=K * norm_eps)
        self.reset_rwkv_parameters()

    @torch.no_grad()
    def reset_rwkv_parameters(self, depth: float = 0.5) -> None:
        """fla's initialisation of the mixes, k_k, k_a, r_k and the LoRA offsets, at relative
        depth ``depth`` in [0, 1) (fla: layer_idx / num_layers; the default a middle layer):
        ``mu_* = 1 - (n / D)^(p_* (1 - depth))``; the decay offset rises from -5.5 to 0.5 over
        the channels, with a zigzag over each head's keys."""
        D, K = self.d_model, self.key_dim
        n = torch.arange(D, dtype=torch.float64)
        linear = n / max(D - 1, 1) - 0.5
        zigzag = ((n % K) - (K - 1) / 2) / max((K - 1) / 2, 1)
        zigzag = zigzag * zigzag.abs()
        powers = torch.tensor([0.2, 0.9, 0.7, 0.7, 0.9, 0.2], dtype=torch.float64)  # BRANCHES
        mu = 1 - (n / D)[None] ** (powers[:, None] * (1 - depth))
        decay = -6 + 6 * (n / max(D - 1, 1)) ** (1 + depth**0.3)
        values = {
            self.mu: mu,
            self.k_k: 0.71 - 0.1 * linear,
            self.k_a: torch.full((D,), 1.02),
            self.r_k: torch.full((self.n_heads, K), -0.04),
            self.w_lora.bias: decay + 0.5 + 2.5 * zigzag,
            self.a_lora.bias: -0.19 + 0.3 * zigzag + 0.4 * linear,
        }
        if self.v_lora is not None and self.head_dim == K:
            values[self.v_lora.bias] = 0.73 - 0.4 * linear
        for p, value in values.items():
            p.copy_(value.to(p.dtype))

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``S``: [B, H, K, V] in float32 (float64 for float64 models); ``shift``: the last token's
        input [B, d_model] (the token shift's cache), in the model's dtype."""
        H, K, V = self.n_heads, self.key_dim, self.head_dim
        return {
            "S": ((batch_size, H, K, V), state_dtype(dtype)),
            "shift": ((batch_size, self.d_model), dtype),
        }

    def value_residual(self, v: Tensor, x_v: Tensor, shared: dict[str, Tensor]) -> Tensor:
        """The first layer stores its v [B, T, H*V] as ``shared["v_first"]``; a later layer
        returns ``lerp(v, v_first, sigmoid(LoRA_v(x_v)))``."""
        if self.first_layer:
            shared["v_first"] = v
            return v
        v_first = shared.get("v_first")
        if v_first is None or v_first.shape != v.shape:
            got = None if v_first is None else tuple(v_first.shape)
            raise ValueError(
                f"RWKV7 with first_layer=False needs the first RWKV-7 layer's values: "
                f"shared['v_first'] of shape {tuple(v.shape)}, got {got}"
            )
        return torch.lerp(v, v_first.to(v.dtype), torch.sigmoid(self.v_lora(x_v)))

    def mix(
        self, x: Tensor, state: State | None, shared: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.key_dim, self.head_dim
        delta, last = token_shift(x, None if state is None else state["shift"])
        x_r, x_w, x_k, x_v, x_a, x_g = (x + delta * mu for mu in self.mu)  # [B, T, D] each
        r = self.r_proj(x_r)
        w = -W_SCALE * torch.sigmoid(self.w_lora(x_w))
        k = self.k_proj(x_k)
        v = self.value_residual(self.v_proj(x_v), x_v, {} if shared is None else shared)
        a = torch.sigmoid(self.a_lora(x_a))
        kappa = F.normalize((k * self.k_k).view(B, T, H, K), dim=-1)  # [B, T, D] -> [B, T, H, K]
        k = k + k * (a - 1) * self.k_a
        # [B, T, H*K] -> [B, T, H, K]; v: [B, T, H*V] -> [B, T, H, V]
        r, w, k, a = (t.view(B, T, H, K) for t in (r, w, k, a))
        v = v.view(B, T, H, V)
        S = None if state is None else state["S"]
        o, S = ops.rwkv7(
            r, w, k, v, -kappa, kappa * a,
            scale=1.0, mode=self.pick_mode(T, state), chunk_size=self.chunk_size,
            initial_state=S, output_final_state=state is not None,
        )  # fmt: skip
        o = self.g_norm(o.to(x.dtype).reshape(B * T, H * V)).view(B, T, H, V)
        o = o + (r * k * self.r_k).sum(-1, keepdim=True) * v  # the current token's bonus
        y = self.o_proj(o.reshape(B, T, H * V) * self.g_lora(x_g))  # [B, T, H, V] -> [B, T, H*V]
        if state is None:
            return y, None
        return y, {"S": S.to(state_dtype(x.dtype)), "shift": last}

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> RWKV7:
        """Our layer with the weights of fla's ``fla.layers.RWKV7Attention`` (see
        ``linattn.layers.convert``)."""
        from linattn.layers.convert import rwkv7_from_fla

        return rwkv7_from_fla(cls, module, **kwargs)
