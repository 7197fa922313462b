"""``Based`` and ``ReBased``: normalised linear attention with a polynomial kernel, as fla 0.6.0's
``BasedLinearAttention`` and ``ReBasedLinearAttention`` define the layers (their default,
"parallel", mode).

Based (Arora et al. 2024, "Simple linear attention language models balance the recall-throughput
tradeoff", section 3.1): the second-order Taylor expansion of exp,

    q, k = W_q x, W_k x  [F per head],  v = W_v x  [d_model / H per head]
    o_t = sum_{s <= t} f(a_ts) v_s / (sum_{s <= t} f(a_ts) + 1e-6),   a_ts = q_t^T k_s / sqrt(F)
    f(a) = 1 + a + a^2 / 2,   y = W_o o

ReBased (Aksenov et al. 2024, "Linear Transformers with Learnable Kernel Functions are Better
In-Context Models", section 4): the same with q, k layer-normalised with a learned gain and shift
(gamma, beta; epsilon 1e-5), the kernel f(a) = a^2 and 1e-5 for the 1e-6.

Each is linear attention on a feature map phi with phi(q)^T phi(k) = f(a) (Based: ``linattn.
features.taylor_exp``, 1 + F + F^2 wide; ReBased: ``linattn.compat.rebased.squared_features``, F^2
wide; spec sections 3 and 4; registry entries "based" and "rebased"). A training or prefill call
without a state runs ``linattn.compat.based.polynomial_attention`` (f from the F-wide scores
inside a chunk); with a state, ``linattn.ops.linear_attention`` on the features and the values
with a column of ones appended, whose memory S [H, D', V + 1] (the normaliser its last column) is
the decoding state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.compat.based import TAYLOR, kernel_attention, polynomial_attention
from linattn.compat.rebased import SQUARE, squared_features
from linattn.dtypes import compute_dtype
from linattn.features import taylor_exp
from linattn.layers._reference import check_type, load, require
from linattn.layers.mixer import (
    State,
    StateSpec,
    TokenMixer,
    check_positive,
    resolve_head_dim,
    state_dtype,
)

if TYPE_CHECKING:
    from linattn.models.config import LMConfig


class _KernelAttention(TokenMixer):
    """What Based and ReBased share: the projections, the state, the forms (module docstring)."""

    coefficients: tuple[float, float, float]  # f(a) = c0 + c1 a + c2 a^2

    def __init__(
        self, d_model: int, n_heads: int, feature_dim: int, eps: float, chunk_size: int
    ) -> None:
        super().__init__(d_model, chunk_size)
        check_positive("feature_dim", feature_dim)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
            raise ValueError(f"eps must be a real number >= 0, got {eps!r}")
        V = resolve_head_dim(d_model, n_heads, None)
        self.n_heads, self.feature_dim, self.head_dim, self.eps = n_heads, feature_dim, V, eps
        self.q_proj = nn.Linear(d_model, n_heads * feature_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_heads * feature_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_heads * V, bias=False)
        self.o_proj = nn.Linear(n_heads * V, d_model, bias=False)

    @classmethod
    def from_config(cls, config: LMConfig) -> _KernelAttention:
        """The mixer of ``LMConfig.mixers`` (``"based"``, ``"rebased"``): the config's
        ``taylor_dim`` as the feature dimension F (before the map) and ``chunk_size``."""
        kwargs = {} if config.chunk_size is None else {"chunk_size": config.chunk_size}
        return cls(config.d_model, config.n_heads, feature_dim=config.taylor_dim, **kwargs)

    def feature_width(self) -> int:
        """D', the width of phi."""
        raise NotImplementedError

    def features(self, x: Tensor) -> Tensor:
        """phi(x) [..., D'] of the prepared q or k [..., F] (scale 1 / sqrt(F) folded in)."""
        raise NotImplementedError

    def prepare(self, x: Tensor) -> Tensor:
        """q or k [B, T, H, F] as the kernel reads them (ReBased: layer-normalised)."""
        return x

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``S``: [B, H, D', V + 1], sum_s phi(k_s) [v_s, 1]^T, float32 (float64 for a float64
        model)."""
        shape = (batch_size, self.n_heads, self.feature_width(), self.head_dim + 1)
        return {"S": (shape, state_dtype(dtype))}

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, Fd, V = self.n_heads, self.feature_dim, self.head_dim
        cd = compute_dtype(x.dtype)
        q = self.prepare(self.q_proj(x).view(B, T, H, Fd).to(cd))
        k = self.prepare(self.k_proj(x).view(B, T, H, Fd).to(cd))
        v = self.v_proj(x).view(B, T, H, V).to(cd)
        mode = self.pick_mode(T, state)
        new = None
        if state is None and mode == "chunk":
            o, _ = polynomial_attention(
                q, k, v, self.coefficients, Fd**-0.5, self.eps, True, self.chunk_size
            )
        elif state is None:
            o, _ = kernel_attention(self.features(q), self.features(k), v, self.eps, True, mode,
                                    self.chunk_size)  # fmt: skip
        else:
            out, S = ops.linear_attention(
                self.features(q), self.features(k), torch.cat([v, torch.ones_like(v[..., :1])], -1),
                scale=1.0, mode=mode, chunk_size=self.chunk_size,
                initial_state=state["S"].to(cd), output_final_state=True,
            )  # fmt: skip
            o = out[..., :V] / (out[..., V:] + self.eps)
            new = {"S": S.to(state_dtype(x.dtype))}
        return self.o_proj(o.reshape(B, T, H * V).to(x.dtype)), new


class Based(_KernelAttention):
    """Based (the module docstring). Args: ``d_model``, ``n_heads``; ``feature_dim``: F, the
    query/key width per head before the feature map (fla's 16); ``chunk_size``. Parameters are
    named as fla's (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``)."""

    coefficients = TAYLOR

    def __init__(
        self, d_model: int, n_heads: int, *, feature_dim: int = 16, chunk_size: int = 64
    ) -> None:
        super().__init__(d_model, n_heads, feature_dim, 1e-6, chunk_size)

    def feature_width(self) -> int:
        return 1 + self.feature_dim + self.feature_dim**2

    def features(self, x: Tensor) -> Tensor:
        return taylor_exp(x, self.feature_dim**-0.5)

    @classmethod
    def from_fla(cls, module: nn.Module) -> Based:
        """Our Based with the options and weights of fla's ``BasedLinearAttention``."""
        check_type(module, "BasedLinearAttention", "fla")
        require(module, causal=True, feature_name="taylor_exp", mode="parallel")
        layer = cls(module.hidden_size, module.num_heads, feature_dim=module.feature_dim)
        weights = {f"{n}.weight": getattr(module, n).weight
                   for n in ("q_proj", "k_proj", "v_proj", "o_proj")}  # fmt: skip
        return load(layer, weights, module.q_proj.weight)


class ReBased(_KernelAttention):
    """ReBased (the module docstring). Args: ``d_model``, ``n_heads``; ``feature_dim``: F (fla's
    16); ``eps``: the normaliser's epsilon (fla's 1e-5); ``norm_eps``: the layer norm's (1e-5,
    fla's fused layer norm's); ``chunk_size``. Parameters: fla's projections and the feature
    map's ``gamma``, ``beta`` [F]."""

    coefficients = SQUARE

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        feature_dim: int = 16,
        eps: float = 1e-5,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, n_heads, feature_dim, eps, chunk_size)
        self.norm_eps = norm_eps
        self.gamma = nn.Parameter(torch.ones(feature_dim))
        self.beta = nn.Parameter(torch.zeros(feature_dim))

    def prepare(self, x: Tensor) -> Tensor:
        w, b = self.gamma.to(x.dtype), self.beta.to(x.dtype)
        return F.layer_norm(x, (self.feature_dim,), w, b, self.norm_eps)

    def feature_width(self) -> int:
        return self.feature_dim**2

    def features(self, x: Tensor) -> Tensor:
        return squared_features(x, self.feature_dim**-0.5)

    @classmethod
    def from_fla(cls, module: nn.Module) -> ReBased:
        """Our ReBased with the options and weights of fla's ``ReBasedLinearAttention`` (its
        feature map with gain, shift and normalisation, fla's defaults)."""
        check_type(module, "ReBasedLinearAttention", "fla")
        require(module, causal=True, mode="parallel", use_gamma=True, use_beta=True,
                normalize=True)  # fmt: skip
        if module.num_key_value_heads != module.num_heads:
            raise ValueError("ReBasedLinearAttention: num_key_value_heads must equal num_heads")
        layer = cls(module.hidden_size, module.num_heads, feature_dim=module.feature_dim,
                    eps=module.eps)  # fmt: skip
        weights = {f"{n}.weight": getattr(module, n).weight
                   for n in ("q_proj", "k_proj", "v_proj", "o_proj")}  # fmt: skip
        weights["gamma"] = module.feature_map.gamma
        weights["beta"] = module.feature_map.beta
        return load(layer, weights, module.q_proj.weight)
