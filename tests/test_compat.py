"""linattn.compat: fla's names, argument order and defaults, mapped onto linattn's ops."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from linattn import compat
from linattn.ops import delta_rule, linear_attention

B, T, H, K, V = 2, 70, 2, 4, 3


@pytest.fixture
def x():
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return {
        "q": randn(B, T, H, K),
        "k": F.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, H, V),
        "beta": torch.rand(B, T, H, generator=gen, dtype=torch.float64),
        "g": F.logsigmoid(randn(B, T, H) + 2),
        "gk": F.logsigmoid(randn(B, T, H, K) + 2),
        "S0": randn(B, H, K, V),
    }


SIGNATURES = {
    "chunk_linear_attn": "q k v scale initial_state output_final_state normalize head_first",
    "fused_recurrent_linear_attn": "q k v scale initial_state output_final_state normalize "
    "head_first",
    "chunk_simple_gla": "q k v g g_gamma scale initial_state output_final_state cu_seqlens",
    "fused_recurrent_simple_gla": "q k v g g_gamma scale initial_state output_final_state "
    "reverse cu_seqlens",
    "chunk_gla": "q k v g scale initial_state output_final_state cu_seqlens head_first",
    "fused_recurrent_gla": "q k v gk gv scale initial_state output_final_state reverse cu_seqlens",
    "chunk_delta_rule": "q k v beta scale initial_state output_final_state "
    "use_qk_l2norm_in_kernel cu_seqlens head_first",
    "fused_recurrent_delta_rule": "q k v beta scale initial_state output_final_state "
    "use_qk_l2norm_in_kernel cu_seqlens",
    "chunk_gated_delta_rule": "q k v g beta scale initial_state output_final_state "
    "use_qk_l2norm_in_kernel cu_seqlens head_first",
    "fused_recurrent_gated_delta_rule": "q k v g gk gv beta scale initial_state "
    "output_final_state use_qk_l2norm_in_kernel cu_seqlens",
    "chunk_kda": "q k v g beta scale initial_state output_final_state use_qk_l2norm_in_kernel "
    "use_gate_in_kernel use_beta_sigmoid_in_kernel allow_neg_eigval safe_gate lower_bound "
    "cu_seqlens state_v_first kwargs",
    "fused_recurrent_kda": "q k v g beta A_log dt_bias scale initial_state output_final_state "
    "use_qk_l2norm_in_kernel use_gate_in_kernel use_beta_sigmoid_in_kernel allow_neg_eigval "
    "lower_bound state_v_first cu_seqlens kwargs",
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_argument_order(name):
    params = list(inspect.signature(getattr(compat, name)).parameters)
    assert params == SIGNATURES[name].split()


def test_defaults():
    def default(fn, arg):
        return inspect.signature(fn).parameters[arg].default

    assert default(compat.chunk_linear_attn, "normalize") is True
    assert default(compat.fused_recurrent_linear_attn, "normalize") is False
    assert default(compat.fused_recurrent_delta_rule, "beta") is None
    for name in SIGNATURES:
        fn = getattr(compat, name)
        assert default(fn, "scale") is None
        assert default(fn, "output_final_state") is False


def same(a, b):
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-12)
    if a[1] is not None or b[1] is not None:
        torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-12)


def test_gated_delta_rule_takes_g_before_beta(x):
    ours = delta_rule(
        x["q"], x["k"], x["v"], x["beta"], x["g"], initial_state=x["S0"], output_final_state=True
    )
    same(
        compat.chunk_gated_delta_rule(
            x["q"],
            x["k"],
            x["v"],
            x["g"],
            x["beta"],
            initial_state=x["S0"],
            output_final_state=True,
        ),
        ours,
    )
    same(
        compat.fused_recurrent_gated_delta_rule(
            x["q"],
            x["k"],
            x["v"],
            x["g"],
            beta=x["beta"],
            initial_state=x["S0"],
            output_final_state=True,
        ),
        ours,
    )


def test_delta_rule(x):
    ours = delta_rule(
        x["q"], x["k"], x["v"], x["beta"], initial_state=x["S0"], output_final_state=True
    )
    same(compat.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], None, x["S0"], True), ours)
    same(
        compat.fused_recurrent_delta_rule(x["q"], x["k"], x["v"], x["beta"], None, x["S0"], True),
        ours,
    )
    ones = delta_rule(x["q"], x["k"], x["v"], torch.ones_like(x["beta"]))
    same(compat.fused_recurrent_delta_rule(x["q"], x["k"], x["v"]), ones)


def test_kda_and_gk(x):
    ours = delta_rule(
        x["q"],
        x["k"],
        x["v"],
        x["beta"],
        x["gk"],
        initial_state=x["S0"],
        output_final_state=True,
        use_qk_l2norm=True,
    )
    kw = {"initial_state": x["S0"], "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    same(compat.chunk_kda(x["q"], x["k"], x["v"], x["gk"], x["beta"], **kw), ours)
    same(compat.fused_recurrent_kda(x["q"], x["k"], x["v"], x["gk"], x["beta"], **kw), ours)
    same(
        compat.fused_recurrent_gated_delta_rule(
            x["q"], x["k"], x["v"], gk=x["gk"], beta=x["beta"], **kw
        ),
        ours,
    )


def test_kda_gate_and_beta_in_kernel(x):
    gen = torch.Generator().manual_seed(1)
    raw = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    A_log = torch.randn(H, generator=gen, dtype=torch.float64)
    dt_bias = torch.randn(H * K, generator=gen, dtype=torch.float64)
    logits = torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    # KDA's gate written out: -exp(A_log_h) * softplus(raw + dt_bias_{h,c}); beta = 2 sigmoid.
    g = -torch.exp(A_log)[:, None] * torch.log1p(torch.exp(raw + dt_bias.view(H, K)))
    ours = delta_rule(x["q"], x["k"], x["v"], 2 * torch.sigmoid(logits), g)
    kw = {
        "use_gate_in_kernel": True,
        "use_beta_sigmoid_in_kernel": True,
        "allow_neg_eigval": True,
        "A_log": A_log,
        "dt_bias": dt_bias,
    }
    same(compat.chunk_kda(x["q"], x["k"], x["v"], raw, logits, **kw), ours)
    same(compat.fused_recurrent_kda(x["q"], x["k"], x["v"], raw, logits, **kw), ours)
    bounded = -5.0 * torch.sigmoid(torch.exp(A_log)[:, None] * (raw + dt_bias.view(H, K)))
    torch.testing.assert_close(compat.kda_gate(raw, A_log, dt_bias, -5.0), bounded)


def test_gla_and_simple_gla(x):
    for g, chunk, rec in [
        (x["g"], compat.chunk_simple_gla, compat.fused_recurrent_simple_gla),
        (x["gk"], compat.chunk_gla, compat.fused_recurrent_gla),
    ]:
        ours = linear_attention(
            x["q"], x["k"], x["v"], g, initial_state=x["S0"], output_final_state=True
        )
        kw = {"initial_state": x["S0"], "output_final_state": True}
        same(chunk(x["q"], x["k"], x["v"], g, **kw), ours)
        same(rec(x["q"], x["k"], x["v"], g, **kw), ours)
    gamma = torch.tensor([-0.1, -0.5], dtype=torch.float64)
    ours = linear_attention(x["q"], x["k"], x["v"], gamma.expand(B, T, H))
    same(compat.chunk_simple_gla(x["q"], x["k"], x["v"], g_gamma=gamma), ours)


def test_linear_attn_normalizer(x):
    q, k = F.elu(x["q"]) + 1, F.elu(x["k"]) + 1
    S0 = x["S0"].abs()
    o, S = compat.chunk_linear_attn(q, k, x["v"], initial_state=S0, output_final_state=True)
    num, S_ref = linear_attention(q, k, x["v"], initial_state=S0, output_final_state=True)
    # fla's normaliser: (scale q_t)^T cumsum(k)_t, over this call's keys only.
    den = (q / math.sqrt(K) * k.cumsum(dim=1)).sum(-1, keepdim=True)
    torch.testing.assert_close(o, num / den, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)
    same(compat.fused_recurrent_linear_attn(q, k, x["v"]), linear_attention(q, k, x["v"]))


def test_unsupported_options(x):
    with pytest.raises(ValueError, match="head_first"):
        compat.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], head_first=True)
    with pytest.raises(ValueError, match="gv"):
        compat.fused_recurrent_gla(x["q"], x["k"], x["v"], gv=x["v"])
    with pytest.raises(ValueError, match="reverse"):
        compat.fused_recurrent_simple_gla(x["q"], x["k"], x["v"], x["g"], reverse=True)
    with pytest.raises(ValueError, match="only one"):
        compat.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["gk"])
    with pytest.raises(TypeError, match="unexpected"):
        compat.chunk_kda(x["q"], x["k"], x["v"], x["gk"], x["beta"], bogus=1)
    with pytest.raises(ValueError, match="beta"):  # checks of the ops apply
        compat.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"] + 2.5)


def _empty_calls(b: int, t: int, h: int):
    """Every compat function on inputs with B, T, H = b, t, h (one of them 0), with a state."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(b, t, h, K, generator=gen), torch.randn(b, t, h, K, generator=gen)
    v, beta = torch.randn(b, t, h, V, generator=gen), torch.rand(b, t, h, generator=gen)
    g, gk = -torch.rand(b, t, h, generator=gen), -torch.rand(b, t, h, K, generator=gen)
    S0 = torch.randn(b, h, K, V, generator=gen)
    gate = dict(use_gate_in_kernel=True, A_log=torch.zeros(h), dt_bias=torch.zeros(h * K))
    s = dict(initial_state=S0, output_final_state=True)
    return S0, {
        "chunk_linear_attn": lambda: compat.chunk_linear_attn(q, k, v, **s),
        "fused_recurrent_linear_attn": lambda: compat.fused_recurrent_linear_attn(q, k, v, **s),
        "chunk_simple_gla": lambda: compat.chunk_simple_gla(q, k, v, g, **s),
        "fused_recurrent_simple_gla": lambda: compat.fused_recurrent_simple_gla(q, k, v, g, **s),
        "chunk_gla": lambda: compat.chunk_gla(q, k, v, gk, **s),
        "fused_recurrent_gla": lambda: compat.fused_recurrent_gla(q, k, v, gk, **s),
        "chunk_delta_rule": lambda: compat.chunk_delta_rule(q, k, v, beta, **s),
        "fused_recurrent_delta_rule": lambda: compat.fused_recurrent_delta_rule(q, k, v, **s),
        "chunk_gated_delta_rule": lambda: compat.chunk_gated_delta_rule(q, k, v, g, beta, **s),
        "fused_recurrent_gated_delta_rule": lambda: compat.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta=beta, **s
        ),
        "chunk_kda": lambda: compat.chunk_kda(
            q, k, v, gk, beta, use_qk_l2norm_in_kernel=True, **gate, **s
        ),  # fmt: skip
        "fused_recurrent_kda": lambda: compat.fused_recurrent_kda(q, k, v, gk, beta, **gate, **s),
    }


@pytest.mark.parametrize("name", sorted(SIGNATURES))
@pytest.mark.parametrize("sizes", [(0, 5, 2), (2, 5, 0), (2, 0, 2)])
def test_every_function_accepts_empty_dimensions(name, sizes):
    # Issue 18, defect 8: empty outputs, the initial state back as final state (no token ran).
    S0, calls = _empty_calls(*sizes)
    o, S = calls[name]()
    b, t, h = sizes
    assert o.shape == (b, t, h, V)
    torch.testing.assert_close(S, S0, rtol=0, atol=0)
