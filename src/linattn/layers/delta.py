"""The delta-rule mixers: DeltaNet, Gated DeltaNet, Kimi Delta Attention (spec sections 7, 8, 10).

    S <- Diag(alpha_t) S                        (the decay, when there is one)
    S <- S + beta_t k_t (v_t - S^T k_t)^T       (the delta rule: write only the difference)
    o_t = S^T q_t / sqrt(K)

    DeltaNet       A_t = I - beta_t k_t k_t^T                 (Schlag 2021; Yang 2024b)
    GatedDeltaNet  A_t = alpha_t (I - beta_t k_t k_t^T)       (Yang, Kautz and Hatamizadeh, 2025)
    KDA            A_t = (I - beta_t k_t k_t^T) Diag(alpha_t) (Kimi Team, 2025)

and the write is ``w_t = beta_t v_t`` for all three. What the papers build around it: q and k
L2-normalised per head as fla does, ``x / sqrt(|x|^2 + 1e-6)`` (so ``I - beta k k^T`` has
eigenvalues 1 and about 1 - beta, spec 7.2), ``beta_t = sigmoid(b_proj x_t)`` in (0, 1), or in
(0, 2) with ``allow_neg_eigval`` (the eigenvalue 1 - beta then reaches -1; Grazzi et al., 2025).
With grouped value heads (``num_v_heads`` = G H) each query/key head is repeated for its G value
heads; beta, the decays and the memory are per value head.
"""

from __future__ import annotations

from torch import Tensor, nn

from linattn import ops
from linattn.layers._reference import check_type, load_fla, require
from linattn.layers.mixer import resolve_head_dim
from linattn.layers.modules import DecayGate
from linattn.layers.recurrent import RecurrentMixer
from linattn.ops.checks import flag
from linattn.ops.functional import l2norm, write_strength


class DeltaNet(RecurrentMixer):
    """The delta rule, no decay, as fla's ``DeltaNet`` layer defines it (Yang et al., 2024b):
    short convolution + SiLU on q, k, v (on), q and k L2-normalised, ``beta = sigmoid(b_proj x)``,
    per-head RMSNorm of the output (eps 1e-5) and no output gate (fla's ``use_gate=False``).

    Args: those of ``RecurrentMixer``, plus ``allow_neg_eigval`` and, for the gated subclasses,
    ``decay_rank`` and ``dt_init_range`` (``DecayGate``'s ``dt_range``: fla's (1e-3, 1e-1)).
    (Only DeltaNet itself takes fla's defaults ``output_gate=False``, ``norm_eps=1e-5``; its
    gated subclasses keep ``RecurrentMixer``'s.)
    """

    decay_kind: str | None = None
    A_init_range: tuple[float, float] = (1.0, 16.0)

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        key_dim: int | None = None,
        *,
        allow_neg_eigval: bool = False,
        decay_rank: int | None = None,
        dt_init_range: tuple[float, float] = (1e-3, 1e-1),
        **kwargs,
    ) -> None:
        if type(self) is DeltaNet:  # fla's DeltaNet defaults (the subclasses keep their own)
            kwargs.setdefault("output_gate", False)
            kwargs.setdefault("norm_eps", 1e-5)
        super().__init__(d_model, n_heads, head_dim, key_dim, **kwargs)
        self.allow_neg_eigval = flag("allow_neg_eigval", allow_neg_eigval)
        HV = self.num_v_heads  # beta and the decays are per value head (fla's GVA)
        self.b_proj = nn.Linear(d_model, self.writes * HV, bias=False)  # a beta per write
        self.decay = None
        if self.decay_kind is not None:
            rank = self.head_dim if decay_rank is None else decay_rank
            self.decay = DecayGate(
                d_model,
                HV,
                self.key_dim,
                self.decay_kind,
                rank=rank,
                A_range=self.A_init_range,
                dt_range=dt_init_range,
            )

    def beta(self, x: Tensor) -> Tensor:
        """The write strength: x [B, T, d_model] -> sigmoid(b_proj x) [B, T, writes HV], times 2
        with ``allow_neg_eigval``."""
        return write_strength(self.b_proj(x), self.allow_neg_eigval)

    def recurrence(self, x, q, k, v, mode, S, keep):
        # q, k [B, T, H, K] with v [B, T, HV, V]: the op reads grouped value heads in place
        q, k = l2norm(q), l2norm(k)
        beta = self.beta(x)  # [B, T, HV]
        g = None if self.decay is None else self.decay(x)  # [B, T, HV] or [B, T, HV, K]
        return ops.delta_rule(
            q,
            k,
            v,
            beta,
            g,
            mode=mode,
            chunk_size=self.chunk_size,
            initial_state=S,
            output_final_state=keep,
        )

    @classmethod
    def from_fla(cls, module: nn.Module) -> DeltaNet:
        """Our DeltaNet with the options and weights of fla's ``DeltaNet`` layer (SiLU and L2
        norm on q and k, beta from ``b_proj``; refused otherwise)."""
        if cls is not DeltaNet:
            raise TypeError(f"{cls.__name__}.from_fla is not defined; use DeltaNet.from_fla")
        check_type(module, "DeltaNet", "fla")
        require(module, qk_activation="silu", qk_norm="l2", use_beta=True)
        H = module.num_heads
        layer = cls(
            module.hidden_size,
            H,
            module.head_v_dim,
            module.head_k_dim,
            allow_neg_eigval=module.allow_neg_eigval,
            short_conv=module.use_short_conv,
            conv_size=module.conv_size,
            output_gate=module.use_gate,
            norm_eps=module.o_norm.eps,
        )
        weights = {"b_proj.weight": module.b_proj.weight, "o_norm.weight": module.o_norm.weight}
        return load_fla(layer, module, weights, gate=module.use_gate)


def _value_dim(head_dim: int, expand_v: float) -> int:
    """fla's ``head_v_dim = head_dim * expand_v``, which must be an integer >= 1."""
    if isinstance(expand_v, bool) or not isinstance(expand_v, (int, float)) or not expand_v > 0:
        raise ValueError(f"expand_v must be a number > 0, got {expand_v!r}")
    V = round(head_dim * expand_v)
    if V < 1 or abs(V - head_dim * expand_v) > 1e-9:
        raise ValueError(
            f"head_dim * expand_v must be a whole number >= 1, got {head_dim} * {expand_v}"
        )
    return V


class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet (Yang, Kautz and Hatamizadeh, 2025) as fla 0.6.0 defines the layer.

    ``S <- alpha_t S; S <- S + beta_t k_t (v_t - S^T k_t)^T``, ``alpha_t = exp(g_t)`` with one
    decay per value head, ``g = -exp(A_log) softplus(a_proj x + dt_bias)``, ``A ~ U(0, 16)`` and
    ``dt_bias`` in Mamba-2's range (``DecayGate``); ``beta = sigmoid(b_proj x)``; q, k
    L2-normalised; output ``o_proj(rmsnorm(o) * silu(g_proj x))``.

    Args (fla's names):
        d_model: width of the residual stream (fla's ``hidden_size``).
        n_heads: query/key heads H (``num_heads``).
        head_dim: query/key dimension K per head (default ``d_model // n_heads``).
        expand_v: value dimension per head V = ``head_dim * expand_v`` (default 2, the paper's
            and fla's: values twice as wide as keys).
        num_v_heads: value heads HV, a multiple of H (default H); G = HV / H value heads share
            each query/key head (Qwen3-Next: 16 key heads, 32 value heads).
        **kwargs: those of ``DeltaNet`` / ``RecurrentMixer`` (``short_conv``, ``conv_size``,
            ``output_gate`` (fla's ``use_gate``), ``allow_neg_eigval``, ``norm_eps`` (fla's
            default 1e-5), ``chunk_size``).
    """

    decay_kind = "scalar"
    A_init_range = (0.0, 16.0)

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        expand_v: float = 2.0,
        num_v_heads: int | None = None,
        **kwargs,
    ) -> None:
        head_dim = resolve_head_dim(d_model, n_heads, head_dim)
        kwargs.setdefault("norm_eps", 1e-5)
        V = _value_dim(head_dim, expand_v)
        super().__init__(d_model, n_heads, V, head_dim, num_v_heads=num_v_heads, **kwargs)
        self.expand_v = expand_v

    @classmethod
    def from_transformers(cls, module: nn.Module, **kwargs) -> GatedDeltaNet:
        """Our layer with the weights of transformers' ``Qwen3NextGatedDeltaNet`` (see
        ``linattn.layers.convert``)."""
        from linattn.layers.convert import gated_deltanet_from_qwen3_next

        return gated_deltanet_from_qwen3_next(cls, module, **kwargs)

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> GatedDeltaNet:
        """Our layer with the weights of fla's ``fla.layers.GatedDeltaNet`` (see
        ``linattn.layers.convert``)."""
        from linattn.layers.convert import gated_deltanet_from_fla

        return gated_deltanet_from_fla(cls, module, **kwargs)


class KimiDeltaAttention(DeltaNet):
    """Kimi Delta Attention (Kimi Team, 2025) as fla 0.6.0 and transformers' Kimi-Linear define it.

    ``S <- Diag(alpha_t) S; S <- S + beta_t k_t (v_t - S^T k_t)^T`` with one decay per key
    channel, ``g = -exp(A_log) softplus(f_proj x + dt_bias)``, ``f_proj`` low-rank (d_model -> V
    -> HV*K), ``A_log`` per value head (``A ~ U(1, 16)``), ``dt_bias`` per channel (Mamba-2's
    range, as both references); ``beta = sigmoid(b_proj x)``; q, k L2-normalised; output
    ``o_proj(rmsnorm(o) * sigmoid(g_proj x))`` with ``g_proj`` low-rank (d_model -> V -> HV*V).

    Args (fla's names): ``d_model``, ``n_heads``, ``head_dim`` (K, default d_model // n_heads),
    ``expand_v`` (V = K * expand_v, default 1), ``num_v_heads`` (default H), and
    ``gate_bias``: a bias on the output gate's second projection (default False, as
    transformers' port of the released checkpoint, ``g_b_proj``; fla's layer has one: True),
    plus the keywords of ``DeltaNet`` (``norm_eps`` default 1e-5, as both).
    """

    decay_kind = "channel"

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        expand_v: float = 1.0,
        num_v_heads: int | None = None,
        **kwargs,
    ) -> None:
        head_dim = resolve_head_dim(d_model, n_heads, head_dim)
        V = _value_dim(head_dim, expand_v)
        kwargs.setdefault("gate_activation", "sigmoid")
        kwargs.setdefault("gate_rank", V)
        kwargs.setdefault("norm_eps", 1e-5)
        super().__init__(d_model, n_heads, V, head_dim, num_v_heads=num_v_heads, **kwargs)
        self.expand_v = expand_v

    @classmethod
    def from_transformers(cls, module: nn.Module, **kwargs) -> KimiDeltaAttention:
        """Our layer with the weights of transformers' ``KimiLinearDeltaAttention`` (see
        ``linattn.layers.convert``)."""
        from linattn.layers.convert import kda_from_kimi_linear

        return kda_from_kimi_linear(cls, module, **kwargs)

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> KimiDeltaAttention:
        """Our layer with the weights of fla's ``fla.layers.KimiDeltaAttention`` (see
        ``linattn.layers.convert``)."""
        from linattn.layers.convert import kda_from_fla

        return kda_from_fla(cls, module, **kwargs)
