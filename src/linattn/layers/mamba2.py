"""``Mamba2``: the Mamba-2 mixer (Dao and Gu, 2024, "Transformers are SSMs"), spec section 10.

    [z | x B C | dt] = in_proj(u)                        (one projection, no bias by default)
    x, B, C = silu(conv(x B C) + b)                      (causal depthwise conv, kernel d_conv)
    dt_t = softplus(dt_t + dt_bias),  A = -exp(A_log)    (one step size and one rate per head)
    S_t = exp(dt_t A) S_{t-1} + B_t (dt_t x_t)^T         (the SSD: S is [N, P] per head)
    y_t = S_t^T C_t + D x_t                              (the D skip)
    out = out_proj(rmsnorm(y * silu(z)))                 (gate, then norm: norm_before_gate=False)

The recurrence is linattn's scalar-decay linear attention (``alpha_t I`` in the mechanism table
of docs/design.md) with q = C, k = B, v = dt * x, g = dt * A and scale 1 (no 1/sqrt(N)); B and C
are shared by the
``H / n_groups`` heads of a group, and the norm runs over each group's ``d_inner / n_groups``
channels. Options, defaults and initialisation follow the reference implementation
(``mamba_ssm.modules.mamba2.Mamba2``; fla's ``Mamba2`` layer, transformers' ``Mamba2Mixer``):
``A ~ U(A_init_range)``, ``dt`` log-uniform in [dt_min, dt_max] (floored at dt_init_floor) with
``dt_bias = softplus^{-1}(dt)``, ``D = 1``. (transformers initialises ``A_log`` to ``log(1..H)``
instead; ``from_transformers`` copies whatever the module holds.)

Generation state: ``S`` [B, H, N, P] (fp32, fp64 for fp64 models; transformers and mamba_ssm store
its transpose [B, H, P, N]) and ``conv``, the last ``d_conv - 1`` inputs of the convolution,
[B, d_inner + 2 G N, d_conv - 1].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers.mixer import State, StateSpec, TokenMixer, check_positive, state_dtype
from linattn.layers.modules import ShortConvolution
from linattn.ops import functional
from linattn.ops.checks import flag


class GroupRMSNormGated(nn.Module):
    """Mamba-2's gated RMSNorm over groups of ``group_size`` channels of y: [..., d].

    ``norm_before_gate=False`` (Mamba-2): ``rmsnorm_g(y * silu(z)) * weight``; True:
    ``rmsnorm_g(y) * weight * silu(z)``. ``rmsnorm_g`` normalises each group of channels on its own.
    """

    def __init__(
        self, d: int, group_size: int, eps: float = 1e-5, norm_before_gate: bool = False
    ) -> None:
        super().__init__()
        if d % group_size:
            raise ValueError(f"group_size ({group_size}) must divide the width ({d})")
        self.weight = nn.Parameter(torch.ones(d))
        self.group_size, self.eps = group_size, eps
        self.norm_before_gate = flag("norm_before_gate", norm_before_gate)

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        if not self.norm_before_gate:
            y = y * F.silu(z)
        shape = y.shape
        groups = shape[-1] // self.group_size
        y = y.reshape(*shape[:-1], groups, self.group_size)  # [..., d] -> [..., groups, size]
        y = F.rms_norm(y, (self.group_size,), eps=self.eps).reshape(shape) * self.weight
        return y * F.silu(z) if self.norm_before_gate else y


class Mamba2(TokenMixer):
    """The Mamba-2 mixer; x, y: [B, T, d_model].

    Args:
        d_model: width of the residual stream (mamba_ssm's ``d_model``, fla's ``hidden_size``).
        d_state: N, the state size per head (B and C are N wide per group).
        d_conv: kernel of the causal depthwise convolution over (x, B, C).
        expand: d_inner = expand * d_model, the width of x and z.
        head_dim: P; the number of heads is H = d_inner / P.
        n_groups: G; B and C are shared by H / G heads each, and the norm runs per group.
        A_init_range: A = -exp(A_log) is drawn from -U(A_init_range) per head.
        D_has_hdim: one D per channel ([d_inner]) instead of one per head ([H]).
        rmsnorm: the gated RMSNorm (default); False gives ``y * silu(z)`` alone.
        norm_before_gate: ``rmsnorm(y) * silu(z)`` instead of Mamba-2's ``rmsnorm(y * silu(z))``.
        dt_min, dt_max, dt_init_floor: the range of the initial step sizes softplus(dt_bias).
        dt_limit: the step sizes are clamped to this (low, high) range.
        conv_bias: a bias in the convolution (default); bias: biases in in_proj and out_proj.
        conv_init: if given, the convolution's weights start in U(-conv_init, conv_init).
        norm_eps: epsilon of the norm. chunk_size: block length C of the chunk form (64: on
            the CPU a model of ``preset("mamba2")`` trains slower at Mamba-2's GPU default of
            256, and no faster at 32 or 128).
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 128,
        d_conv: int = 4,
        expand: int = 2,
        head_dim: int = 64,
        n_groups: int = 1,
        *,
        A_init_range: tuple[float, float] = (1.0, 16.0),
        D_has_hdim: bool = False,
        rmsnorm: bool = True,
        norm_before_gate: bool = False,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
        conv_bias: bool = True,
        conv_init: float | None = None,
        bias: bool = False,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        for name, value in (("d_state", d_state), ("d_conv", d_conv), ("expand", expand),
                            ("head_dim", head_dim), ("n_groups", n_groups)):  # fmt: skip
            check_positive(name, value)
        d_inner = expand * d_model
        if d_inner % head_dim:
            raise ValueError(
                f"expand * d_model ({d_inner}) must be divisible by head_dim ({head_dim})"
            )
        H = d_inner // head_dim
        if H % n_groups:
            raise ValueError(
                f"the number of heads ({H}) must be divisible by n_groups ({n_groups})"
            )
        _check_range("A_init_range", A_init_range, low=0.0)
        _check_range("dt_limit", dt_limit, low=0.0)
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        self.d_state, self.d_conv, self.expand = d_state, d_conv, expand
        self.head_dim, self.n_groups, self.n_heads, self.d_inner = head_dim, n_groups, H, d_inner
        self.dt_limit = tuple(float(b) for b in dt_limit)
        self.D_has_hdim = flag("D_has_hdim", D_has_hdim)
        self.conv_dim = d_inner + 2 * n_groups * d_state
        self.in_proj = nn.Linear(d_model, d_inner + self.conv_dim + H, bias=flag("bias", bias))
        self.conv = ShortConvolution(self.conv_dim, d_conv, activation=None)
        self.conv_bias: nn.Parameter | None = None
        if flag("conv_bias", conv_bias):
            # nn.Conv1d's bias initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = d_conv
            bound = 1.0 / math.sqrt(d_conv)
            self.conv_bias = nn.Parameter(torch.empty(self.conv_dim).uniform_(-bound, bound))
        if conv_init is not None:
            nn.init.uniform_(self.conv.weight, -conv_init, conv_init)
        dt = torch.exp(torch.rand(H) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(*A_init_range)))
        self.D = nn.Parameter(torch.ones(d_inner if self.D_has_hdim else H))
        self.norm: GroupRMSNormGated | None = None
        if flag("rmsnorm", rmsnorm):
            self.norm = GroupRMSNormGated(d_inner, d_inner // n_groups, norm_eps, norm_before_gate)
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``S``: [B, H, N, P] in float32 (float64 for float64 models); ``conv``: the last
        ``d_conv - 1`` inputs of the convolution, [B, d_inner + 2 G N, d_conv - 1]."""
        H, N, P = self.n_heads, self.d_state, self.head_dim
        return {
            "S": ((batch_size, H, N, P), state_dtype(dtype)),
            "conv": (self.conv.state_shape(batch_size), dtype),
        }

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        Bsz, T, _ = x.shape
        H, N, P, G = self.n_heads, self.d_state, self.head_dim, self.n_groups
        z, xBC, dt = self.in_proj(x).split([self.d_inner, self.conv_dim, H], dim=-1)
        xBC, conv_state = self.conv(xBC, None if state is None else state["conv"])
        if self.conv_bias is not None:
            xBC = xBC + self.conv_bias
        xs, B, C = F.silu(xBC).split([self.d_inner, G * N, G * N], dim=-1)
        xs = xs.reshape(Bsz, T, H, P)  # [B, T, d_inner] -> [B, T, H, P]
        # [B, T, G*N] -> [B, T, G, N] -> [B, T, H, N]: each group's B and C serve H / G heads
        B = B.reshape(Bsz, T, G, N).repeat_interleave(H // G, dim=2)
        C = C.reshape(Bsz, T, G, N).repeat_interleave(H // G, dim=2)
        dt = self.step_size(dt)  # [B, T, H]
        g = dt * -torch.exp(self.A_log.to(dt.dtype))  # log(alpha_t) = dt_t A <= 0
        S = None if state is None else state["S"]
        y, S = ops.linear_attention(
            C,
            B,
            xs * dt[..., None].to(xs.dtype),  # the Delta-scaled input
            g,
            scale=1.0,
            mode=self.pick_mode(T, state),
            chunk_size=self.chunk_size,
            initial_state=S,
            output_final_state=state is not None,
        )
        D = self.D.view(H, P) if self.D_has_hdim else self.D[:, None]  # [H, P] or [H, 1]
        y = (y + D * xs).reshape(Bsz, T, self.d_inner)  # [B, T, H, P] -> [B, T, d_inner]
        y = y * F.silu(z) if self.norm is None else self.norm(y, z)
        new_state = None if state is None else {"S": S.to(state_dtype(x.dtype)), "conv": conv_state}
        return self.out_proj(y), new_state

    def step_size(self, dt: Tensor) -> Tensor:
        """dt [B, T, H] -> clamp(softplus(dt + dt_bias), dt_limit), in the state dtype."""
        dtype = state_dtype(dt.dtype)
        return functional.step_size(dt, self.dt_bias, dtype=dtype, limit=self.dt_limit)

    # -- weights of the reference implementations --------------------------------------------

    @classmethod
    def from_transformers(cls, module: nn.Module) -> Mamba2:
        """A ``Mamba2`` with the options and weights of transformers' ``Mamba2Mixer``."""
        if type(module).__name__ != "Mamba2Mixer":
            name = type(module).__name__
            raise TypeError(f"module must be a transformers Mamba2Mixer, got {name}")
        return cls._from_reference(
            module, dt_limit=tuple(module.time_step_limit), norm_eps=module.layer_norm_epsilon
        )

    @classmethod
    def from_fla(cls, module: nn.Module) -> Mamba2:
        """A ``Mamba2`` with the options and weights of fla's ``Mamba2`` layer."""
        if type(module).__name__ != "Mamba2" or not hasattr(module, "ssm_state_size"):
            raise TypeError(f"module must be fla's Mamba2 layer, got {type(module).__name__}")
        return cls._from_reference(
            module,
            D_has_hdim=module.D_has_hdim,
            rmsnorm=module.rmsnorm,
            norm_before_gate=module.norm_before_gate,
            dt_limit=tuple(module.dt_limit),
            norm_eps=module.norm_eps,
        )

    @classmethod
    def _from_reference(cls, module: nn.Module, **options) -> Mamba2:
        """A ``Mamba2`` with the sizes of a reference mixer (transformers' and fla's share these
        attribute names), its other ``options``, and its weights."""
        if module.activation not in ("silu", "swish"):
            raise ValueError(f"only the SiLU activation is supported, got {module.activation!r}")
        layer = cls(
            module.hidden_size,
            module.ssm_state_size,
            module.conv_kernel_size,
            module.intermediate_size // module.hidden_size,
            module.head_dim,
            module.n_groups,
            conv_bias=module.use_conv_bias,
            bias=module.use_bias,
            chunk_size=module.chunk_size,
            **options,
        )
        return layer._load_reference(module)

    def _load_reference(self, module: nn.Module) -> Mamba2:
        """Copy the weights of a reference Mamba-2 (same parameter names but the convolution's)."""
        if self.expand * self.d_model != module.intermediate_size:
            raise ValueError("the module's intermediate size is not an integer multiple of d_model")
        weights = {
            "in_proj.weight": module.in_proj.weight,
            "conv.weight": module.conv1d.weight,
            "dt_bias": module.dt_bias,
            "A_log": module.A_log,
            "D": module.D,
            "out_proj.weight": module.out_proj.weight,
        }
        if self.conv_bias is not None:
            weights["conv_bias"] = module.conv1d.bias
        if self.norm is not None:
            weights["norm.weight"] = module.norm.weight
        if module.in_proj.bias is not None:
            weights["in_proj.bias"] = module.in_proj.bias
            weights["out_proj.bias"] = module.out_proj.bias
        weight = module.in_proj.weight
        self.to(device=weight.device, dtype=weight.dtype)
        self.load_state_dict({k: v.detach() for k, v in weights.items()}, strict=True)
        return self


def _check_range(name: str, value: object, low: float) -> None:
    """A ValueError unless ``value`` is a pair (a, b) with low <= a <= b."""
    ok = isinstance(value, (tuple, list)) and len(value) == 2
    if not (ok and low <= value[0] <= value[1]):
        raise ValueError(f"{name} must be a pair (a, b) with {low} <= a <= b, got {value!r}")
