"""compat vs fla 0.6.0's Triton kernels, run on the CPU by triton's interpreter.

fla's own test recipes (``helpers.recipe``), float32, forward and (where fla has a backward)
the gradients of every input, grouped value heads, ``state_v_first``, the in-kernel options,
``cu_seqlens``, initial and final states. The interpreter is slow: shapes are small, and the
heavier cases are marked slow.

``EDGES``: every entry point of these families at fla's edges, in the default run: one token
(T = 1, a lone partial chunk), and packed sequences of 1, 8 and 14 tokens (none a multiple of
a chunk) each from its own initial state; and, marked slow, pieces of 1, 8 and 66 tokens (a
whole chunk and a partial one) for the chunk kernels.
"""

from __future__ import annotations

import importlib

import pytest
import torch

pytest.importorskip("tests.fla_interpreter")
ops = pytest.importorskip("fla.ops")

from linattn import compat  # noqa: E402

from .helpers import assert_same, dplr_recipe, flatten, outputs_and_grads, recipe  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
TOL = 5e-5
FLOAT16_TOL = 4e-3  # fla's float16 kernels: float16's rounding


def _case(name, leaves, grads=True, tol=TOL, **kwargs):
    return name, leaves, kwargs, grads, tol


def gdn_chunk_in_kernel():
    x = recipe(H=2, HV=4)
    gen = torch.Generator().manual_seed(5)
    leaves = {
        "q": x["q"], "k": x["k"], "v": x["v"], "g": torch.randn(1, 40, 4, generator=gen),
        "beta": torch.randn(1, 40, 4, generator=gen),
        "initial_state": x["h0"].transpose(-1, -2).contiguous(),
        "A_log": torch.randn(4, generator=gen), "dt_bias": torch.randn(4, generator=gen),
    }  # fmt: skip
    return _case(
        "chunk_gated_delta_rule", leaves, output_final_state=True, use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
        state_v_first=True, use_cache=True,
    )  # fmt: skip


def gdn_chunk_varlen():
    x = recipe(H=2, HV=4)
    h0 = torch.cat([x["h0"], x["h0"].flip(0).neg()])  # one state per sequence
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"], "beta": x["beta"],
              "initial_state": h0}  # fmt: skip
    cu = torch.tensor([0, 13, 40])
    return _case("chunk_gdn", leaves, output_final_state=True, cu_seqlens=cu, chunk_size=32)


def gdn_recurrent_every_gate():
    x = recipe(H=2, HV=4)
    beta = torch.rand(1, 40, 4, 8, generator=torch.Generator().manual_seed(2))
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"], "gk": x["gk"], "gv": x["gv"],
              "beta": beta, "initial_state": x["h0"].transpose(-1, -2).contiguous()}  # fmt: skip
    return _case(
        "fused_recurrent_gated_delta_rule", leaves, grads=False, output_final_state=True,
        state_v_first=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip


def kda_chunk_in_kernel():
    x = recipe(H=2, HV=4)
    gen = torch.Generator().manual_seed(6)
    leaves = {
        "q": x["q"], "k": x["k"], "v": x["v"], "g": torch.randn(1, 40, 4, 16, generator=gen),
        "beta": torch.randn(1, 40, 4, generator=gen), "initial_state": x["h0"],
        "A_log": torch.randn(4, generator=gen), "dt_bias": torch.randn(4 * 16, generator=gen),
    }  # fmt: skip
    return _case(
        "chunk_kda", leaves, output_final_state=True, use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0,
        use_beta_sigmoid_in_kernel=True,
    )  # fmt: skip


def kda_recurrent_in_kernel():
    x = recipe(H=2, HV=4)
    gen = torch.Generator().manual_seed(7)
    leaves = {
        "q": x["q"], "k": x["k"], "v": x["v"], "g": torch.randn(1, 40, 4, 16, generator=gen),
        "beta": x["beta"], "A_log": torch.randn(4, generator=gen),
        "dt_bias": torch.randn(4 * 16, generator=gen),
        "initial_state": x["h0"].transpose(-1, -2).contiguous(),
    }  # fmt: skip
    return _case(
        "fused_recurrent_kda", leaves, grads=False, output_final_state=True,
        use_gate_in_kernel=True, state_v_first=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip


def gla_recurrent_gv_reverse():
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "gk": x["gk"], "gv": x["gv"],
              "initial_state": x["h0"]}  # fmt: skip
    return _case("fused_recurrent_gla", leaves, output_final_state=True, reverse=True)


def gla_chunk_v_first():
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["gk"],
              "initial_state": x["h0"].transpose(-1, -2).contiguous()}  # fmt: skip
    return _case("chunk_gla", leaves, output_final_state=True, state_v_first=True)


def simple_gla_recurrent_g_and_gamma():
    """g and g_gamma together multiply (fla's chunk kernel returns a final state of ~1e11
    here, its recurrent kernel agrees with compat: compared with the recurrent one)."""
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"],
              "initial_state": x["h0"]}  # fmt: skip
    gamma = torch.tensor([-0.1, -0.7])
    return _case("fused_recurrent_simple_gla", leaves, g_gamma=gamma, output_final_state=True)


def simple_gla_chunk_gamma_v_first():
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"],
              "initial_state": x["h0"].transpose(-1, -2).contiguous()}  # fmt: skip
    gamma = torch.tensor([-0.1, -0.7])
    return _case("chunk_simple_gla", leaves, g_gamma=gamma, output_final_state=True,
                 state_v_first=True)  # fmt: skip


def simple_gla_parallel():
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"]}
    return _case("parallel_simple_gla", leaves)


def simple_gla_parallel_attentions():
    """The decayed score matrix (fla's is outside the graph: forward only)."""
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"]}
    return _case("parallel_simple_gla", leaves, grads=False, output_attentions=True)


def retention_recurrent_reverse():
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "initial_state": x["h0"]}
    return _case("fused_recurrent_retention", leaves, output_final_state=True, reverse=True)


def lightning_chunk():
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "initial_state": x["h0"]}
    return _case("chunk_lightning_attn", leaves, layer_idx=1, num_layers=4,
                 output_final_state=True)  # fmt: skip


def delta_rule_recurrent_channel_beta():
    x = recipe()
    beta = torch.rand(1, 40, 2, 8, generator=torch.Generator().manual_seed(3))
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "beta": beta, "initial_state": x["h0"]}
    return _case("fused_recurrent_delta_rule", leaves, output_final_state=True)


def kda_intermediate_states_varlen():
    x = recipe(T=70, H=2, HV=4)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["gk"], "beta": x["beta"]}
    return _case(
        "chunk_kda", leaves, grads=False, output_final_state=True,
        return_intermediate_states=True, cu_seqlens=torch.tensor([0, 40, 70]),
        state_v_first=True,
    )  # fmt: skip


def linear_attn_varlen():
    x = recipe(T=70)
    leaves = {"q": x["q"].sigmoid(), "k": x["k"].sigmoid(), "v": x["v"]}
    return _case("chunk_linear_attn", leaves, output_final_state=True,
                 cu_seqlens=torch.tensor([0, 30, 70]))  # fmt: skip


def gdn_recurrent_varlen_in_kernel_gate():
    x = recipe(T=70, H=2, HV=4)
    gen = torch.Generator().manual_seed(8)
    leaves = {
        "q": x["q"],
        "k": x["k"],
        "v": x["v"],
        "g": torch.randn(1, 70, 4, generator=gen),
        "beta": x["beta"],
        "initial_state": torch.cat([x["h0"], -x["h0"]]),
        "A_log": torch.randn(4, generator=gen),
        "dt_bias": torch.randn(4, generator=gen),
    }
    return _case(
        "fused_recurrent_gdn", leaves, grads=False, output_final_state=True,
        cu_seqlens=torch.tensor([0, 30, 70]), use_gate_in_kernel=True,
    )  # fmt: skip


def gdn_recurrent_mixed_dtypes():
    """q, k in bfloat16, v, g, beta in float32 (fla's chunk kernels refuse the mix)."""
    x = recipe(H=2, HV=4)
    leaves = {"q": x["q"].bfloat16(), "k": x["k"].bfloat16(), "v": x["v"], "g": x["g"],
              "beta": x["beta"], "initial_state": x["h0"]}  # fmt: skip
    return _case("fused_recurrent_gated_delta_rule", leaves, grads=False,
                 output_final_state=True)  # fmt: skip


def delta_rule_chunk_float16():
    """fla's chunk delta rule refuses float32; float16 (its bfloat16 results are wrong under the
    interpreter: tests/fla_interpreter.py), to float16's rounding of fla's kernels."""
    x = recipe(T=64)
    leaves = {n: x[n].half() for n in ("q", "k", "v", "beta")}
    return _case("chunk_delta_rule", leaves, tol=FLOAT16_TOL, output_final_state=True)


def hgrn_recurrent():
    x = recipe()
    leaves = {"x": x["v"].flatten(2), "g": x["gv"].flatten(2),
              "initial_state": x["h0"][:, :, 0].flatten(1)}  # fmt: skip
    return _case("fused_recurrent_hgrn", leaves, output_final_state=True)


def _dplr_leaves(x, *names, **extra):
    return {**{n: x[n] for n in ("q", "k", "v", *names)}, **extra}


def dplr_chunk():
    """fla's test_dplr_delta recipe: a = normalize(U(0, 1)) reads, b = -a, gk partly 0."""
    x = dplr_recipe(T=40, mask_p=0.3)
    leaves = _dplr_leaves(x, "a", "b", "gk", initial_state=x["h0"])
    return _case("chunk_dplr_delta_rule", leaves, output_final_state=True)


def dplr_chunk_varlen():
    x = dplr_recipe(T=45)
    leaves = _dplr_leaves(x, "a", "b", "gk", initial_state=torch.cat([x["h0"], -x["h0"]]))
    return _case("chunk_dplr_delta_rule", leaves, output_final_state=True,
                 cu_seqlens=torch.tensor([0, 19, 45]), chunk_size=32)  # fmt: skip


def dplr_recurrent_reverse_varlen():
    x = dplr_recipe(T=45)
    leaves = _dplr_leaves(x, "a", "b", "gk", initial_state=torch.cat([x["h0"], -x["h0"]]))
    return _case("fused_recurrent_dplr_delta_rule", leaves, grads=False, reverse=True,
                 output_final_state=True, cu_seqlens=torch.tensor([0, 19, 45]))  # fmt: skip


def iplr_chunk():
    """fla's IPLR chunk kernel has no backward: forward only."""
    x = dplr_recipe(T=40)
    leaves = _dplr_leaves(x, "a", "b", initial_state=x["h0"])
    return _case("chunk_iplr_delta_rule", leaves, grads=False, output_final_state=True,
                 chunk_size=16)  # fmt: skip


def iplr_recurrent():
    x = dplr_recipe(T=40)
    leaves = _dplr_leaves(x, "a", "b", initial_state=x["h0"])
    return _case("fused_recurrent_iplr_delta_rule", leaves, output_final_state=True, scale=0.3)


def _rwkv7_leaves(x):
    """fla's test_rwkv7 recipe: a = -kk reads, b = kk * a_scale, w the log-decay."""
    return {"r": x["q"], "w": x["w"], "k": x["k"], "v": x["v"], "a": -x["kk"],
            "b": x["kk"] * x["a_scale"], "initial_state": x["h0"]}  # fmt: skip


def rwkv7_chunk():
    """As fla's RWKV7 layer calls it (chunk_size=64, scale 1.0 by default)."""
    return _case("chunk_rwkv7", _rwkv7_leaves(dplr_recipe(T=40)), output_final_state=True,
                 chunk_size=64)  # fmt: skip


def rwkv7_recurrent():
    """fused_recurrent_rwkv7 returns the final state by default (and scales by 1 / sqrt(K))."""
    return _case("fused_recurrent_rwkv7", _rwkv7_leaves(dplr_recipe(T=40)), grads=False)


def rwkv7_fused_mul_reverse():
    """RWKV7's decoding loop (fla.ops.rwkv7 only): kk and the learning rate a, not a, b."""
    x = dplr_recipe(T=40)
    leaves = {"r": x["q"], "w": x["w"], "k": x["k"], "v": x["v"], "kk": x["kk"],
              "a": x["a_scale"], "initial_state": x["h0"]}  # fmt: skip
    return _case("fused_mul_recurrent_rwkv7", leaves, grads=False, output_final_state=True,
                 reverse=True)  # fmt: skip


def comba_chunk_grouped_l2norm():
    x = dplr_recipe(T=40, H=2, HV=4)
    leaves = _dplr_leaves(x, "p", "g", "beta", initial_state=x["h0"])
    return _case("chunk_comba", leaves, output_final_state=True, use_qk_l2norm_in_kernel=True)


def comba_chunk_varlen():
    x = dplr_recipe(T=70)
    leaves = _dplr_leaves(x, "p", "g", "beta", initial_state=torch.cat([x["h0"], -x["h0"]]))
    return _case("chunk_comba", leaves, output_final_state=True,
                 cu_seqlens=torch.tensor([0, 30, 70]))  # fmt: skip


def comba_recurrent_channel_beta():
    """A beta per value channel [B, T, HV, V] (fla's IS_BETA_HEADWISE); grouped heads."""
    x = dplr_recipe(T=40, H=2, HV=4)
    beta = torch.rand(1, 40, 4, 8, generator=torch.Generator().manual_seed(9))
    leaves = _dplr_leaves(x, "p", "g", beta=beta, initial_state=x["h0"])
    return _case("fused_recurrent_comba", leaves, grads=False, output_final_state=True,
                 use_qk_l2norm_in_kernel=True)  # fmt: skip


def _gdn2_leaves(x, **extra):
    return {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["gk"], "b": x["erase"],
            "w": x["write"], **extra}  # fmt: skip


def gdn2_chunk_in_kernel_v_first():
    x = dplr_recipe(T=40)
    gen = torch.Generator().manual_seed(10)
    leaves = _gdn2_leaves(
        x, g=torch.randn(1, 40, 2, 16, generator=gen), A_log=torch.randn(2, generator=gen),
        dt_bias=torch.randn(2 * 16, generator=gen),
        initial_state=x["h0"].transpose(-1, -2).contiguous(),
    )  # fmt: skip
    return _case("chunk_gdn2", leaves, output_final_state=True, use_qk_l2norm_in_kernel=True,
                 use_gate_in_kernel=True, state_v_first=True)  # fmt: skip


def gdn2_chunk_safe_gate_intermediate_varlen():
    x = dplr_recipe(T=70)
    gen = torch.Generator().manual_seed(11)
    leaves = _gdn2_leaves(x, g=torch.randn(1, 70, 2, 16, generator=gen),
                          initial_state=torch.cat([x["h0"], -x["h0"]]))  # fmt: skip
    return _case("chunk_gdn2", leaves, grads=False, output_final_state=True,
                 use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                 return_intermediate_states=True, cu_seqlens=torch.tensor([0, 30, 70]))  # fmt: skip


def gdn2_recurrent_grouped_in_kernel():
    x = dplr_recipe(T=40, H=2, HV=4)
    gen = torch.Generator().manual_seed(12)
    leaves = _gdn2_leaves(
        x, g=torch.randn(1, 40, 4, 16, generator=gen), A_log=torch.randn(4, generator=gen),
        dt_bias=torch.randn(4 * 16, generator=gen), initial_state=x["h0"],
    )  # fmt: skip
    return _case("fused_recurrent_gdn2", leaves, grads=False, output_final_state=True,
                 use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True)  # fmt: skip


FAST = [
    dplr_chunk, iplr_recurrent, rwkv7_recurrent, rwkv7_fused_mul_reverse,
    comba_chunk_grouped_l2norm, gdn2_recurrent_grouped_in_kernel,
    gdn_chunk_in_kernel, gdn_recurrent_every_gate, kda_chunk_in_kernel, kda_recurrent_in_kernel,
    gla_recurrent_gv_reverse, simple_gla_recurrent_g_and_gamma, delta_rule_recurrent_channel_beta,
]  # fmt: skip
SLOW = [gdn_chunk_varlen, gla_chunk_v_first, simple_gla_chunk_gamma_v_first, simple_gla_parallel,
        simple_gla_parallel_attentions, retention_recurrent_reverse, lightning_chunk,
        kda_intermediate_states_varlen, linear_attn_varlen, gdn_recurrent_varlen_in_kernel_gate,
        gdn_recurrent_mixed_dtypes, delta_rule_chunk_float16, hgrn_recurrent,
        dplr_chunk_varlen, dplr_recurrent_reverse_varlen, iplr_chunk, rwkv7_chunk,
        comba_chunk_varlen, comba_recurrent_channel_beta, gdn2_chunk_in_kernel_v_first,
        gdn2_chunk_safe_gate_intermediate_varlen]  # fmt: skip


# Edge cases: name -> (the leaves' builder (T, N initial states), whether fla has a backward
# there, keywords). fla's recurrent kernels of the delta-rule family have no backward; fla's
# ``fused_recurrent_rwkv6`` backward ignores the final state's gradient (test_rwkv6.py).
EDGE_CUTS = {"T1": None, "packed": [0, 1, 9, 23]}
CHUNK_CUTS = [0, 1, 9, 75]


def _states(h0, N):
    """N initial states from one: h0, -h0, h0 / 2, ..."""
    return torch.cat([h0 * (-1) ** n / (1 + n // 2) for n in range(N)])


def _named(*names, dplr=False, dtype=torch.float32):
    """The recipe's tensors under fla's names (``(recipe name, fla name)`` renames)."""

    def build(T, N):
        x = (dplr_recipe if dplr else recipe)(T=T)
        pairs = [(n, n) if isinstance(n, str) else n for n in names]
        leaves = {fla: x[ours] for ours, fla in pairs}
        leaves["initial_state"] = _states(x["h0"], N)
        return {n: t.to(dtype) for n, t in leaves.items()}

    return build


def _rwkv7_edge(T, N):
    x = dplr_recipe(T=T)
    return {**_rwkv7_leaves(x), "initial_state": _states(x["h0"], N)}


def _rwkv7_mul_edge(T, N):
    x = dplr_recipe(T=T)
    return {"r": x["q"], "w": x["w"], "k": x["k"], "v": x["v"], "kk": x["kk"],
            "a": x["a_scale"], "initial_state": _states(x["h0"], N)}  # fmt: skip


GDN = ("q", "k", "v", "g", "beta")
KDA = ("q", "k", "v", ("gk", "g"), "beta")
GDN2 = ("q", "k", "v", ("gk", "g"), ("erase", "b"), ("write", "w"))
DPLR = ("q", "k", "v", "a", "b", "gk")
EDGES = {
    "chunk_gated_delta_rule": (_named(*GDN), True, {}),
    "chunk_gdn": (_named(*GDN), True, {}),
    "fused_recurrent_gated_delta_rule": (_named(*GDN), False, {}),
    "fused_recurrent_gdn": (_named(*GDN), False, {}),
    "chunk_kda": (_named(*KDA), True, {}),
    "fused_recurrent_kda": (_named(*KDA), False, {}),
    "chunk_gla": (_named("q", "k", "v", ("gk", "g")), True, {}),
    "fused_recurrent_gla": (_named("q", "k", "v", "gk"), True, {}),
    "chunk_simple_gla": (_named("q", "k", "v", "g"), True, {}),
    "fused_chunk_simple_gla": (_named("q", "k", "v", "g"), True, {}),
    "fused_recurrent_simple_gla": (_named("q", "k", "v", "g"), True, {}),
    "fused_recurrent_delta_rule": (_named("q", "k", "v", "beta"), True, {}),
    # fla's chunk delta rule refuses float32 (float16 here, to float16's rounding)
    "chunk_delta_rule": (_named("q", "k", "v", "beta", dtype=torch.float16), True, {}),
    "chunk_dplr_delta_rule": (_named(*DPLR, dplr=True), True, {}),
    "fused_recurrent_dplr_delta_rule": (_named(*DPLR, dplr=True), False, {}),
    "chunk_iplr_delta_rule": (_named("q", "k", "v", "a", "b", dplr=True), False, {}),
    "fused_recurrent_iplr_delta_rule": (_named("q", "k", "v", "a", "b", dplr=True), True, {}),
    "chunk_comba": (_named("q", "k", "v", "p", "g", "beta", dplr=True), True, {}),
    "fused_recurrent_comba": (_named("q", "k", "p", "v", "g", "beta", dplr=True), False, {}),
    "chunk_gdn2": (_named(*GDN2, dplr=True), True, {}),
    "fused_recurrent_gdn2": (_named(*GDN2, dplr=True), False, {}),
    "chunk_rwkv7": (_rwkv7_edge, True, {"chunk_size": 64}),
    "fused_recurrent_rwkv7": (_rwkv7_edge, False, {}),
    "fused_mul_recurrent_rwkv7": (_rwkv7_mul_edge, False, {}),
}
SLOW_EDGES = [name for name in EDGES if name.startswith(("chunk_", "fused_chunk_"))]


def _edge(name, cuts):
    build, grads, kwargs = EDGES[name]
    tol = FLOAT16_TOL if name == "chunk_delta_rule" else TOL
    kwargs = {**kwargs, "output_final_state": True}
    if cuts is None:
        return _case(name, build(1, 1), grads, tol, **kwargs)
    return _case(name, build(cuts[-1], len(cuts) - 1), grads, tol, **kwargs,
                 cu_seqlens=torch.tensor(cuts))  # fmt: skip


def _fla(name):
    """fla's function: from ``fla.ops``, or the op module that alone exports it."""
    module = compat.FLA_SUBMODULE_ENTRY_POINTS.get(name)
    return getattr(ops if module is None else importlib.import_module(module), name)


def _compare(case):
    name, leaves, kwargs, grads, tol = case()
    if not grads:  # fla has no backward here (or intermediate states: inference only)
        with torch.inference_mode():
            a = flatten(getattr(compat, name)(**leaves, **kwargs))
            b = flatten(_fla(name)(**leaves, **kwargs))
        assert_same(a, b, tol, name)
        return
    a, da = outputs_and_grads(lambda **t: getattr(compat, name)(**t, **kwargs), leaves)
    b, db = outputs_and_grads(lambda **t: _fla(name)(**t, **kwargs), leaves)
    assert_same(a, b, tol, name)
    for n in leaves:
        assert_same([da[n]], [db[n]], tol, f"{name} d{n}")


@pytest.mark.parametrize("case", FAST, ids=lambda c: c.__name__)
def test_agrees_with_fla_kernels(case):
    _compare(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=lambda c: c.__name__)
def test_agrees_with_fla_kernels_more(case):
    _compare(case)


@pytest.mark.parametrize("cut", EDGE_CUTS)
@pytest.mark.parametrize("name", EDGES)
def test_edges_agree_with_fla_kernels(name, cut):
    """One token, and packed sequences of 1, 8 and 14 tokens from their own initial states."""
    _compare(lambda: _edge(name, EDGE_CUTS[cut]))


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_EDGES)
def test_packed_whole_and_partial_chunks_agree_with_fla_kernels(name):
    """Pieces of 1, 8 and 66 tokens: the last one a whole chunk of 64 and a partial one."""
    _compare(lambda: _edge(name, CHUNK_CUTS))


@pytest.mark.parametrize("cut", EDGE_CUTS)
def test_parallel_simple_gla_edges_agree_with_fla_kernel(cut):
    """The parallel form (no states): one token, and packed pieces of 1, 8 and 14 tokens."""
    cuts = EDGE_CUTS[cut]
    x = recipe(T=1 if cuts is None else cuts[-1])
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"]}
    cu = None if cuts is None else torch.tensor(cuts)
    _compare(lambda: _case("parallel_simple_gla", leaves, cu_seqlens=cu))


@pytest.mark.parametrize("lower_bound", [None, -3.0])
@pytest.mark.parametrize("T", [1, 37])
def test_kda_gate_agrees_with_fla_gate_kernel(T, lower_bound):
    """compat's ``kda_gate`` (the in-kernel gate of KDA and GDN-2) vs fla's ``fused_kda_gate``
    kernel: the gate and the gradients of the raw input, A_log and dt_bias."""
    gate_module = pytest.importorskip("fla.ops.kda.gate")
    gen = torch.Generator().manual_seed(4)
    leaves = {"g": torch.randn(1, T, 4, 16, generator=gen), "A_log": torch.randn(4, generator=gen),
              "dt_bias": torch.randn(64, generator=gen)}  # fmt: skip
    a, da = outputs_and_grads(
        lambda g, A_log, dt_bias: compat.kda_gate(g, A_log, dt_bias, lower_bound), leaves
    )
    b, db = outputs_and_grads(
        lambda g, A_log, dt_bias: gate_module.fused_kda_gate(g, A_log, dt_bias, lower_bound),
        leaves,
    )
    assert_same(a, b, TOL, "kda_gate")
    for n in leaves:
        assert_same([da[n]], [db[n]], TOL, f"kda_gate d{n}")
