"""linattn.ops.ttt's fused dual form (csrc/ttt.cpp): its float32 outputs, final states, saved
states and gradients against the PyTorch dual form run in float64 on the same inputs (autograd's
gradients), packed sequences, the choice of path, and the kernels' refusals."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import _native, backend
from linattn.ops import ttt as ttt_module
from linattn.ops.ttt import ttt_linear
from linattn.registry.cases import ttt_case
from tests.ops.weighted_gradients import close, outputs_and_gradients

pytestmark = pytest.mark.skipif(
    not _native.available(), reason="the compiled kernels are not loaded"
)

NAMES = ("q", "k", "v", "w", "b", "eta", "S0_W", "S0_h")


def _inputs(B, T, H, D, seed):
    x = ttt_case().inputs(B, T, H, D, D, seed=seed, dtype=torch.float64)
    return [x[n] for n in NAMES]


def _call(t, size, scale=0.4, state=True, cu_seqlens=None):
    o, S = ttt_linear(*t[:6], scale=scale, mini_batch_size=size, mode="chunk",
                      initial_state=tuple(t[6:]) if state else None, output_final_state=True,
                      cu_seqlens=cu_seqlens)  # fmt: skip
    return o, *S


def _outputs_and_gradients(t, size, state, cu_seqlens=None, seed=0):
    def call(leaves):
        return _call(leaves, size, state=state, cu_seqlens=cu_seqlens)

    return outputs_and_gradients(call, t, 6, state, seed)


@pytest.mark.parametrize(
    ("T", "size"), [(1, 4), (8, 4), (11, 4), (10, 3), (5, 1), (6, 16), (150, 4), (70, 16)]
)
@pytest.mark.parametrize("state", [True, False])
def test_outputs_and_gradients_equal_the_float64_dual_form(T, size, state):
    t64 = _inputs(2, T, 3, 8, seed=T + size)
    want, dwant = _outputs_and_gradients(t64, size, state)
    got, dgot = _outputs_and_gradients([x.float() for x in t64], size, state)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        close(g, w)
    for g, w in zip(dgot, dwant, strict=True):
        close(g, w, 1e-4)


def test_the_fused_kernels_run_for_float32_and_not_for_float64(monkeypatch):
    called = []
    kernel = _native.kernel
    monkeypatch.setattr(_native, "kernel", lambda name: called.append(name) or kernel(name))
    t = [x.float().requires_grad_(True) for x in _inputs(1, 6, 2, 4, seed=1)]
    sum(x.sum() for x in _call(t, 4)).backward()
    assert called == ["ttt_forward", "ttt_backward"]
    called.clear()
    with torch.no_grad():
        _call(t, 4)
    assert called == ["ttt_forward"]
    called.clear()
    _call(_inputs(1, 6, 2, 4, seed=1), 4)
    with backend("torch"):
        _call([x.detach() for x in t], 4)
    ttt_linear(*[x.detach() for x in t[:6]], mini_batch_size=4, mode="recurrent")
    assert called == []


def test_no_grad_equals_the_recorded_forward():
    t = [x.float() for x in _inputs(2, 13, 2, 8, seed=3)]
    with torch.no_grad():
        plain = _call(t, 4)
    recorded = _call([x.clone().requires_grad_(True) for x in t], 4)
    for a, b in zip(plain, recorded, strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)


def test_saved_states_are_the_states_entering_every_few_mini_batches():
    q, k, v, w, b, eta, W0, h0 = [x.float() for x in _inputs(2, 10, 3, 8, seed=4)]
    kernel = _native.kernel("ttt_forward")
    h0_rows = h0[:, :, 0].contiguous()
    _, _, _, _, Ws, hs = kernel(q, k, v, eta[..., 0], w, b, W0, h0_rows, 0.4, 1e-6, 2, 2, True)
    assert Ws.shape == (2, 3, 3, 8, 8) and hs.shape == (2, 3, 3, 8)  # 5 mini-batches, 2 a state
    for j in range(3):
        stop = 4 * j
        _, W, h = _call([q[:, :stop], k[:, :stop], v[:, :stop], w, b, eta[:, :stop], W0, h0], 2)
        torch.testing.assert_close(Ws[:, :, j], W, rtol=0, atol=0)
        torch.testing.assert_close(hs[:, :, j], h[:, :, 0], rtol=0, atol=0)


def test_packed_sequences_equal_the_float64_dual_form():
    t64 = _inputs(1, 11, 2, 4, seed=8)
    t64[6] = torch.cat([t64[6], -t64[6], 2 * t64[6]])
    t64[7] = torch.cat([t64[7]] * 3)
    cu = torch.tensor([0, 1, 6, 11])
    want, dwant = _outputs_and_gradients(t64, 4, True, cu)
    got, dgot = _outputs_and_gradients([x.float() for x in t64], 4, True, cu)
    for g, w in zip((*got, *dgot), (*want, *dwant), strict=True):
        close(g, w, 1e-4)


def test_strided_inputs_and_gradients():
    """q, k, v as views of one [B, T, H, 3 D] tensor, o.sum()'s expanded gradient."""
    q, k, v, w, b, eta, W0, h0 = [x.float() for x in _inputs(1, 9, 2, 8, seed=5)]
    qkv = torch.cat([q, k, v], -1).requires_grad_(True)
    o, W, h = _call([*qkv.split(8, -1), w, b, eta, W0, h0], 4)
    (o.sum() + W.sum()).backward()
    qkv64 = qkv.detach().double().requires_grad_(True)
    o64, W64, _ = _call([*qkv64.split(8, -1), *(x.double() for x in (w, b, eta, W0, h0))], 4)
    (o64.sum() + W64.sum()).backward()
    close(o, o64)
    close(qkv.grad, qkv64.grad, 1e-4)


def test_rows_keeps_a_broadcast_gradient_expanded():
    ones = torch.ones(()).expand(2, 5, 3, 4)
    rows = ttt_module._rows(ones)
    assert rows.stride() == (0, 0, 0, 1) and torch.equal(rows, ones)
    x = torch.randn(2, 3, 4).mT
    assert ttt_module._rows(x).is_contiguous() and torch.equal(ttt_module._rows(x), x)


def test_kernels_refuse_bad_input_by_name():
    q, k, v, w, b, eta, W0, h0 = [x.float() for x in _inputs(1, 5, 2, 4, seed=6)]
    e, h0 = eta[..., 0], h0[:, :, 0].contiguous()
    forward = _native.kernel("ttt_forward")
    with pytest.raises(RuntimeError, match="w must be of shape"):
        forward(q, k, v, e, w[:1], b, W0, h0, 0.5, 1e-6, 4, 1, False)
    with pytest.raises(RuntimeError, match="q must be float32"):
        forward(q.double(), k, v, e, w, b, W0, h0, 0.5, 1e-6, 4, 1, False)
    with pytest.raises(RuntimeError, match="size"):
        forward(q, k, v, e, w, b, W0, h0, 0.5, 1e-6, 0, 1, False)
    with pytest.raises(RuntimeError, match="eps"):
        forward(q, k, v, e, w, b, W0, h0, 0.5, -1.0, 4, 1, False)
    k_strided = torch.zeros(1, 5, 2, 8)[..., ::2]  # stride 2 along D
    with pytest.raises(RuntimeError, match="k must have unit stride"):
        forward(q, k_strided, v, e, w, b, W0, h0, 0.5, 1e-6, 4, 1, False)
    with pytest.raises(RuntimeError, match="every"):
        forward(q, k, v, e, w, b, W0, h0, 0.5, 1e-6, 4, 0, False)
    with pytest.raises(RuntimeError, match="W0 must be of shape"):
        forward(q, k, v, e, w, b, W0[..., :2], h0, 0.5, 1e-6, 4, 1, False)
    o, z, _, _, Ws, hs = forward(q, k, v, e, w, b, W0, h0, 0.5, 1e-6, 4, 1, True)
    backward = _native.kernel("ttt_backward")
    with pytest.raises(RuntimeError, match="Ws must be of shape"):
        backward(q, k, v, e, w, b, Ws[:, :, :1], hs, z, o, None, None, 0.5, 1e-6, 4, 1)
    with pytest.raises(RuntimeError, match="d_o must be of shape"):
        backward(q, k, v, e, w, b, Ws, hs, z, o[:, :1], None, None, 0.5, 1e-6, 4, 1)


def test_fused_is_chosen_only_for_the_dual_form_on_float32():
    x = torch.zeros(1, 2, 1, 4)
    assert ttt_module._fused("chunk", x, x)
    assert not ttt_module._fused("recurrent", x, x)
    assert not ttt_module._fused("chunk", x, x.double())


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
    """The forward op's tensors as ``ttt_linear`` passes them: B sequences of T tokens, or (packed)
    one sequence's rows sliced from a packed batch of three; strided: q, k, v rows at twice D's
    stride. Every tensor requires grad (the ops themselves record none)."""
    q, k, v, w, b, eta, W0, h0 = [x.float() for x in _inputs(B, T + 5 if packed else T, 2, 4, 11)]
    if packed:
        q, k, v, eta = (x[:, 2 : 2 + T] for x in (q, k, v, eta))
    if strided:
        q, k, v = (torch.cat([x, x], -1)[..., :4] for x in (q, k, v))
    x = [q, k, v, eta[..., 0], w, b, W0, h0[:, :, 0].contiguous()]
    return [t.detach().requires_grad_(True) for t in x]


@pytest.mark.parametrize(
    ("B", "T", "packed", "strided"),
    [(2, 7, False, False), (2, 5, False, True), (1, 1, False, False), (1, 6, True, False),
     (1, 1, True, False)],
)  # fmt: skip
@pytest.mark.parametrize("keep", [True, False])
def test_opcheck_the_compiled_ops(B, T, packed, strided, keep):
    """ttt_forward's fake kernel gives z and the saved states [B, H, ceil(n / every), ...] only
    when keep (n = ceil(T / size) mini-batches); ttt_backward's, the gradients with and without
    the final states' gradients (a broadcast d_o: stride 0 but along D)."""
    x = _op_inputs(B, T, packed, strided)
    op = torch.ops.linattn_native
    size, every = 2, 2
    forward = (*x, 0.4, 1e-6, size, every, keep)
    torch.library.opcheck(op.ttt_forward.default, forward, test_utils=OPCHECK)
    if not keep:
        return
    with torch.no_grad():
        o, z, W, h, Ws, hs = op.ttt_forward(*forward)
    assert Ws.shape == (B, 2, (T + 3) // 4, 4, 4)
    d_o = torch.randn(1, 1, 1, 4).expand(o.shape) if strided else torch.randn_like(o)
    for dW, dh in ((torch.randn_like(W), torch.randn_like(h)), (None, None)):
        back = (*x[:6], Ws, hs, z, d_o, dW, dh, 0.4, 1e-6, size, every)
        torch.library.opcheck(op.ttt_backward.default, back, test_utils=OPCHECK)


def test_the_fake_kernels_refuse_bad_input_by_name():
    q, k, v, e, w, b, W0, h0 = (t.detach().to("meta") for t in _op_inputs(1, 5, False))
    forward = torch.ops.linattn_native.ttt_forward
    with pytest.raises(RuntimeError, match="w must be of shape"):
        forward(q, k, v, e, w[:1], b, W0, h0, 0.5, 1e-6, 4, 1, False)
    with pytest.raises(RuntimeError, match="every"):
        forward(q, k, v, e, w, b, W0, h0, 0.5, 1e-6, 4, 0, True)
    o, z, _, _, Ws, hs = forward(q, k, v, e, w, b, W0, h0, 0.5, 1e-6, 4, 1, True)
    assert o.device.type == "meta" and Ws.shape == (1, 2, 2, 4, 4)
    with pytest.raises(RuntimeError, match="Ws must be of shape"):
        torch.ops.linattn_native.ttt_backward(
            q, k, v, e, w, b, Ws[:, :, :1], hs, z, o, None, None, 0.5, 1e-6, 4, 1
        )
