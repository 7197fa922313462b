"""compat's generalized delta rule family (DPLR, IPLR, RWKV-7, Comba, GDN-2) vs fla 0.6.0's
pure-PyTorch references (``naive.py``), forward and the gradients of every input, initial
states, grouped value heads and packed sequences (each sequence against the reference run on it
alone). The references compute in float32 whatever the inputs; for float64 they run with their
float32 casts promoted (``float64_references``) and agree to rounding."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("tests.fla_interpreter")
dplr_naive = pytest.importorskip("fla.ops.generalized_delta_rule.dplr.naive")
iplr_naive = pytest.importorskip("fla.ops.generalized_delta_rule.iplr.naive")
comba_naive = pytest.importorskip("fla.ops.comba.naive")
gdn2_naive = pytest.importorskip("fla.ops.gdn2.naive")

from linattn import compat, ops  # noqa: E402
from linattn.ops.generalized_delta_rule import generalized_delta_rule  # noqa: E402

from .helpers import Promoted, assert_same, dplr_recipe, outputs_and_grads  # noqa: E402

DTYPES = pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32], ids=["float64", "float32"]
)
MODULES = (dplr_naive, iplr_naive, comba_naive, gdn2_naive)


@pytest.fixture
def references(monkeypatch, dtype):
    """fla's references as they are (float32), or with float32 read as float64 for float64
    inputs: their ``torch.float32`` / ``torch.float`` / ``.float()`` casts and the default dtype
    of their ``torch.zeros`` buffers."""
    if dtype != torch.float64:
        yield 3e-5
        return
    for module in MODULES:
        monkeypatch.setattr(module, "torch", Promoted())
    to_float = torch.Tensor.float
    monkeypatch.setattr(
        torch.Tensor, "float", lambda x: x if x.dtype == torch.float64 else to_float(x)
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield 1e-12
    finally:
        torch.set_default_dtype(default)


def _compare(ours, theirs, leaves, tol):
    a, da = outputs_and_grads(ours, leaves)
    b, db = outputs_and_grads(theirs, leaves)
    assert_same(a, b, tol, "o, S")
    for n in leaves:
        assert_same([da[n]], [db[n]], tol, f"d{n}")


def _head_first(fn):
    """fla's DPLR/IPLR references take [B, H, T, D]; as a [B, T, H, D] function (o, S)."""

    def wrapped(q, k, v, *rest, initial_state=None):
        o, S = fn(*(t.transpose(1, 2) for t in (q, k, v, *rest)), initial_state)
        return o.transpose(1, 2), S

    return wrapped


@DTYPES
@pytest.mark.parametrize("reference", ["dplr_recurrence", "dplr_chunkwise"])
def test_dplr(dtype, reference, references):
    x = dplr_recipe(T=32, dtype=dtype, mask_p=0.3)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "a": x["a"], "b": x["b"], "gk": x["gk"],
              "initial_state": x["h0"]}  # fmt: skip
    ref = _head_first(getattr(dplr_naive, reference))
    if reference == "dplr_chunkwise":
        ref = _head_first(lambda *t: dplr_naive.dplr_chunkwise(*t, chunk_size=16))
    for fn in (compat.chunk_dplr_delta_rule, compat.fused_recurrent_dplr_delta_rule):
        _compare(
            lambda fn=fn, **t: fn(**t, output_final_state=True),
            lambda q, k, v, a, b, gk, initial_state: ref(q, k, v, a, b, gk,
                                                          initial_state=initial_state),
            leaves, references,
        )  # fmt: skip


@DTYPES
@pytest.mark.parametrize("reference", ["iplr_recurrence", "iplr_chunkwise"])
def test_iplr(dtype, reference, references):
    x = dplr_recipe(T=32, dtype=dtype)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "a": x["a"], "b": x["b"],
              "initial_state": x["h0"]}  # fmt: skip
    ref = _head_first(getattr(iplr_naive, reference))
    if reference == "iplr_chunkwise":
        ref = _head_first(lambda *t: iplr_naive.iplr_chunkwise(*t, chunk_size=16))
    for fn in (compat.chunk_iplr_delta_rule, compat.fused_recurrent_iplr_delta_rule):
        _compare(
            lambda fn=fn, **t: fn(**t, output_final_state=True),
            lambda q, k, v, a, b, initial_state: ref(q, k, v, a, b, initial_state=initial_state),
            leaves, references,
        )  # fmt: skip


@DTYPES
def test_rwkv7(dtype, references):
    """RWKV-7's a = -kk reads, b = kk * a_scale is the direction (fla's test_rwkv7 recipe),
    against fla's DPLR recurrence; compat's entry points and ``linattn.ops.rwkv7``."""
    x = dplr_recipe(T=37, dtype=dtype)
    K = x["q"].shape[-1]
    leaves = {"r": x["q"], "w": x["w"], "k": x["k"], "v": x["v"], "a": -x["kk"],
              "b": x["kk"] * x["a_scale"], "initial_state": x["h0"]}  # fmt: skip

    def theirs(r, w, k, v, a, b, initial_state):  # dplr_recurrence scales by 1 / sqrt(K)
        return _head_first(dplr_naive.dplr_recurrence)(
            r, k, v, a, b, w, initial_state=initial_state
        )

    entry_points = [
        lambda **t: compat.chunk_rwkv7(**t, scale=K**-0.5, output_final_state=True),
        lambda **t: compat.fused_recurrent_rwkv7(**t),
        lambda **t: ops.rwkv7(**t, scale=None, output_final_state=True, chunk_size=5),
        lambda **t: ops.rwkv7(**t, scale=None, output_final_state=True, mode="recurrent"),
    ]
    for ours in entry_points:
        _compare(ours, theirs, leaves, references)
    leaves = {**leaves, "kk": x["kk"], "a": x["a_scale"]}  # the decoding loop's inputs
    del leaves["b"]
    _compare(
        lambda **t: compat.fused_mul_recurrent_rwkv7(**t, scale=None, output_final_state=True),
        lambda kk, a, **t: theirs(**t, a=-kk, b=kk * a), leaves, references,
    )  # fmt: skip


@DTYPES
def test_comba(dtype, references):
    """Both entry points equal fla's ``naive_chunk_comba`` (which its kernels follow)."""
    x = dplr_recipe(T=40, dtype=dtype)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "p": x["p"], "g": x["g"],
              "beta": x["beta"], "initial_state": x["h0"]}  # fmt: skip
    for fn in (compat.chunk_comba, compat.fused_recurrent_comba):
        _compare(
            lambda fn=fn, **t: fn(**t, output_final_state=True),
            lambda **t: comba_naive.naive_chunk_comba(**t, output_final_state=True),
            leaves, references,
        )  # fmt: skip


@DTYPES
def test_comba_recurrent_reference_reads_the_decayed_state(dtype, references):
    """fla's ``naive_recurrent_comba`` differs from its kernels and ``naive_chunk_comba``: it
    reads the state after the decay, the generalized delta rule with b = exp(g) p."""
    x = dplr_recipe(T=40, dtype=dtype)
    q, k, v, p, g, beta, h0 = (x[n] for n in ("q", "k", "v", "p", "g", "beta", "h0"))
    theirs = comba_naive.naive_recurrent_comba(q, k, v, p, beta, g, initial_state=h0,
                                               output_final_state=True)  # fmt: skip
    ours = generalized_delta_rule(
        q, k, beta[..., None] * v, -beta[..., None] * k, g.exp()[..., None] * p, g,
        initial_state=h0, output_final_state=True,
    )  # fmt: skip
    assert_same(list(ours), list(theirs), references, "b = exp(g) p")
    kernels = compat.chunk_comba(q, k, v, p, g, beta, initial_state=h0, output_final_state=True)
    assert (kernels[0] - theirs[0]).abs().max() > 1e-2  # not to rounding: another mechanism


@DTYPES
@pytest.mark.parametrize("reference", ["naive_recurrent_gdn2", "naive_chunk_gdn2"])
def test_gdn2(dtype, reference, references):
    x = dplr_recipe(T=40, dtype=dtype)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["gk"], "b": x["erase"],
              "w": x["write"], "initial_state": x["h0"]}  # fmt: skip
    tol = references if reference == "naive_recurrent_gdn2" or dtype == torch.float64 else 1e-4
    for fn in (compat.chunk_gdn2, compat.fused_recurrent_gdn2):
        _compare(
            lambda fn=fn, **t: fn(**t, output_final_state=True),
            lambda **t: getattr(gdn2_naive, reference)(**t, output_final_state=True),
            leaves, tol,
        )  # fmt: skip


def _varlen_cases():
    """(compat function, its per-token inputs, the reference on one sequence)."""
    dplr = _head_first(dplr_naive.dplr_recurrence)
    iplr = _head_first(iplr_naive.iplr_recurrence)
    return {
        "fused_recurrent_iplr_delta_rule": (
            ("a", "b"),
            lambda q, k, v, a, b, S: iplr(q, k, v, a, b, initial_state=S),
        ),
        "chunk_dplr_delta_rule": (
            ("a", "b", "gk"),
            lambda q, k, v, a, b, gk, S: dplr(q, k, v, a, b, gk, initial_state=S),
        ),
        "chunk_comba": (
            ("p", "g", "beta"),
            lambda q, k, v, p, g, beta, S: comba_naive.naive_chunk_comba(
                q, k, v, p, g, beta, initial_state=S, output_final_state=True
            ),
        ),
        "chunk_gdn2": (
            ("gk", "erase", "write"),
            lambda q, k, v, g, b, w, S: gdn2_naive.naive_recurrent_gdn2(
                q, k, v, g, b, w, initial_state=S, output_final_state=True
            ),
        ),
    }


@pytest.mark.parametrize("dtype", [torch.float64], ids=["float64"])
@pytest.mark.parametrize(
    "name",
    ["chunk_dplr_delta_rule", "fused_recurrent_iplr_delta_rule", "chunk_comba", "chunk_gdn2"],
)
def test_varlen(name, dtype, references):
    """Packed sequences with one initial state each: each sequence as the reference alone."""
    names, reference = _varlen_cases()[name]
    x = dplr_recipe(T=45, dtype=dtype)
    cu = torch.tensor([0, 13, 16, 45])
    h0 = torch.cat([x["h0"], -x["h0"], 0.5 * x["h0"]])
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], **{n: x[n] for n in names},
              "initial_state": h0}  # fmt: skip
    fla_names = {"erase": "b", "write": "w"}
    if name == "chunk_gdn2":
        fla_names["gk"] = "g"

    def ours(**t):
        t = {fla_names.get(n, n): v for n, v in t.items()}
        return getattr(compat, name)(**t, cu_seqlens=cu, output_final_state=True)

    def theirs(q, k, v, initial_state, **rest):
        outs, finals = [], []
        for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
            part = [t[:, s:e] for t in (q, k, v, *(rest[m] for m in names))]
            o, S = reference(*part, initial_state[n : n + 1])
            outs.append(o)
            finals.append(S)
        return torch.cat(outs, 1), torch.cat(finals)

    _compare(ours, theirs, leaves, references)


def test_comba_grouped_heads_and_channel_beta():
    """Grouped value heads equal the same heads with q, k, p repeated; a beta per value channel
    (fused_recurrent_comba) equals each value channel run as a head of its own."""
    x = dplr_recipe(T=21, H=2, HV=4, dtype=torch.float64)
    q, k, v, p, g, beta, h0 = (x[n] for n in ("q", "k", "v", "p", "g", "beta", "h0"))
    o, S = compat.chunk_comba(q, k, v, p, g, beta, initial_state=h0, output_final_state=True)
    rep = [t.repeat_interleave(2, 2) for t in (q, k, p)]
    o2, S2 = compat.chunk_comba(rep[0], rep[1], v, rep[2], g, beta, initial_state=h0,
                                output_final_state=True)  # fmt: skip
    assert_same([o, S], [o2, S2], 1e-13, "grouped heads")
    beta_c = torch.rand(*v.shape, generator=torch.Generator().manual_seed(3), dtype=v.dtype)
    o, S = compat.fused_recurrent_comba(q, k, p, v, g, beta_c, initial_state=h0,
                                        output_final_state=True)  # fmt: skip
    for c in range(v.shape[-1]):
        oc, Sc = compat.fused_recurrent_comba(
            q, k, p, v[..., c : c + 1], g, beta_c[..., c], initial_state=h0[..., c : c + 1],
            output_final_state=True,
        )  # fmt: skip
        assert_same([o[..., c : c + 1], S[..., c : c + 1]], [oc, Sc], 1e-13, f"channel {c}")


def test_gdn2_grouped_heads_and_in_kernel_gate():
    """fused_recurrent_gdn2 with grouped value heads equals the repeated heads; its in-kernel
    gate (A_log, dt_bias; lower_bound) equals the gate computed outside."""
    x = dplr_recipe(T=21, H=2, HV=4, dtype=torch.float64)
    q, k, v, g, b, w, h0 = (x[n] for n in ("q", "k", "v", "gk", "erase", "write", "h0"))
    o, S = compat.fused_recurrent_gdn2(q, k, v, g, b, w, initial_state=h0, output_final_state=True)
    rep = [t.repeat_interleave(2, 2) for t in (q, k)]
    o2, S2 = compat.chunk_gdn2(*rep, v, g, b, w, initial_state=h0, output_final_state=True)
    assert_same([o, S], [o2, S2], 1e-12, "grouped heads")
    gen = torch.Generator().manual_seed(4)
    raw = torch.randn(g.shape, generator=gen, dtype=g.dtype)
    A_log, dt_bias = torch.randn(4, generator=gen).double(), torch.randn(64, generator=gen).double()
    for lower_bound in (None, -3.0):
        gate = compat.kda_gate(raw, A_log, dt_bias, lower_bound)
        o, S = compat.fused_recurrent_gdn2(
            q, k, v, raw, b, w, A_log, dt_bias, initial_state=h0, output_final_state=True,
            use_gate_in_kernel=True, lower_bound=lower_bound,
        )  # fmt: skip
        o2, S2 = compat.fused_recurrent_gdn2(q, k, v, gate, b, w, initial_state=h0,
                                             output_final_state=True)  # fmt: skip
        assert_same([o, S], [o2, S2], 1e-13, f"in-kernel gate, lower_bound={lower_bound}")
    # fla's recurrent kernel reads a missing A_log as 1.0: -e softplus(g + dt_bias)
    o, _ = compat.fused_recurrent_gdn2(q, k, v, raw, b, w, use_gate_in_kernel=True)
    gate = -math.e * torch.nn.functional.softplus(raw)
    assert_same([o], [compat.fused_recurrent_gdn2(q, k, v, gate, b, w)[0]], 1e-13, "A_log None")
