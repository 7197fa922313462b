"""fla's conventions and checks in compat, without fla: checks that raise where fla raises,
state layouts, dtypes, gates g + gk + gv, per-value-channel beta, reverse, intermediate states.

The float64 oracle here is a plain token loop written out per value channel.
"""

from __future__ import annotations

import pytest
import torch

from linattn import compat

from .helpers import recipe

B, T, H, K, V = 1, 23, 2, 4, 3


def loop(q, k, v, beta=None, decay=None, S0=None, scale=None, delta=True):
    """S <- decay * S (decay [B, T, H, K, V] multiplies every entry), then the delta rule's
    S += k (beta (v - S^T k))^T (beta [B, T, H, V]) or the additive S += k v^T; o = S^T q."""
    Bq, Tq, Hq, Kq = q.shape
    scale = Kq**-0.5 if scale is None else scale
    S = torch.zeros(Bq, v.shape[2], Kq, v.shape[3], dtype=torch.float64) if S0 is None else S0
    G = v.shape[2] // Hq
    q, k = q.repeat_interleave(G, 2), k.repeat_interleave(G, 2)
    out = []
    for t in range(Tq):
        if decay is not None:
            S = S * decay[:, t]
        kt = k[:, t]
        if delta:
            err = v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt)
            S = S + torch.einsum("bhk,bhv->bhkv", kt, beta[:, t] * err)
        else:
            S = S + torch.einsum("bhk,bhv->bhkv", kt, v[:, t])
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * scale))
    return torch.stack(out, 1), S


@pytest.fixture
def x():
    return recipe(B=B, T=T, H=H, HV=2 * H, K=K, V=V, dtype=torch.float64)


def close(a, b, tol=1e-12):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_every_gate_together_and_channel_beta(x):
    """fused_recurrent_gated_delta_rule with g, gk, gv and beta [B, T, HV, V]: each value
    channel runs as its own head (exact), grouped value heads."""
    beta = torch.rand(B, T, 2 * H, V, dtype=torch.float64)
    o, S = compat.fused_recurrent_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["gk"], x["gv"], beta=beta, initial_state=x["h0"],
        output_final_state=True,
    )  # fmt: skip
    decay = (x["g"][..., None, None] + x["gk"][..., :, None] + x["gv"][..., None, :]).exp()
    o_ref, S_ref = loop(x["q"], x["k"], x["v"], beta, decay, x["h0"])
    close(o, o_ref)
    close(S, S_ref)


def test_gla_gv_reverse_state_v_first(x):
    o, S = compat.fused_recurrent_gla(
        x["q"], x["k"], x["v"], x["gk"], x["gv"], initial_state=x["h0"].transpose(-1, -2),
        output_final_state=True, reverse=True, state_v_first=True,
    )  # fmt: skip
    flip = [y.flip(1) for y in (x["q"], x["k"], x["v"], x["gk"], x["gv"])]
    decay = (flip[3][..., :, None] + flip[4][..., None, :]).exp()
    o_ref, S_ref = loop(*flip[:3], None, decay, x["h0"], delta=False)
    close(o, o_ref.flip(1))
    close(S, S_ref.transpose(-1, -2))


def test_reverse_runs_each_packed_sequence_backwards(x):
    q, k, v, g = x["q"], x["k"], x["v"], x["g"]
    cu = torch.tensor([0, 9, T])
    o, S = compat.fused_recurrent_simple_gla(
        q, k, v, g, output_final_state=True, reverse=True, cu_seqlens=cu
    )
    for n, (s, e) in enumerate([(0, 9), (9, T)]):
        part = [y[:, s:e].flip(1) for y in (q, k, v, g)]
        decay = part[3][..., None, None].exp().expand(-1, -1, -1, K, V)
        o_ref, S_ref = loop(*part[:3], None, decay, delta=False)
        close(o[:, s:e], o_ref.flip(1))
        close(S[n : n + 1], S_ref)


def test_in_kernel_gate_and_beta_sigmoid(x):
    A_log, dt_bias = (
        torch.randn(2 * H, dtype=torch.float64),
        torch.randn(2 * H, dtype=torch.float64),
    )
    raw, logits = torch.randn_like(x["g"]), torch.randn_like(x["beta"])
    o, S = compat.chunk_gated_delta_rule(
        x["q"], x["k"], x["v"], raw, logits, output_final_state=True, chunk_size=16,
        use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
        allow_neg_eigval=True,
    )  # fmt: skip
    g = -A_log.exp() * torch.nn.functional.softplus(raw + dt_bias)  # [B, T, HV]
    beta = 2 * logits.sigmoid()
    o_ref, S_ref = loop(
        x["q"], x["k"], x["v"], beta[..., None].expand(-1, -1, -1, V),
        g[..., None, None].exp().expand(-1, -1, -1, K, V),
    )  # fmt: skip
    close(o, o_ref)
    close(S, S_ref)


def test_kda_intermediate_states(x):
    with torch.inference_mode():
        o, S, h = compat.chunk_kda(
            x["q"], x["k"], x["v"], x["gk"], x["beta"], initial_state=x["h0"],
            output_final_state=True, return_intermediate_states=True, chunk_size=32,
        )  # fmt: skip
        T2 = 70
        y = recipe(B=1, T=T2, H=H, HV=2 * H, K=K, V=V, dtype=torch.float64)
        cu = torch.tensor([0, 40, T2])
        _, _, h2 = compat.chunk_kda(
            y["q"], y["k"], y["v"], y["gk"], y["beta"], cu_seqlens=cu, chunk_size=32,
            return_intermediate_states=True,
        )  # fmt: skip
    assert h.shape == (1, 1, 2 * H, K, V)
    close(h[:, 0], x["h0"])
    assert h2.shape == (1, 2 + 1, 2 * H, K, V)  # ceil(40 / 32) + ceil(30 / 32) chunks
    _, S32 = compat.chunk_kda(
        y["q"][:, :32], y["k"][:, :32], y["v"][:, :32], y["gk"][:, :32], y["beta"][:, :32],
        output_final_state=True,
    )  # fmt: skip
    close(h2[:, 1], S32)
    close(h2[:, 2], torch.zeros_like(S32))  # the second sequence starts from zeros
    with pytest.raises(ValueError, match="inference mode"):
        compat.chunk_kda(x["q"], x["k"], x["v"], x["gk"], x["beta"],
                         return_intermediate_states=True)  # fmt: skip


def test_state_v_first_is_the_transposed_layout(x):
    kw = dict(output_final_state=True)
    o, S = compat.chunk_kda(x["q"], x["k"], x["v"], x["gk"], x["beta"], initial_state=x["h0"], **kw)
    o2, S2 = compat.chunk_kda(
        x["q"], x["k"], x["v"], x["gk"], x["beta"], initial_state=x["h0"].transpose(-1, -2),
        state_v_first=True, **kw,
    )  # fmt: skip
    close(o, o2, 0)
    close(S, S2.transpose(-1, -2), 0)


def test_dtypes():
    """q, k in bfloat16 with v in float32 (fla's tests): promoted; o in q's dtype for the chunk
    kernels, v's for the recurrent ones (as fla's); final states float32."""
    x = recipe(T=20)
    qb, kb = x["q"].bfloat16(), x["k"].bfloat16()
    o, S = compat.chunk_gated_delta_rule(qb, kb, x["v"], x["g"], x["beta"], output_final_state=True)
    o32, S32 = compat.chunk_gated_delta_rule(
        qb.float(), kb.float(), x["v"], x["g"], x["beta"], output_final_state=True
    )
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    close(o.float(), o32.bfloat16().float(), 0)
    close(S, S32, 0)
    o, S = compat.fused_recurrent_gated_delta_rule(
        qb, kb, x["v"], x["g"], beta=x["beta"], output_final_state=True
    )
    assert o.dtype == torch.float32 and S.dtype == torch.float32
    y = {n: t.bfloat16() for n, t in x.items()}
    _, S = compat.chunk_kda(y["q"], y["k"], y["v"], y["gk"], y["beta"], output_final_state=True)
    assert S.dtype == torch.float32


def test_fla_s_checks(x):
    q, k, v, g, gk, beta = (x[n] for n in ("q", "k", "v", "g", "gk", "beta"))
    for call in (
        lambda: compat.chunk_gated_delta_rule(q, k, v, g, beta, allow_neg_eigval=True),
        lambda: compat.fused_recurrent_gdn(q, k, v, g, beta=beta, allow_neg_eigval=True),
        lambda: compat.chunk_kda(q, k, v, gk, beta, allow_neg_eigval=True),
        lambda: compat.fused_recurrent_kda(q, k, v, gk, beta, allow_neg_eigval=True),
    ):
        with pytest.raises(ValueError, match="requires `use_beta_sigmoid_in_kernel=True`"):
            call()
    gate = dict(use_gate_in_kernel=True, A_log=torch.zeros(2 * H), safe_gate=True)
    with pytest.raises(ValueError, match="`lower_bound` must be specified"):
        compat.chunk_kda(q, k, v, gk, beta, **gate)
    with pytest.raises(ValueError, match=r"safe range \[-5, 0\), got -6"):
        compat.chunk_kda(q, k, v, gk, beta, lower_bound=-6.0, **gate)
    with pytest.raises(ValueError, match="`A_log` must be provided"):
        compat.chunk_kda(q, k, v, gk, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="A_log must be provided"):
        compat.chunk_gated_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="`g` .* must be provided"):
        compat.fused_recurrent_gated_delta_rule(q, k, v, beta=beta, use_gate_in_kernel=True,
                                                A_log=torch.zeros(2 * H))  # fmt: skip
    f32 = {n: t.float() for n, t in x.items()}
    with pytest.raises(ValueError, match="initial_state must be in float32"):
        compat.chunk_kda(f32["q"], f32["k"], f32["v"], f32["gk"], f32["beta"],
                         initial_state=x["h0"])  # fmt: skip
    with pytest.raises(ValueError, match="`chunk_size` must be"):
        compat.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=48)
    with pytest.raises(ValueError, match="`chunk_size` must be either|`chunk_size` must be one"):
        compat.chunk_kda(q, k, v, gk, beta, chunk_size=16)
    with pytest.raises(ValueError, match="num_v_heads"):
        compat.chunk_gated_delta_rule(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(NotImplementedError, match="cp_context"):
        compat.chunk_gated_delta_rule(q, k, v, g, beta, cp_context=object())
    with pytest.raises(DeprecationWarning, match="head_first"):
        compat.chunk_simple_gla(q, k, v[:, :, :H], g[:, :, :H], head_first=False)
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        compat.chunk_linear_attn(q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1),
                                 v[:, :, :H].expand(2, -1, -1, -1),
                                 cu_seqlens=torch.tensor([0, T]))  # fmt: skip
    with pytest.raises(ValueError, match="number of initial states"):
        compat.chunk_gdn(
            q, k, v, g, beta, initial_state=x["h0"], cu_seqlens=torch.tensor([0, 5, T])
        )


def test_keywords(x):
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    ref = compat.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    # transformers passes use_cache; fla's **kwargs swallows it, and so does compat.
    out = compat.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_cache=True)
    close(out[0], ref[0], 0)
    S = compat.fused_recurrent_gdn(q, k, v, g, beta=beta, output_final_state=True,
                                   transpose_state_layout=True)[1]  # fmt: skip
    close(S, ref[1].transpose(-1, -2))
    with pytest.raises(TypeError):  # chunk_gla has no **kwargs in fla
        compat.chunk_gla(q, k, v[:, :, :H], x["gk"][:, :, :H], use_cache=True)


@pytest.mark.parametrize("sizes", [(0, 5, 2), (2, 5, 0), (2, 0, 2)])
@pytest.mark.parametrize(
    "name", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda",
             "fused_recurrent_kda", "chunk_gla", "fused_recurrent_gla", "chunk_simple_gla",
             "fused_recurrent_simple_gla", "chunk_delta_rule", "fused_recurrent_delta_rule",
             "chunk_linear_attn", "fused_recurrent_linear_attn"],
)  # fmt: skip
def test_empty_dimensions(name, sizes):
    """Empty outputs, the initial state back as final state."""
    b, t, h = sizes
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(b, t, h, K, generator=gen), torch.randn(b, t, h, K, generator=gen)
    v, beta = torch.randn(b, t, h, V, generator=gen), torch.rand(b, t, h, generator=gen)
    g, gk = -torch.rand(b, t, h, generator=gen), -torch.rand(b, t, h, K, generator=gen)
    S0 = torch.randn(b, h, K, V, generator=gen)
    s = dict(initial_state=S0, output_final_state=True)
    args = {
        "chunk_gated_delta_rule": (g, beta), "fused_recurrent_gated_delta_rule": (g,),
        "chunk_kda": (gk, beta), "fused_recurrent_kda": (gk, beta), "chunk_gla": (gk,),
        "fused_recurrent_gla": (gk,), "chunk_simple_gla": (g,),
        "fused_recurrent_simple_gla": (g,), "chunk_delta_rule": (beta,),
        "fused_recurrent_delta_rule": (beta,), "chunk_linear_attn": (),
        "fused_recurrent_linear_attn": (),
    }[name]  # fmt: skip
    extra = {"normalize": False} if "linear_attn" in name else {}
    o, S = getattr(compat, name)(q, k, v, *args, **s, **extra)
    assert o.shape == (b, t, h, V)
    close(S, S0, 0)
