"""Memory-slot layers: ``GatedSlotAttention`` (GSA) and ``ABCAttention`` (ABC), as fla 0.6.0's.

Both project x to q, k, v and m slot weights per head and run ``linattn.ops.slots``: two passes
of the additive rule with a softmax over the m slots between them (Zhang et al. 2024; Peng et
al. 2022). The layers follow fla's ``fla/layers/gsa.py`` and ``fla/layers/abc.py``, and
``from_fla`` builds ours with the options and weights of fla's:

    GSA  q, k = phi(W_q x), phi(W_k x) (phi = swish or relu), v = silu(W_v x)
         g = logsigmoid(W_f x) / gate_logit_normalizer, s = 1 - exp(g)   (per slot)
         y = W_o rmsnorm(silu(o))                                        (over all heads)
    ABC  q, k = rope(W_q x), rope(W_k x), v = W_v x, s = clamp(W_s x, -32, 32)
         y = W_o (rmsnorm(o) * weight * silu(W_g x))                     (per head)

States for generation: the pair of memories (``S_k`` [B, H, K, m], ``S_v`` [B, H, m, V]), the
short convolution's inputs, and for ABC the running log-normaliser ``z`` [B, H, m] and the
position ``t`` (for the rotary embedding). ABC continues its normaliser across calls (a prompt
then one token at a time gives the outputs of one call on the whole sequence); fla's ABC layer
restarts it at every call (``linattn.compat.chunk_abc``), so the two agree on a whole sequence
without a cache only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.layers._reference import check_type, load, require
from linattn.layers.mixer import State, StateSpec, TokenMixer, check_positive, state_dtype
from linattn.layers.modules import GatedRMSNorm, ShortConvolution
from linattn.layers.softmax import rotary
from linattn.ops.checks import flag
from linattn.ops.slots import gated_slot_attention

FEATURE_MAPS = ("swish", "relu")


def _conv_state(conv: ShortConvolution | None, qkv: Tensor, state: State | None, new: State):
    if conv is None:
        return qkv
    qkv, conv_state = conv(qkv, None if state is None else state["conv"])
    if state is not None:
        new["conv"] = conv_state
    return qkv


def _fla_conv(module: nn.Module) -> Tensor | None:
    """fla's q, k, v convolutions as our one (no bias, SiLU)."""
    if not module.use_short_conv:
        return None
    convs = (module.q_conv1d, module.k_conv1d, module.v_conv1d)
    if any(c.bias is not None or c.activation not in ("silu", "swish") for c in convs):
        raise ValueError("only fla's short convolutions without bias, with SiLU, are supported")
    return torch.cat([c.weight for c in convs], dim=0)


class GatedSlotAttention(TokenMixer):
    """Gated slot attention (Zhang et al. 2024) as fla's ``GatedSlotAttention`` layer.

    Args: ``d_model``; ``n_heads`` (query heads H); ``head_dim`` V and ``key_dim`` K per head
    (default ``d_model // n_heads``); ``num_kv_heads`` (grouped heads: k, v and the gates have
    these, repeated to H as fla does); ``num_slots`` m (default K); ``short_conv`` (+ SiLU,
    kernel ``conv_size``); ``feature_map`` "swish" or "relu" on q and k;
    ``gate_logit_normalizer`` (8); ``scale`` of the slot scores (fla's 1.0); ``norm_eps`` of the
    output RMSNorm over all H V channels (fla's is 1e-5 whatever its ``norm_eps``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        key_dim: int | None = None,
        *,
        num_kv_heads: int | None = None,
        num_slots: int | None = None,
        short_conv: bool = False,
        conv_size: int = 4,
        feature_map: str = "swish",
        gate_logit_normalizer: float = 8.0,
        scale: float | None = 1.0,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        check_positive("n_heads", n_heads)
        V = d_model // n_heads if head_dim is None else head_dim
        K = V if key_dim is None else key_dim
        HKV = n_heads if num_kv_heads is None else num_kv_heads
        M = K if num_slots is None else num_slots
        for name, value in (("head_dim", V), ("key_dim", K), ("num_kv_heads", HKV),
                            ("num_slots", M)):  # fmt: skip
            check_positive(name, value)
        if n_heads % HKV:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of num_kv_heads ({HKV})")
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {feature_map!r}")
        self.n_heads, self.num_kv_heads, self.key_dim, self.head_dim = n_heads, HKV, K, V
        self.num_slots, self.feature_map = M, feature_map
        self.gate_logit_normalizer, self.scale = float(gate_logit_normalizer), scale
        self.q_proj = nn.Linear(d_model, n_heads * K, bias=False)
        self.k_proj = nn.Linear(d_model, HKV * K, bias=False)
        self.v_proj = nn.Linear(d_model, HKV * V, bias=False)
        self.f_proj = nn.Linear(d_model, HKV * M, bias=False)
        short_conv = flag("short_conv", short_conv)
        channels = (n_heads + HKV) * K + HKV * V
        self.conv = ShortConvolution(channels, conv_size) if short_conv else None
        self.o_norm = nn.RMSNorm(n_heads * V, eps=norm_eps)
        self.o_proj = nn.Linear(n_heads * V, d_model, bias=False)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        H, K, V, M = self.n_heads, self.key_dim, self.head_dim, self.num_slots
        spec: StateSpec = {
            "S_k": ((batch_size, H, K, M), state_dtype(dtype)),
            "S_v": ((batch_size, H, M, V), state_dtype(dtype)),
        }
        if self.conv is not None:
            spec["conv"] = (self.conv.state_shape(batch_size), dtype)
        return spec

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, HKV, K, V, M = (
            self.n_heads,
            self.num_kv_heads,
            self.key_dim,
            self.head_dim,
            self.num_slots,
        )
        new: State | None = None if state is None else {}
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        qkv = _conv_state(self.conv, qkv, state, new if new is not None else {})
        q, k, v = qkv.split([H * K, HKV * K, HKV * V], dim=-1)
        phi = F.silu if self.feature_map == "swish" else F.relu
        q, k = phi(q.view(B, T, H, K)), phi(k.view(B, T, HKV, K))
        v = F.silu(v.view(B, T, HKV, V))
        g = F.logsigmoid(self.f_proj(x).view(B, T, HKV, M)) / self.gate_logit_normalizer
        s = 1 - g.exp()
        G = H // HKV
        if G > 1:
            k, v, g, s = (t.repeat_interleave(G, dim=2) for t in (k, v, g, s))
        S0 = None if state is None else (state["S_k"], state["S_v"])
        o, S = gated_slot_attention(
            q, k, v, s, g, scale=self.scale, mode=self.pick_mode(T, state),
            chunk_size=self.chunk_size, initial_state=S0, output_final_state=state is not None,
        )  # fmt: skip
        if new is not None:
            new["S_k"], new["S_v"] = (t.to(state_dtype(x.dtype)) for t in S)
        o = self.o_norm(F.silu(o.reshape(B, T, H * V).to(x.dtype)))
        return self.o_proj(o), new

    @classmethod
    def from_fla(cls, module: nn.Module) -> GatedSlotAttention:
        """Ours with the options and weights of fla's ``GatedSlotAttention`` layer."""
        check_type(module, "GatedSlotAttention", "fla")
        kind = type(module.feature_map).__name__
        maps = {"SwishFeatureMap": "swish", "ReLUFeatureMap": "relu"}
        if kind not in maps:
            raise ValueError(f"GatedSlotAttention with feature map {kind} is not supported")
        norm = module.g_norm
        if norm.weight is None or getattr(norm, "bias", None) is not None:
            raise ValueError("GatedSlotAttention: only fla's RMSNorm with a weight, no bias")
        require(module, value_dim=module.hidden_size)  # fla's norm is hidden_size wide
        layer = cls(
            module.hidden_size, module.num_heads, module.head_v_dim, module.head_k_dim,
            num_kv_heads=module.num_kv_heads, num_slots=module.num_slots,
            short_conv=module.use_short_conv, conv_size=module.conv_size,
            feature_map=maps[kind], gate_logit_normalizer=module.gate_logit_normalizer,
            scale=module.scale, norm_eps=1e-5,  # fla's rms_norm_linear: eps 1e-5
        )  # fmt: skip
        weights = {
            "q_proj.weight": module.q_proj.weight, "k_proj.weight": module.k_proj.weight,
            "v_proj.weight": module.v_proj.weight, "f_proj.weight": module.f_proj.weight,
            "o_norm.weight": norm.weight, "o_proj.weight": module.o_proj.weight,
        }  # fmt: skip
        if module.o_proj.bias is not None:
            raise ValueError("GatedSlotAttention: an output projection with a bias")
        conv = _fla_conv(module)
        if conv is not None:
            weights["conv.weight"] = conv
        return load(layer, weights, module.q_proj.weight)


class ABCAttention(TokenMixer):
    """ABC (Peng et al. 2022) as fla's ``ABCAttention`` layer.

    Args: ``d_model``; ``n_heads``; ``head_dim`` V and ``key_dim`` K per head (default
    ``d_model // n_heads``); ``num_slots`` m (default K); ``short_conv`` (+ SiLU, kernel
    ``conv_size``); ``rope`` (rotary embeddings on q and k, base 10000); ``input_gate`` (swish
    on q, k, v); ``output_gate`` (``silu(W_g x)``); ``use_norm`` (the per-head RMSNorm);
    ``clamp`` the slot logits' range; ``norm_eps``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        key_dim: int | None = None,
        *,
        num_slots: int | None = None,
        short_conv: bool = False,
        conv_size: int = 4,
        rope: bool = True,
        input_gate: bool = False,
        output_gate: bool = True,
        use_norm: bool = True,
        clamp: tuple[float | None, float | None] = (-32.0, 32.0),
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        check_positive("n_heads", n_heads)
        V = d_model // n_heads if head_dim is None else head_dim
        K = V if key_dim is None else key_dim
        M = K if num_slots is None else num_slots
        for name, value in (("head_dim", V), ("key_dim", K), ("num_slots", M)):
            check_positive(name, value)
        self.n_heads, self.key_dim, self.head_dim, self.num_slots = n_heads, K, V, M
        self.rope, self.input_gate = flag("rope", rope), flag("input_gate", input_gate)
        self.use_norm, self.clamp = flag("use_norm", use_norm), tuple(clamp)
        self.q_proj = nn.Linear(d_model, n_heads * K, bias=False)
        self.k_proj = nn.Linear(d_model, n_heads * K, bias=False)
        self.v_proj = nn.Linear(d_model, n_heads * V, bias=False)
        self.s_proj = nn.Linear(d_model, n_heads * M, bias=False)
        self.g_proj = nn.Linear(d_model, n_heads * V, bias=False) if output_gate else None
        short_conv = flag("short_conv", short_conv)
        self.conv = ShortConvolution(n_heads * (2 * K + V), conv_size) if short_conv else None
        self.o_norm = GatedRMSNorm(V, "silu", norm_eps) if self.use_norm else None
        self.o_proj = nn.Linear(n_heads * V, d_model, bias=False)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        H, K, V, M = self.n_heads, self.key_dim, self.head_dim, self.num_slots
        sd = state_dtype(dtype)
        spec: StateSpec = {
            "S_k": ((batch_size, H, K, M), sd),
            "S_v": ((batch_size, H, M, V), sd),
            "z": ((batch_size, H, M), sd),
            "t": ((batch_size,), torch.int64),
        }
        if self.conv is not None:
            spec["conv"] = (self.conv.state_shape(batch_size), dtype)
        return spec

    def new_state(self, batch_size, dtype, device=None) -> State:
        """Zeros, and z = -inf: no token written yet."""
        state = super().new_state(batch_size, dtype, device)
        state["z"].fill_(-torch.inf)
        return state

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, K, V, M = self.n_heads, self.key_dim, self.head_dim, self.num_slots
        new: State | None = None if state is None else {}
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        qkv = _conv_state(self.conv, qkv, state, new if new is not None else {})
        if self.input_gate:
            qkv = F.silu(qkv)
        q, k, v = qkv.split([H * K, H * K, H * V], dim=-1)
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)
        start = 0 if state is None else int(state["t"][0])
        if self.rope:
            q, k = rotary(q, start), rotary(k, start)
        s = self.s_proj(x).view(B, T, H, M)
        if self.clamp != (None, None):
            s = s.clamp(*self.clamp)
        # ABC's control, continuing the normaliser z of the state (-inf: none yet)
        sd = state_dtype(x.dtype)
        z0 = None if state is None else state["z"]
        logits = s.to(sd)
        if z0 is None:
            z = torch.logcumsumexp(logits, dim=1)
            before = torch.cat([z[:, :1], z[:, :-1]], dim=1)
        else:
            z = torch.logcumsumexp(torch.cat([z0.unsqueeze(1), logits], dim=1), dim=1)[:, 1:]
            before = torch.cat([z0.unsqueeze(1), z[:, :-1]], dim=1)
            before = torch.where(torch.isneginf(before), z, before)
        g = before - z  # in the state dtype (float32 for half models), as the op takes it
        weights = torch.exp(logits - z).to(x.dtype)
        S0 = None if state is None else (state["S_k"], state["S_v"])
        o, S = gated_slot_attention(
            q, k, v, weights, g, scale=None, mode=self.pick_mode(T, state),
            chunk_size=self.chunk_size, initial_state=S0, output_final_state=state is not None,
        )  # fmt: skip
        if new is not None:
            new["S_k"], new["S_v"] = (t.to(sd) for t in S)
            new["z"], new["t"] = z[:, -1], state["t"] + T
        gate = None if self.g_proj is None else self.g_proj(x).view(B, T, H, V)
        o = o.to(x.dtype)
        if self.o_norm is not None:
            o = self.o_norm(o, gate)
        elif gate is not None:
            o = F.silu(gate) * o
        return self.o_proj(o.reshape(B, T, H * V)), new

    @classmethod
    def from_fla(cls, module: nn.Module) -> ABCAttention:
        """Ours with the options and weights of fla's ``ABCAttention`` layer."""
        check_type(module, "ABCAttention", "fla")
        norm = getattr(module, "g_norm", None) if module.use_norm else None
        if norm is not None and norm.weight is None:
            raise ValueError("ABCAttention with elementwise_affine=False is not supported")
        if module.use_rope:
            require(module.rotary, base=10000.0, interleaved=False, scale_base=None)
        layer = cls(
            module.hidden_size, module.num_heads, module.head_v_dim, module.head_k_dim,
            num_slots=module.num_slots, short_conv=module.use_short_conv,
            conv_size=module.conv_size, rope=module.use_rope, input_gate=module.use_input_gate,
            output_gate=module.use_output_gate, use_norm=module.use_norm,
            clamp=(module.clamp_min, module.clamp_max), norm_eps=module.norm_eps,
        )  # fmt: skip
        weights = {
            "q_proj.weight": module.q_proj.weight, "k_proj.weight": module.k_proj.weight,
            "v_proj.weight": module.v_proj.weight, "s_proj.weight": module.s_proj.weight,
            "o_proj.weight": module.o_proj.weight,
        }  # fmt: skip
        if module.use_output_gate:
            weights["g_proj.weight"] = module.g_proj.weight
        if norm is not None:
            weights["o_norm.weight"] = norm.weight
        conv = _fla_conv(module)
        if conv is not None:
            weights["conv.weight"] = conv
        return load(layer, weights, module.q_proj.weight)
