"""``LinearAttention``: the additive memory, a feature map, an optional decay (spec 4, 5, 10).

    S_t = A_t S_{t-1} + phi(k_t) v_t^T,   o_t = S_t^T phi(q_t)  (/ phi(q_t)^T z_t when normalised)

with ``A_t = I`` (linear attention), ``alpha_t I`` (scalar decay, Mamba-2 / RetNet) or
``Diag(alpha_t)`` (per-channel decay, GLA). One class; the mixers of ``linattn.models`` configure
it:

    "linear"        phi = elu + 1, normalised, no decay                 (Katharopoulos et al., 2020)
    "taylor"        phi = 2nd-order Taylor features of exp, normalised  (Based, Arora et al., 2024)
    "scalar_decay"  phi = identity, per-head decay -exp(A_log) softplus (Mamba-2)
    "gla"           phi = identity, per-channel decay logsigmoid / 16   (GLA, Yang et al., 2024a)

``GatedLinearAttention`` is GLA as its paper and fla define the layer (keys d/2 wide, no short
convolution, no activation on q, k, v); the ``"gla"`` mixer builds it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn import features, ops
from linattn.layers._reference import check_type, load_fla, require
from linattn.layers.modules import DecayGate
from linattn.layers.recurrent import RecurrentMixer
from linattn.ops.checks import flag

FEATURE_MAPS = ("elu_plus_one", "relu", "taylor", "favor", "identity")
DECAYS = (None, "scalar", "channel", "gla")


class LinearAttention(RecurrentMixer):
    """Linear attention with a feature map and an optional decay.

    Args (besides those of ``RecurrentMixer``):
        feature_map: ``"elu_plus_one"``, ``"taylor"`` or ``"identity"``. The Taylor map of Based
            sends a K-vector to 1 + K + K^2 features with phi(q)^T phi(k) = 1 + s + s^2 / 2,
            s = q^T k / sqrt(K): the Taylor polynomial of exp(s), the softmax's kernel. Keep
            ``key_dim`` small with it (16 gives 273 features, the models' default). ``"favor"``
            is FAVOR+ (``features.PositiveRandomFeatures``): ``num_features`` positive random
            features, an unbiased estimate of the same kernel; the projection is a buffer,
            drawn from torch's global generator at construction.
        normalize: divide by phi(q_t)^T z_t, z_t = sum of phi(k_s) (the normaliser is one more
            column of the memory: S is [K', V + 1]). Needs a positive feature map.
        decay: ``None``, ``"scalar"`` (per head), ``"channel"`` (per key channel, KDA-style
            parametrisation) or ``"gla"`` (per key channel, GLA's logsigmoid / 16); see
            ``DecayGate``.
        decay_rank: rank of the low-rank gate projection of the per-channel decays (GLA: 16).
        num_features: number of random features of ``"favor"`` (default 2 * key_dim).
        dt_init_range: the initial step sizes of the scalar and per-channel decays
            (``DecayGate``'s ``dt_range``; Mamba-2's and fla's (1e-3, 1e-1)).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        key_dim: int | None = None,
        *,
        feature_map: str = "elu_plus_one",
        normalize: bool = False,
        decay: str | None = None,
        decay_rank: int = 16,
        num_features: int | None = None,
        dt_init_range: tuple[float, float] = (1e-3, 1e-1),
        **kwargs,
    ) -> None:
        super().__init__(d_model, n_heads, head_dim, key_dim, **kwargs)
        if self.num_v_heads != self.n_heads:
            raise ValueError(
                f"num_v_heads ({self.num_v_heads}) must equal n_heads ({n_heads}) in "
                f"{type(self).__name__}: grouped value heads are the delta-rule layers' "
                "(GatedDeltaNet, KimiDeltaAttention)"
            )
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {feature_map!r}")
        if decay not in DECAYS:
            raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}")
        normalize = flag("normalize", normalize)
        if normalize and feature_map == "identity":
            raise ValueError("normalize=True needs a positive feature map, not 'identity'")
        self.feature_map, self.normalize = feature_map, normalize
        self.favor = None
        if feature_map == "favor":
            r = 2 * self.key_dim if num_features is None else num_features
            seed = int(torch.randint(2**62, (), device="cpu"))  # torch.manual_seed fixes the draw
            self.favor = features.PositiveRandomFeatures(self.key_dim, r, seed=seed)
        if decay in ("channel", "gla") and self.feature_dim() != self.key_dim:
            raise ValueError(
                f"a per-channel decay needs one feature per key channel, but {feature_map!r} "
                f"gives {self.feature_dim()} features for key_dim = {self.key_dim}"
            )
        self.decay = (
            None
            if decay is None
            else DecayGate(
                d_model, n_heads, self.key_dim, decay, rank=decay_rank, dt_range=dt_init_range
            )
        )

    def feature_dim(self) -> int:
        """Features per head after phi: K, 1 + K + K^2 (Taylor) or num_features (FAVOR+)."""
        K = self.key_dim
        if self.favor is not None:
            return self.favor.num_features
        return 1 + K + K * K if self.feature_map == "taylor" else K

    def memory_shape(self) -> tuple[int, int]:
        return self.feature_dim(), self.head_dim + (1 if self.normalize else 0)

    def phi(self, x: Tensor) -> Tensor:
        """The feature map on [B, T, H, K] -> [B, T, H, feature_dim]."""
        if self.favor is not None:
            return self.favor(x)  # folds in the softmax's 1 / sqrt(K)
        if self.feature_map == "taylor":
            return features.taylor_exp(x)  # folds in the softmax's 1 / sqrt(K)
        return getattr(features, self.feature_map)(x)  # elu_plus_one, relu, identity

    def recurrence(self, x, q, k, v, mode, S, keep):
        g = None if self.decay is None else self.decay(x)  # [B, T, H] or [B, T, H, K]
        # With a feature map the scale is inside phi (Taylor, FAVOR+) or cancels (normalised);
        # identity features (the decays) take the usual 1/sqrt(K).
        scale = None if self.feature_map == "identity" else 1.0
        return ops.linear_attention(
            self.phi(q),
            self.phi(k),
            v,
            g,
            normalize=self.normalize,
            scale=scale,
            mode=mode,
            chunk_size=self.chunk_size,
            initial_state=S,
            output_final_state=keep,
        )


class GatedLinearAttention(LinearAttention):
    """GLA (Yang et al., 2024a, "Gated Linear Attention Transformers with Hardware-Efficient
    Training") as the paper and fla's ``GatedLinearAttention`` layer define it:

        q, k, v = W_q x, W_k x, W_v x          (no activation; no short convolution by default)
        g_t = logsigmoid(W_2 W_1 x_t + b) / 16 (low-rank gate, rank 16; fla's normaliser 16)
        S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t / sqrt(K)
        y = W_o (rmsnorm(o) * weight * silu(W_r x))   (per head; output gate on)

    Args (besides those of ``RecurrentMixer``): ``expand_k``, ``expand_v``: the key and value
    widths, ``expand_k * d_model`` and ``expand_v * d_model`` over the heads (fla's names;
    0.5 and 1 as in the paper), unless ``key_dim`` / ``head_dim`` give them per head;
    ``gate_low_rank_dim``: the gate's rank. ``short_conv=True`` adds the convolution (+ SiLU)
    of fla's ``use_short_conv``.
    """

    silu_without_conv = False  # fla's GLA feeds the projections to the op as they are

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        key_dim: int | None = None,
        *,
        expand_k: float = 0.5,
        expand_v: float = 1.0,
        gate_low_rank_dim: int = 16,
        short_conv: bool = False,
        norm_eps: float = 1e-5,
        **kwargs,
    ) -> None:
        if head_dim is None:
            head_dim = _per_head("expand_v", d_model, n_heads, expand_v)
        if key_dim is None:
            key_dim = _per_head("expand_k", d_model, n_heads, expand_k)
        super().__init__(
            d_model,
            n_heads,
            head_dim,
            key_dim,
            feature_map="identity",
            decay="gla",
            decay_rank=gate_low_rank_dim,
            short_conv=short_conv,
            norm_eps=norm_eps,
            **kwargs,
        )

    @classmethod
    def from_fla(cls, module: torch.nn.Module) -> GatedLinearAttention:
        """Our GLA with the options and weights of fla's ``GatedLinearAttention`` layer."""
        check_type(module, "GatedLinearAttention", "fla")
        require(module, num_kv_groups=1, feature_map_fn=None, clamp_min=None)
        require(module, gate_logit_normalizer=16)
        if module.use_output_gate:
            require(module, fuse_norm_and_gate=True)  # gate_fn 'swish', norm then gate
        norm = module.g_norm_swish_gate if module.use_output_gate else module.g_norm
        if norm.weight is None:
            raise ValueError("GatedLinearAttention with elementwise_affine=False is not supported")
        H = module.num_heads
        layer = cls(
            module.hidden_size,
            H,
            module.head_v_dim,
            module.head_k_dim,
            gate_low_rank_dim=module.gk_proj[0].out_features,
            short_conv=module.use_short_conv,
            conv_size=module.conv_size,
            output_gate=module.use_output_gate,
            norm_eps=norm.eps,
        )
        weights = {
            "decay.a_proj.0.weight": module.gk_proj[0].weight,
            "decay.a_proj.1.weight": module.gk_proj[1].weight,
            "decay.a_proj.1.bias": module.gk_proj[1].bias,
            "o_norm.weight": norm.weight,
        }
        return load_fla(layer, module, weights, gate=module.use_output_gate)


def _per_head(name: str, d_model: int, n_heads: int, expand: float) -> int:
    """``expand * d_model / n_heads``, which must be a positive integer."""
    width = expand * d_model / n_heads
    if not (width >= 1 and float(width).is_integer()):
        raise ValueError(
            f"{name} * d_model / n_heads must be a positive integer, got {expand} * {d_model} / "
            f"{n_heads} = {width}"
        )
    return int(width)
