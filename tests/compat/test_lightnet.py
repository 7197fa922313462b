"""compat's LightNet (``chunk_lightnet``, ``fused_recurrent_lightnet``) vs fla 0.6.0's Triton
kernels under the interpreter (float32): T = 1, T = 19 (not a multiple of fla's chunk), initial
states (S, z), packed sequences with a length-1 piece, ``state_v_first``, forward and the gradients
of every input; and the float64 reference (``linattn.reference.lightnet``; fla has no naive).

fla's gate kernel (``fla.ops.gsa.gate``) calls ``libdevice.log1p``, which triton 3.9's interpreter
leaves unimplemented; tests/fla_interpreter.py's ``log1p_on_cpu`` binds it to numpy's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn import compat
from linattn.compat.lightnet import lightnet_gate
from linattn.ops import _native
from linattn.reference.lightnet import lightnet as reference

from .helpers import assert_same, outputs_and_grads, recipe

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
ENTRY_POINTS = ("chunk_lightnet", "fused_recurrent_lightnet")


@pytest.fixture
def fla_lightnet(monkeypatch):
    pytest.importorskip("tests.fla_interpreter").log1p_on_cpu(monkeypatch)
    return pytest.importorskip("fla.ops.lightnet")


def _leaves(T=19, N=1, dtype=torch.float32, seed=0, states=True):
    x = recipe(T=T, H=2, K=16, V=8, dtype=torch.float64, seed=seed)
    leaves = {"q": x["q"], "k": 2 * torch.randn_like(x["q"]), "v": x["v"]}
    torch.manual_seed(seed)
    if states:
        h0 = torch.randn(N, 2, 16, 8, dtype=torch.float64)
        z0 = torch.randn(N, 1, 2, 16, dtype=torch.float64)
        leaves.update(h0=h0, z0=z0)
    return {n: t.to(dtype) for n, t in leaves.items()}


def _call(fn, kwargs):
    def run(h0=None, z0=None, **t):
        state = None if h0 is None and z0 is None else (h0, z0)
        return fn(**t, initial_state=state, **kwargs)

    return run


SLOW = pytest.mark.slow  # the interpreter takes 3-10 s a case: chunk_lightnet's packed one runs
# by default (fla's two entry points share the gate kernel; their GLA kernels are pinned in
# test_vs_fla.py)
CASES = [
    pytest.param(1, None, {"output_final_state": True}, id="T1", marks=SLOW),
    pytest.param(19, None, {"output_final_state": True}, id="T19", marks=SLOW),
    pytest.param(19, None, {"output_final_state": True, "state_v_first": True}, id="v_first",
                 marks=SLOW),
    pytest.param(19, torch.tensor([0, 1, 12, 19]), {"output_final_state": True}, id="varlen"),
    pytest.param(19, None, {}, id="no_final", marks=SLOW),
]  # fmt: skip


@pytest.mark.parametrize(
    "name", ["chunk_lightnet", pytest.param("fused_recurrent_lightnet", marks=SLOW)]
)
@pytest.mark.parametrize("T,cu_seqlens,kwargs", CASES)
def test_equals_fla_s_kernels(fla_lightnet, name, T, cu_seqlens, kwargs):
    N = 1 if cu_seqlens is None else len(cu_seqlens) - 1
    leaves = _leaves(T=T, N=N, states=bool(kwargs))
    if kwargs.get("state_v_first"):
        leaves["h0"] = leaves["h0"].transpose(-1, -2).contiguous()
    kwargs = {**kwargs, "cu_seqlens": cu_seqlens}
    a, da = outputs_and_grads(_call(getattr(compat, name), kwargs), leaves)
    b, db = outputs_and_grads(_call(getattr(fla_lightnet, name), kwargs), leaves)
    assert_same(a, b, 5e-5, name)
    for n in leaves:
        assert_same([da[n]], [db[n]], 5e-5, f"{name} d{n}")


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_equals_the_float64_reference_per_sequence(name):
    cu = torch.tensor([0, 1, 12, 12, 19])  # a length-1 and an empty sequence
    x = _leaves(T=19, N=4, dtype=torch.float64)
    o, (S, z) = getattr(compat, name)(
        x["q"], x["k"], x["v"], initial_state=(x["h0"], x["z0"]), output_final_state=True,
        cu_seqlens=cu,
    )  # fmt: skip
    for n in range(4):
        bos, eos = int(cu[n]), int(cu[n + 1])
        for h in range(2):
            ref_o, ref_S, ref_z = reference(
                *(x[m][0, bos:eos, h].numpy() for m in ("q", "k", "v")), scale=0.25,
                initial_state=x["h0"][n, h].numpy(), initial_normalizer=x["z0"][n, 0, h].numpy(),
            )  # fmt: skip
            np.testing.assert_allclose(o[0, bos:eos, h].numpy(), ref_o, rtol=0, atol=1e-12)
            np.testing.assert_allclose(S[n, h].numpy(), ref_S, rtol=0, atol=1e-12)
            np.testing.assert_allclose(z[n, 0, h].numpy(), ref_z, rtol=0, atol=1e-12)


def test_bad_input_is_refused_naming_the_argument():
    x = _leaves(T=5, N=2)
    q, k, v = x["q"], x["k"], x["v"]
    with pytest.raises(ValueError, match=r"initial_state\[1\] \(the log-normaliser\) must have"):
        compat.chunk_lightnet(q, k, v, initial_state=(None, x["z0"][:, 0]))
    with pytest.raises(ValueError, match="v must have H = 2 heads"):
        compat.fused_recurrent_lightnet(q, k, torch.cat([v, v], 2))
    with pytest.raises(ValueError, match="initial_state: the number of initial states"):
        compat.chunk_lightnet(q, k, v, initial_state=(x["h0"], None),
                              cu_seqlens=torch.tensor([0, 5]))  # fmt: skip
    with pytest.raises(TypeError, match="k must be a floating-point tensor"):
        compat.fused_recurrent_lightnet(q, k.long(), v)


def _gate_by_logcumsumexp(x, z0):
    """The gate by torch.logcumsumexp, one sequence [T, H, K], z0 [H, K] or None: (k, g, z_T)."""
    z = x.logcumsumexp(0) if z0 is None else torch.logaddexp(x.logcumsumexp(0), z0)
    start = torch.full_like(x[:1], float("-inf")) if z0 is None else z0[None]
    z_prev = torch.cat([start, z[:-1]])
    g = torch.where(z_prev == float("-inf"), torch.zeros_like(z), z_prev - z)
    return (x - z).exp(), g, z[-1]


@pytest.mark.parametrize("T", [1, 5, 200])
@pytest.mark.parametrize("z0", ["none", "finite", "some_inf"])
def test_the_gate_equals_logcumsumexp_s_in_float64(T, z0):
    # 200 tokens: the running log-sum-exp in chunks of 64 and over their ends; values and the
    # gradients of x and z0 through k, g and z_T
    gen = torch.Generator().manual_seed(T)
    x = 3 * torch.randn(2, T, 2, 3, generator=gen, dtype=torch.float64)
    start = None
    if z0 != "none":
        start = torch.randn(2, 1, 2, 3, generator=gen, dtype=torch.float64)
        if z0 == "some_inf":
            start[..., 0] = float("-inf")  # a layer's fresh state: no prior mass

    def run(gate):
        leaves = [t.clone().requires_grad_(True) for t in (x, start) if t is not None]
        k, g, z = gate(*leaves, *([None] if start is None else []))
        weights = torch.linspace(-1, 1, k.numel(), dtype=k.dtype).view_as(k)
        loss = (k * weights).sum() + (g * weights.flip(0)).sum()
        loss = loss + torch.where(z.isinf(), 0, z).square().sum()
        loss.backward()
        return [k, g, z, *(t.grad for t in leaves)]

    def reference(x, z0):
        parts = [_gate_by_logcumsumexp(x[n], None if z0 is None else z0[n, 0]) for n in range(2)]
        return tuple(torch.stack(p) for p in zip(*parts, strict=True))[:2] + (
            torch.stack([p[2] for p in parts])[:, None],
        )

    for ours, theirs in zip(run(lightnet_gate), run(reference), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)


@pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")
@pytest.mark.parametrize("z0", ["none", "finite", "some_inf"])
def test_the_fused_gate_in_float32_is_near_float64(z0, monkeypatch):
    # csrc/logsumexp.cpp serves float32 on the CPU: against the float64 PyTorch steps, values and
    # the gradients of x and z0 (keys of a wide spread: exponents far below the running maximum)
    gen = torch.Generator().manual_seed(7)
    x = 8 * torch.randn(2, 300, 2, 70, generator=gen, dtype=torch.float64)
    start = None
    if z0 != "none":
        start = 5 * torch.randn(2, 1, 2, 70, generator=gen, dtype=torch.float64)
        if z0 == "some_inf":
            start[..., :3] = float("-inf")
    used, kernel = [], _native.kernel
    monkeypatch.setattr(_native, "kernel", lambda name: used.append(name) or kernel(name))

    def run(dtype):
        leaves = [t.to(dtype).requires_grad_(True) for t in (x, start) if t is not None]
        k, g, z = lightnet_gate(*leaves, *([None] if start is None else []))
        weights = torch.linspace(-1, 1, k.numel(), dtype=dtype).view_as(k)
        loss = (k * weights).sum() + (g * weights.flip(0)).sum()
        (loss + torch.where(z.isinf(), 0, z).square().sum()).backward()
        return [t.detach().double() for t in (k, g, z, *(t.grad for t in leaves))]

    ours = run(torch.float32)
    assert used == ["logsumexp_gate_forward", "logsumexp_gate_backward"]
    for a, b in zip(ours, run(torch.float64), strict=True):
        finite = b.isfinite()
        assert torch.equal(a.isfinite(), finite)
        assert (a[finite] - b[finite]).abs().max() <= 2e-5 * b[finite].abs().max().clamp(min=1)
