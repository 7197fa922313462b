"""Momentum DeltaNet's layer (arXiv:2605.05838), as fla 0.6.0's ``fla.layers.MomentumDeltaNet``
defines it, on ``linattn.ops.momentum_delta_rule``:

    log_alpha = -exp(A_log) softplus(a_proj x + dt_bias),  log_mu = -exp(Mu_log) softplus(m_proj x
    + mu_bias) (clamped at ``min_log_mu``),  eta = 1 + tanh(e_proj x / tau),  beta = sigmoid(b_proj
    x);  theta = arctan(eta exp(log_factor)):  beta <- sin^2(theta) beta,  alpha <- cos^2(theta)
    alpha;  q <- q - exp(D_log) k (``use_output_correction``);  the read key p = k

with the short convolution, SiLU and L2-normalised q, k (the op's), and Gated DeltaNet's output
norm and gate. The layer keeps two states, the memory S and the momentum M, [B, HV, K, V] each
(``extra_states``). A_log, Mu_log, log_factor and D_log are per query/key head, the rest per
value head (grouped value heads repeat q and k, as fla's layer).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.layers._reference import check_type, fla_short_conv, load, require
from linattn.layers.mixer import resolve_head_dim
from linattn.layers.recurrent import RecurrentMixer
from linattn.ops.checks import flag
from linattn.ops.momentum_delta_rule import momentum_delta_rule


def _log_uniform(n: int, low: float, high: float) -> Tensor:
    return torch.log(torch.empty(n).uniform_(low, high))


def _inverse_softplus_dt(n: int) -> Tensor:
    dt = torch.exp(torch.rand(n) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
    dt = dt.clamp(min=1e-4)
    return dt + torch.log(-torch.expm1(-dt))


class MomentumDeltaNet(RecurrentMixer):
    """Momentum DeltaNet as fla 0.6.0's ``MomentumDeltaNet`` layer (the module docstring).

    Args (fla's names where they differ): d_model (``hidden_size``), n_heads (``num_heads``),
    head_dim (K, default d_model // n_heads), ``expand_v`` (V = K expand_v, default 2),
    ``num_v_heads``, ``use_beta``, ``allow_neg_eigval``, ``use_p_times_alpha``,
    ``use_output_correction``, ``min_log_mu`` (-2; None: no clamp), ``tau_factor`` (tau =
    sqrt(d_model / tau_factor)), and ``RecurrentMixer``'s keywords (``short_conv``,
    ``conv_size``, ``output_gate`` (fla's ``use_gate``), ``norm_eps`` 1e-5, ``chunk_size``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        expand_v: float = 2.0,
        num_v_heads: int | None = None,
        use_beta: bool = True,
        allow_neg_eigval: bool = False,
        use_p_times_alpha: bool = True,
        use_output_correction: bool = True,
        min_log_mu: float | None = -2.0,
        tau_factor: float = 1,
        **kwargs,
    ) -> None:
        K = resolve_head_dim(d_model, n_heads, head_dim)
        V = round(K * expand_v)
        if V < 1 or abs(V - K * expand_v) > 1e-9:
            raise ValueError(
                f"head_dim * expand_v must be a whole number >= 1, got {K} * {expand_v}"
            )
        if min_log_mu is not None and not (
            isinstance(min_log_mu, (int, float)) and min_log_mu <= 0
        ):
            raise ValueError(f"min_log_mu must be None or a number <= 0, got {min_log_mu!r}")
        if (
            isinstance(tau_factor, bool)
            or not isinstance(tau_factor, (int, float))
            or tau_factor <= 0
        ):
            raise ValueError(f"tau_factor must be a number > 0, got {tau_factor!r}")
        kwargs.setdefault("norm_eps", 1e-5)
        super().__init__(d_model, n_heads, V, K, num_v_heads=num_v_heads, **kwargs)
        H, HV = n_heads, self.num_v_heads
        self.use_beta = flag("use_beta", use_beta)
        self.allow_neg_eigval = flag("allow_neg_eigval", allow_neg_eigval)
        self.use_p_times_alpha = flag("use_p_times_alpha", use_p_times_alpha)
        self.min_log_mu = min_log_mu
        self.tau = math.sqrt(d_model / tau_factor)
        for name in ("a_proj", "b_proj", "m_proj", "e_proj"):
            setattr(self, name, nn.Linear(d_model, HV, bias=False))
        self.A_log = nn.Parameter(_log_uniform(H, 0, 16))
        self.Mu_log = nn.Parameter(_log_uniform(H, 0, 16))
        dt = _inverse_softplus_dt(HV)
        self.dt_bias = nn.Parameter(dt.clone())
        self.mu_bias = nn.Parameter(dt.clone())
        self.log_factor = nn.Parameter(_log_uniform(H, 0, 4))
        self.D_log = None
        if flag("use_output_correction", use_output_correction):
            self.D_log = nn.Parameter(_log_uniform(H, 0, 1))

    def extra_states(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        return {"M": (batch_size, self.num_v_heads, self.key_dim, self.head_dim)}

    def recurrence(self, x: Tensor, q, k, v, mode, S, keep):
        G = self.num_v_heads // self.n_heads
        q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)

        def per_value_head(p: Tensor) -> Tensor:
            return p.to(x.dtype).repeat_interleave(G)

        log_mu = -per_value_head(self.Mu_log).exp() * F.softplus(self.m_proj(x) + self.mu_bias)
        log_alpha = -per_value_head(self.A_log).exp() * F.softplus(self.a_proj(x) + self.dt_bias)
        eta = torch.tanh(self.e_proj(x) / self.tau) + 1
        b = self.b_proj(x)
        beta = torch.sigmoid(b) if self.use_beta else torch.ones_like(b)
        theta = torch.arctan(eta * per_value_head(self.log_factor).exp())
        beta = torch.sin(theta) ** 2 * beta
        log_alpha = torch.log(torch.cos(theta) ** 2) + log_alpha
        if self.min_log_mu is not None:
            log_mu = log_mu.clamp_min(self.min_log_mu)
        if self.allow_neg_eigval:
            beta = beta * 2.0
        if self.D_log is not None:
            q = q - per_value_head(self.D_log).exp()[:, None] * k
        initial = None if S is None else torch.stack([S["S"], S["M"]])
        o, state = momentum_delta_rule(
            q, k, v, k, log_alpha, log_mu, beta, eta, mode=mode, chunk_size=self.chunk_size,
            initial_state=initial, output_final_state=keep, use_qk_l2norm=True,
            use_p_times_alpha=self.use_p_times_alpha,
        )  # fmt: skip
        return o, ({"S": state[0], "M": state[1]} if keep else None)

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> MomentumDeltaNet:
        """Our layer with the options and weights of fla's ``MomentumDeltaNet`` layer (SiLU and
        L2 norm on q and k; refused otherwise)."""
        check_type(module, "MomentumDeltaNet", "fla")
        require(module, qk_activation="silu", qk_norm="l2")
        layer = cls(
            module.hidden_size, module.num_heads, module.head_k_dim,
            expand_v=module.head_v_dim / module.head_k_dim, num_v_heads=module.num_v_heads,
            use_beta=module.use_beta, allow_neg_eigval=module.allow_neg_eigval,
            use_p_times_alpha=module.use_p_times_alpha,
            use_output_correction=module.use_output_correction, min_log_mu=module.min_log_mu,
            tau_factor=module.tau_factor, short_conv=module.use_short_conv,
            conv_size=getattr(module, "conv_size", 4), output_gate=module.use_gate,
            norm_eps=module.o_norm.eps, **kwargs,
        )  # fmt: skip
        names = ["q_proj", "k_proj", "v_proj", "o_proj", "a_proj", "b_proj", "m_proj", "e_proj"]
        names += ["g_proj"] if module.use_gate else []
        weights = {f"{n}.weight": getattr(module, n).weight for n in names}
        weights["o_norm.weight"] = module.o_norm.weight
        params = ["A_log", "Mu_log", "dt_bias", "mu_bias", "log_factor"]
        params += ["D_log"] if module.use_output_correction else []
        weights.update({n: getattr(module, n) for n in params})
        conv = fla_short_conv(module)
        if conv is not None:
            weights["conv.weight"] = conv
        return load(layer, weights, module.q_proj.weight)
