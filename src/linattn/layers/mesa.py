"""MesaNet's layer (von Oswald et al. 2025) as fla 0.6.0's ``fla.layers.MesaNet`` defines it.

q = l2norm(silu(conv(q_proj x))), k = l2norm(silu(conv(k_proj x))), v = v_proj x (no
convolution), beta = sigmoid(b_proj x), g = logsigmoid(a_proj x), lambda = softplus(lambda_params)
+ lambda_lower_bound (one per head and key channel, starting at 1); the op ``linattn.ops.mesa``
(o_t = G_t^T (H_t + Diag(lambda))^{-1} q_t, fla's CG: 30 steps in training and prefill, 30 in a
decoding step); output ``o_proj(rmsnorm(o))``, or ``o_proj(rmsnorm(o) * silu(g_proj x))`` with
``use_output_gate``. Values have the keys' width (fla's layer: head_v_dim = head_dim).
``use_short_conv=False`` (fla's option, which its layer 0.6.0 ignores) drops the convolutions of q
and k and keeps their SiLU, as the recurrent mixers without a short convolution do.

Decoding: fla's step (``mesa_net_step``) starts conjugate gradients from Jacobi's guess, the
training forward from 0; after a fixed number of steps the two solves differ (by about 1e-3 with
fla's guard), so that fla's generation does not reproduce its own forward. ``decode_as_training``
decodes with the forward's solve over the cached states instead (the mixer of ``LMConfig``, whose
generation then equals the full forward to rounding).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.dtypes import compute_dtype
from linattn.layers.mixer import State, StateSpec, TokenMixer, resolve_head_dim, state_dtype
from linattn.layers.modules import GatedRMSNorm, ShortConvolution
from linattn.ops.checks import flag
from linattn.ops.functional import l2norm
from linattn.ops.mesa import CG_EPS, mesa_net, mesa_net_step

if TYPE_CHECKING:
    from linattn.models.config import LMConfig


class MesaNet(TokenMixer):
    """fla's MesaNet layer (module docstring). Args (fla's names): d_model (``hidden_size``),
    n_heads (``num_heads``), head_dim (default d_model // n_heads), conv_size (4),
    use_short_conv (True), use_output_gate (False), norm_eps (1e-5), lambda_lower_bound (0.25),
    max_cg_step_training (30), max_cg_step_decoding (30), chunk_size (64); and linattn's
    decode_as_training (False: fla's decoding step; the module docstring) and cg_eps (fla's
    guard in conjugate gradients' denominators, 1e-5; 0 gives textbook conjugate gradients, which
    reach the exact solve in head_dim steps: ``linattn.ops.mesa``)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        conv_size: int = 4,
        use_short_conv: bool = True,
        use_output_gate: bool = False,
        norm_eps: float = 1e-5,
        lambda_lower_bound: float = 0.25,
        max_cg_step_training: int = 30,
        max_cg_step_decoding: int = 30,
        chunk_size: int = 64,
        decode_as_training: bool = False,
        cg_eps: float = CG_EPS,
    ) -> None:
        super().__init__(d_model, chunk_size)
        head_dim = resolve_head_dim(d_model, n_heads, head_dim)
        if not lambda_lower_bound > 0:
            raise ValueError(f"lambda_lower_bound must be > 0, got {lambda_lower_bound!r}")
        self.n_heads, self.head_dim = n_heads, head_dim
        self.lambda_lower_bound = float(lambda_lower_bound)
        self.max_cg_step_training = max_cg_step_training
        self.max_cg_step_decoding = max_cg_step_decoding
        self.decode_as_training = flag("decode_as_training", decode_as_training)
        if not (isinstance(cg_eps, (int, float)) and not isinstance(cg_eps, bool) and cg_eps >= 0):
            raise ValueError(f"cg_eps must be a number >= 0, got {cg_eps!r}")
        self.cg_eps = float(cg_eps)
        width = n_heads * head_dim
        self.q_proj = nn.Linear(d_model, width, bias=False)
        self.k_proj = nn.Linear(d_model, width, bias=False)
        self.v_proj = nn.Linear(d_model, width, bias=False)
        self.a_proj = nn.Linear(d_model, n_heads, bias=True)
        self.b_proj = nn.Linear(d_model, n_heads, bias=True)
        start = math.log(math.expm1(1.0 - self.lambda_lower_bound))  # lambda starts at 1
        self.lambda_params = nn.Parameter(torch.full((width,), start))
        self.use_short_conv = flag("use_short_conv", use_short_conv)
        self.q_conv1d = self.k_conv1d = None
        if self.use_short_conv:
            self.q_conv1d = ShortConvolution(width, conv_size)
            self.k_conv1d = ShortConvolution(width, conv_size)
        self.g_proj = nn.Linear(d_model, width, bias=False) if use_output_gate else None
        self.o_norm = GatedRMSNorm(head_dim, "silu", eps=norm_eps)
        self.o_proj = nn.Linear(width, d_model, bias=False)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        H, K, W = self.n_heads, self.head_dim, self.n_heads * self.head_dim
        sd = state_dtype(dtype)
        spec = {"h_kk": ((batch_size, H, K, K), sd), "h_kv": ((batch_size, H, K, K), sd)}
        if self.q_conv1d is not None:
            conv = (batch_size, W, self.q_conv1d.kernel_size - 1)
            spec.update(conv_q=(conv, dtype), conv_k=(conv, dtype))
        return spec

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, K = self.n_heads, self.head_dim
        convs = {}
        if self.q_conv1d is None:
            q, k = F.silu(self.q_proj(x)), F.silu(self.k_proj(x))
        else:
            conv_q, conv_k = (None, None) if state is None else (state["conv_q"], state["conv_k"])
            q, convs["conv_q"] = self.q_conv1d(self.q_proj(x), conv_q)
            k, convs["conv_k"] = self.k_conv1d(self.k_proj(x), conv_k)
        q, k = l2norm(q.view(B, T, H, K)), l2norm(k.view(B, T, H, K))
        v = self.v_proj(x).view(B, T, H, K)
        cd = compute_dtype(x.dtype)  # float32, or float64 for a float64 model
        beta = torch.sigmoid(self.b_proj(x).to(cd))
        g = F.logsigmoid(self.a_proj(x).to(cd))
        lamb = (F.softplus(self.lambda_params.to(cd)) + self.lambda_lower_bound).view(H, K)
        new_state = None
        step = state is not None and self.pick_mode(T, state) == "recurrent"
        if step and not self.decode_as_training:
            h_kk, h_kv = state["h_kk"], state["h_kv"]
            outs = []
            for t in range(T):
                o_t, h_kk, h_kv = mesa_net_step(
                    q[:, t], k[:, t], v[:, t], g[:, t], lamb, beta[:, t], h_kk, h_kv,
                    max_cg_iterations=self.max_cg_step_decoding, cg_eps=self.cg_eps,
                )  # fmt: skip
                outs.append(o_t)
            o = torch.stack(outs, 1).to(v.dtype)
        else:
            o, h_kk, h_kv = mesa_net(
                q, k, v, g, beta, lamb, chunk_size=self.chunk_size,
                h_kk_init=None if state is None else state["h_kk"],
                h_kv_init=None if state is None else state["h_kv"],
                output_final_state=state is not None,
                max_cg_iterations=self.max_cg_step_training, cg_eps=self.cg_eps,
            )  # fmt: skip
        if state is not None:
            sd = state["h_kk"].dtype
            new_state = {"h_kk": h_kk.to(sd), "h_kv": h_kv.to(sd), **convs}
        gate = None if self.g_proj is None else self.g_proj(x).view(B, T, H, K)
        o = self.o_norm(o.to(x.dtype), gate)
        return self.o_proj(o.reshape(B, T, H * K)), new_state

    @classmethod
    def from_config(cls, config: LMConfig) -> MesaNet:
        """The layer of ``LMConfig.mixers`` name ``"mesa"``: the config's ``head_dim``,
        ``conv_size``, ``norm_eps``, and ``short_conv``, ``output_gate``, ``chunk_size`` where
        they are set (None: fla's defaults, the convolutions on, no output gate);
        ``decode_as_training``, so that generation equals the full forward. MesaNet's decay is
        fla's logsigmoid gate, which ``dt_init_range`` does not set."""
        kwargs = dict(head_dim=config.head_size, conv_size=config.conv_size,
                      norm_eps=config.norm_eps, decode_as_training=True)  # fmt: skip
        for ours, theirs in (("short_conv", "use_short_conv"), ("output_gate", "use_output_gate"),
                             ("chunk_size", "chunk_size")):  # fmt: skip
            if getattr(config, ours) is not None:
                kwargs[theirs] = getattr(config, ours)
        return cls(config.d_model, config.n_heads, **kwargs)

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> MesaNet:
        """Our layer with the weights of fla's ``fla.layers.MesaNet`` (its modules' names and
        shapes are ours: the state dict loads as it is; fla's short convolutions hold
        ``weight`` [C, 1, kernel] as ours)."""
        layer = cls(
            module.hidden_size, module.num_heads, module.head_dim, conv_size=module.conv_size,
            use_output_gate=module.use_output_gate, norm_eps=module.o_norm.eps,
            lambda_lower_bound=module.lambda_lower_bound,
            max_cg_step_training=module.max_cg_step_training,
            max_cg_step_decoding=module.max_cg_step_decoding, **kwargs,
        )  # fmt: skip
        layer.load_state_dict(module.state_dict())
        return layer
