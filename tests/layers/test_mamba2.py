"""``Mamba2`` against transformers' ``Mamba2Mixer`` (its pure-PyTorch path) with the same weights,
and against a literal loop of the Mamba-2 recurrence for the options transformers lacks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from linattn.layers import Mamba2
from tests.layers.promote import float64_casts

D_MODEL = 32


def reference_mixer(dtype: torch.dtype, n_groups: int = 2, chunk_size: int = 8):
    """transformers' Mamba2Mixer: 8 heads of 8, N = 8, two groups; A_log, D and the biases
    randomised so that every parameter matters."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    config = transformers.Mamba2Config(
        hidden_size=D_MODEL,
        state_size=8,
        num_heads=8,
        head_dim=8,
        expand=2,
        n_groups=n_groups,
        conv_kernel=4,
        chunk_size=chunk_size,
        num_hidden_layers=1,
    )
    torch.manual_seed(0)
    mixer = Mamba2Mixer(config, layer_idx=0).to(dtype)
    with torch.no_grad():
        mixer.A_log.copy_(torch.rand(8) * 2)
        mixer.D.copy_(torch.randn(8))
        mixer.norm.weight.copy_(1 + 0.1 * torch.randn(D_MODEL * 2))
    return config, mixer


def assert_close(got, want, dtype):
    if dtype == torch.float64:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    else:
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-5, err


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n_groups", [1, 2])
def test_forward_and_gradients_equal_transformers(dtype, n_groups):
    """T = 19 with chunks of 8 (a ragged last chunk); input and every parameter's gradient."""
    _, ref = reference_mixer(dtype, n_groups)
    ours = Mamba2.from_transformers(ref)
    assert next(ours.parameters()).dtype == dtype
    x = torch.randn(2, 19, D_MODEL, dtype=dtype)
    w = torch.randn(2, 19, D_MODEL, dtype=dtype)
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    with float64_casts():
        y_ref = ref(x_ref)
        (y_ref * w).sum().backward()
    y_ours, _ = ours(x_ours)
    (y_ours * w).sum().backward()
    assert_close(y_ours, y_ref, dtype)
    assert_close(x_ours.grad, x_ref.grad, dtype)
    grads = {name: p.grad for name, p in ref.named_parameters()}
    pairs = {"conv.weight": "conv1d.weight", "conv_bias": "conv1d.bias"}
    for name, p in ours.named_parameters():
        assert_close(p.grad, grads[pairs.get(name, name)].view_as(p.grad), dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decoding_with_the_cache_equals_one_forward(dtype):
    """Prefill 5 tokens, then 6 one-token steps: ours against transformers' whole-sequence
    forward, and transformers' own cache (DynamicCache) step by step against ours, states too."""
    from transformers import DynamicCache

    config, ref = reference_mixer(dtype)
    ours = Mamba2.from_transformers(ref).eval()
    ref.eval()
    x = torch.randn(2, 11, D_MODEL, dtype=dtype)
    with float64_casts(), torch.no_grad():
        y_full = ref(x)
        cache = DynamicCache(config=config)
        ref_steps = [ref(x[:, :5], cache_params=cache)]
        state = ours.new_state(2, dtype)
        y, state = ours(x[:, :5], state)
        ours_steps = [y]
        for t in range(5, 11):
            ref_steps.append(ref(x[:, t : t + 1], cache_params=cache))
            y, state = ours(x[:, t : t + 1], state)
            ours_steps.append(y)
    assert_close(torch.cat(ours_steps, 1), y_full, dtype)
    assert_close(torch.cat(ours_steps, 1), torch.cat(ref_steps, 1), dtype)
    # transformers stores S^T: [B, H, P, N]
    theirs = cache.get_recurrent_state(0, state_idx=0).transpose(-1, -2)
    assert_close(state["S"].to(theirs.dtype), theirs, dtype)


def literal_mamba2(layer: Mamba2, x: torch.Tensor) -> torch.Tensor:
    """The module docstring's formulas, one token at a time, from the layer's parameters."""
    Bsz, T, _ = x.shape
    H, N, P, G, d = layer.n_heads, layer.d_state, layer.head_dim, layer.n_groups, layer.d_inner
    z, xBC, dt = layer.in_proj(x).split([d, layer.conv_dim, H], dim=-1)
    w = layer.conv.weight[:, 0]  # [C, k]
    padded = F.pad(xBC, (0, 0, layer.d_conv - 1, 0))
    conv = torch.stack([(padded[:, t : t + layer.d_conv] * w.T).sum(1) for t in range(T)], 1)
    xs, B, C = F.silu(conv + layer.conv_bias).split([d, G * N, G * N], dim=-1)
    dt = F.softplus(dt + layer.dt_bias).clamp(*layer.dt_limit)
    A = -torch.exp(layer.A_log)
    D = layer.D.view(H, P) if layer.D_has_hdim else layer.D[:, None]
    S = x.new_zeros(Bsz, H, N, P)
    ys = []
    for t in range(T):
        xt = xs[:, t].view(Bsz, H, P)
        Bt = B[:, t].view(Bsz, G, N).repeat_interleave(H // G, 1)
        Ct = C[:, t].view(Bsz, G, N).repeat_interleave(H // G, 1)
        decay = torch.exp(dt[:, t] * A)[..., None, None]
        S = decay * S + Bt[..., :, None] * (dt[:, t, :, None] * xt)[..., None, :]
        ys.append(torch.einsum("bhnp,bhn->bhp", S, Ct) + D * xt)
    y = torch.stack(ys, 1).reshape(Bsz, T, d)
    if layer.norm is None:
        return layer.out_proj(y * F.silu(z))
    norm = layer.norm
    gate = F.silu(z)
    y = y if norm.norm_before_gate else y * gate
    groups = y.view(Bsz, T, -1, norm.group_size)
    rms = groups.pow(2).mean(-1, keepdim=True).add(norm.eps).rsqrt()
    y = (groups * rms).view(Bsz, T, d) * norm.weight
    return layer.out_proj(y * gate if norm.norm_before_gate else y)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"D_has_hdim": True},
        {"norm_before_gate": True},
        {"rmsnorm": False},
        {"dt_limit": (0.01, 0.05)},
        {"n_groups": 4, "bias": True},
    ],
    ids=lambda o: ",".join(o) or "defaults",
)
def test_options_follow_the_literal_recurrence(options):
    torch.manual_seed(1)
    layer = Mamba2(D_MODEL, d_state=4, head_dim=8, chunk_size=4, **options).double()
    with torch.no_grad():
        layer.D.normal_()
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    torch.testing.assert_close(layer(x)[0], literal_mamba2(layer, x), rtol=0, atol=1e-12)


def test_initialisation_as_mamba_ssm():
    torch.manual_seed(2)
    layer = Mamba2(64, head_dim=8, dt_min=1e-3, dt_max=1e-1)  # 16 heads
    A = torch.exp(layer.A_log)
    assert layer.n_heads == 16 and ((A >= 1) & (A <= 16)).all()
    dt = F.softplus(layer.dt_bias)
    assert ((dt >= 1e-3 - 1e-9) & (dt <= 1e-1 + 1e-9)).all()
    assert (layer.D == 1).all() and layer.D.shape == (16,)
    assert layer.in_proj.weight.shape == (2 * 128 + 2 * 128 + 16, 64)
    assert layer.in_proj.bias is None and layer.conv_bias.shape == (128 + 2 * 128,)
    assert abs(layer.conv_bias).max() <= 1 / math.sqrt(4)
    state = layer.new_state(3, torch.float32)
    assert state["S"].shape == (3, 16, 128, 8) and state["conv"].shape == (3, 384, 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"head_dim": 5}, "divisible by head_dim"),
        ({"head_dim": 8, "n_groups": 3}, "divisible by n_groups"),
        ({"d_state": 0}, "d_state"),
        ({"A_init_range": (2, 1)}, "A_init_range"),
        ({"dt_limit": (-1, 1)}, "dt_limit"),
        ({"dt_min": 0.1, "dt_max": 0.01}, "dt_min"),
        ({"bias": 1}, "bias"),
    ],
)
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Mamba2(D_MODEL, **kwargs)


def test_from_transformers_refuses_other_modules():
    with pytest.raises(TypeError, match="Mamba2Mixer"):
        Mamba2.from_transformers(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="fla's Mamba2"):
        Mamba2.from_fla(torch.nn.Linear(2, 2))
