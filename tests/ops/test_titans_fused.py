"""linattn.ops.titans' fused chunk form (csrc/ttt.cpp, Titans' kernels): its float32 outputs, final
memories, saved memories and gradients against the PyTorch chunk form run in float64 on the same
inputs (autograd's gradients), packed sequences, the choice of path, and the kernels' refusals."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import _native, backend
from linattn.ops.titans import titans_linear
from linattn.registry.cases import titans_case
from tests.ops.weighted_gradients import close, outputs_and_gradients

pytestmark = pytest.mark.skipif(
    not _native.available(), reason="the compiled kernels are not loaded"
)

NAMES = ("q", "k", "v", "w", "b", "theta", "alpha", "eta", "S0_M", "S0_S")


def _inputs(B, T, H, D, seed, rates=None):
    x = titans_case().inputs(B, T, H, D, D, seed=seed, dtype=torch.float64)
    if rates is not None:  # the gates' edges: eta = 0 (no momentum), alpha = 1 (a reset)
        x["eta"][:, ::3] = rates[0]
        x["alpha"][:, 1::4] = rates[1]
    return [x[n] for n in NAMES]


def _call(t, size, state=True, cu_seqlens=None):
    o, S = titans_linear(*t[:8], chunk_size=size, mode="chunk",
                         initial_state=tuple(t[8:]) if state else None, output_final_state=True,
                         cu_seqlens=cu_seqlens)  # fmt: skip
    return o, *S


def _outputs_and_gradients(t, size, state, cu_seqlens=None, seed=0):
    def call(leaves):
        return _call(leaves, size, state=state, cu_seqlens=cu_seqlens)

    return outputs_and_gradients(call, t, 8, state, seed)


@pytest.mark.parametrize(
    ("T", "size"), [(1, 4), (8, 4), (11, 4), (10, 3), (5, 1), (6, 16), (150, 4), (70, 16)]
)
def test_outputs_and_gradients_equal_the_float64_chunk_form(T, size):
    t64 = _inputs(2, T, 3, 8, seed=T + size)
    want, dwant = _outputs_and_gradients(t64, size, True)
    got, dgot = _outputs_and_gradients([x.float() for x in t64], size, True)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        close(g, w)
    for g, w in zip(dgot, dwant, strict=True):
        close(g, w, 1e-4)


@pytest.mark.parametrize(("T", "size"), [(8, 4), (150, 4), (70, 16)])
def test_zero_initial_state_within_the_float32_loops_rounding(T, size):
    """Without an initial state the first chunk's keys read a zero memory, whose layer norm
    divides by sqrt(eps) = 1e-3: float32's rounding is amplified on any path. The fused
    kernels' distance to float64 is bounded by the float32 PyTorch loop's own (25 times, or
    the tolerance of the test above)."""
    t64 = _inputs(2, T, 3, 8, seed=T + size)
    want, dwant = _outputs_and_gradients(t64, size, False)
    got, dgot = _outputs_and_gradients([x.float() for x in t64], size, False)
    with backend("torch"):
        loop, dloop = _outputs_and_gradients([x.float() for x in t64], size, False)
    for g, lp, w in zip((*got, *dgot), (*loop, *dloop), (*want, *dwant), strict=True):
        err = (g.double() - w).abs().max().item()
        loop_err = (lp.double() - w).abs().max().item()
        assert err <= max(1e-4 * max(1.0, w.abs().max().item()), 25 * loop_err), (err, loop_err)


def test_gates_at_their_edges():
    t64 = _inputs(1, 13, 2, 8, seed=2, rates=(0.0, 1.0))
    want, dwant = _outputs_and_gradients(t64, 4, True)
    got, dgot = _outputs_and_gradients([x.float() for x in t64], 4, True)
    for g, w in zip((*got, *dgot), (*want, *dwant), strict=True):
        close(g, w, 1e-4)


def test_the_fused_kernels_run_for_float32_and_not_for_float64(monkeypatch):
    called = []
    kernel = _native.kernel
    monkeypatch.setattr(_native, "kernel", lambda name: called.append(name) or kernel(name))
    t = [x.float().requires_grad_(True) for x in _inputs(1, 6, 2, 4, seed=1)]
    sum(x.sum() for x in _call(t, 4)).backward()
    assert called == ["titans_forward", "titans_backward"]
    called.clear()
    with torch.no_grad():
        _call(t, 4)
    assert called == ["titans_forward"]
    called.clear()
    _call(_inputs(1, 6, 2, 4, seed=1), 4)
    with backend("torch"):
        _call([x.detach() for x in t], 4)
    titans_linear(*[x.detach() for x in t[:8]], chunk_size=4, mode="recurrent")
    assert called == []


def test_no_grad_equals_the_recorded_forward():
    t = [x.float() for x in _inputs(2, 13, 2, 8, seed=3)]
    with torch.no_grad():
        plain = _call(t, 4)
    recorded = _call([x.clone().requires_grad_(True) for x in t], 4)
    for a, b in zip(plain, recorded, strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)


def test_saved_memories_are_those_entering_every_few_chunks():
    q, k, v, w, b, theta, alpha, eta, M0, S0 = [x.float() for x in _inputs(2, 10, 3, 8, seed=4)]
    rates = (theta[..., 0], alpha[..., 0], eta[..., 0])
    kernel = _native.kernel("titans_forward")
    _, _, _, _, Ms, Ss = kernel(q, k, v, *rates, w, b, M0, S0, 1e-6, 2, 2, True)
    assert Ms.shape == Ss.shape == (2, 3, 3, 8, 8)  # 5 chunks, 2 a saved state
    for j in range(3):
        stop = 4 * j
        piece = (
            [x[:, :stop] for x in (q, k, v)] + [w, b] + [x[:, :stop] for x in (theta, alpha, eta)]
        )
        _, M, S = _call([*piece, M0, S0], 2)
        torch.testing.assert_close(Ms[:, :, j], M, rtol=0, atol=0)
        torch.testing.assert_close(Ss[:, :, j], S, rtol=0, atol=0)


def test_packed_sequences_equal_the_float64_chunk_form():
    t64 = _inputs(1, 11, 2, 4, seed=8)
    t64[8] = torch.cat([t64[8], -t64[8], 2 * t64[8]])
    t64[9] = torch.cat([t64[9]] * 3)
    cu = torch.tensor([0, 1, 6, 11])
    want, dwant = _outputs_and_gradients(t64, 4, True, cu)
    got, dgot = _outputs_and_gradients([x.float() for x in t64], 4, True, cu)
    for g, w in zip((*got, *dgot), (*want, *dwant), strict=True):
        close(g, w, 1e-4)


def test_kernels_refuse_bad_input_by_name():
    q, k, v, w, b, theta, alpha, eta, M0, S0 = [x.float() for x in _inputs(1, 5, 2, 4, seed=6)]
    r = (theta[..., 0], alpha[..., 0], eta[..., 0])
    forward = _native.kernel("titans_forward")
    with pytest.raises(RuntimeError, match="alpha must be of shape"):
        forward(q, k, v, r[0], r[1][:, :2], r[2], w, b, M0, S0, 1e-6, 4, 1, False)
    with pytest.raises(RuntimeError, match="S0 must be of shape"):
        forward(q, k, v, *r, w, b, M0, S0[:1, :1], 1e-6, 4, 1, False)
    with pytest.raises(RuntimeError, match="v must be float32"):
        forward(q, k, v.double(), *r, w, b, M0, S0, 1e-6, 4, 1, False)
    with pytest.raises(RuntimeError, match="size"):
        forward(q, k, v, *r, w, b, M0, S0, 1e-6, 0, 1, False)
    with pytest.raises(RuntimeError, match="every"):
        forward(q, k, v, *r, w, b, M0, S0, 1e-6, 4, 0, False)
    o, z, _, _, Ms, Ss = forward(q, k, v, *r, w, b, M0, S0, 1e-6, 4, 1, True)
    backward = _native.kernel("titans_backward")
    with pytest.raises(RuntimeError, match="Ss must be of shape"):
        backward(q, k, v, *r, w, b, Ms, Ss[:, :1], z, o, None, None, 1e-6, 4, 1)
    with pytest.raises(RuntimeError, match="dM must be of shape"):
        backward(q, k, v, *r, w, b, Ms, Ss, z, o, M0[..., :1], None, 1e-6, 4, 1)


@pytest.mark.parametrize("D", [16, 48, 64])
@pytest.mark.parametrize(("T", "size"), [(37, 4), (70, 16)])
def test_head_sizes_of_whole_vectors_take_the_register_tiles(D, T, size):
    # D a multiple of the vector width (8 or 16 floats) runs the hand-written products, the
    # other tests' D = 4 and 8 mostly the BLAS: both paths against float64
    t64 = _inputs(1, T, 2, D, seed=D + T)
    want, dwant = _outputs_and_gradients(t64, size, True)
    got, dgot = _outputs_and_gradients([x.float() for x in t64], size, True)
    for g, w in zip(got, want, strict=True):
        close(g, w)
    for g, w in zip(dgot, dwant, strict=True):
        close(g, w, 1e-4)


# opcheck's checks of the compiled ops: the schema, the registered autograd (none: the
# autograd.Function above the ops owns it) and the fake (Meta) kernels against the real outputs'
# shapes, dtypes and strides
OPCHECK = ("test_schema", "test_autograd_registration", "test_faketensor")


def _op_inputs(B, T, packed, strided=False):
    """The forward op's tensors as ``titans_linear`` passes them: B sequences of T tokens, or
    (packed) one sequence's rows sliced from a packed batch of three; strided: q, k, v rows at
    twice D's stride. Every tensor requires grad (the ops themselves record none)."""
    t = [x.float() for x in _inputs(B, T + 5 if packed else T, 2, 4, 11)]
    q, k, v, w, b, theta, alpha, eta, M0, S0 = t
    if packed:
        q, k, v, theta, alpha, eta = (x[:, 2 : 2 + T] for x in (q, k, v, theta, alpha, eta))
    if strided:
        q, k, v = (torch.cat([x, x], -1)[..., :4] for x in (q, k, v))
    x = [q, k, v, theta[..., 0], alpha[..., 0], eta[..., 0], w, b, M0, S0]
    return [t.detach().requires_grad_(True) for t in x]


@pytest.mark.parametrize(
    ("B", "T", "packed", "strided"),
    [(2, 7, False, False), (2, 5, False, True), (1, 1, False, False), (1, 6, True, False),
     (1, 1, True, False)],
)  # fmt: skip
@pytest.mark.parametrize("keep", [True, False])
def test_opcheck_the_compiled_ops(B, T, packed, strided, keep):
    """titans_forward's fake kernel gives z and the saved memories [B, H, ceil(n / every), D, D]
    only when keep (n = ceil(T / size) chunks); titans_backward's, the gradients with and
    without the final memories' gradients (a broadcast d_o: stride 0 but along D)."""
    x = _op_inputs(B, T, packed, strided)
    op = torch.ops.linattn_native
    size, every = 2, 2
    forward = (*x, 1e-6, size, every, keep)
    torch.library.opcheck(op.titans_forward.default, forward, test_utils=OPCHECK)
    if not keep:
        return
    with torch.no_grad():
        o, z, M, S, Ms, Ss = op.titans_forward(*forward)
    assert Ms.shape == Ss.shape == (B, 2, (T + 3) // 4, 4, 4)
    d_o = torch.randn(1, 1, 1, 4).expand(o.shape) if strided else torch.randn_like(o)
    for dM, dS in ((torch.randn_like(M), torch.randn_like(S)), (None, None)):
        back = (*x[:8], Ms, Ss, z, d_o, dM, dS, 1e-6, size, every)
        torch.library.opcheck(op.titans_backward.default, back, test_utils=OPCHECK)


def test_the_fake_kernels_refuse_bad_input_by_name():
    q, k, v, th, al, e, w, b, M0, S0 = (t.detach().to("meta") for t in _op_inputs(1, 5, False))
    forward = torch.ops.linattn_native.titans_forward
    with pytest.raises(RuntimeError, match="alpha must be of shape"):
        forward(q, k, v, th, al[:, :2], e, w, b, M0, S0, 1e-6, 4, 1, False)
    with pytest.raises(RuntimeError, match="v must be float32"):
        forward(q, k, v.double(), th, al, e, w, b, M0, S0, 1e-6, 4, 1, False)
    o, z, _, _, Ms, Ss = forward(q, k, v, th, al, e, w, b, M0, S0, 1e-6, 4, 1, True)
    assert o.device.type == "meta" and Ms.shape == (1, 2, 2, 4, 4)
    with pytest.raises(RuntimeError, match="dM must be of shape"):
        torch.ops.linattn_native.titans_backward(
            q, k, v, th, al, e, w, b, Ms, Ss, z, o, M0[..., :1], None, 1e-6, 4, 1
        )
