"""linattn's CPU versions of fla 0.6.0's module functions (``linattn.integrations._fla_modules``
and the norm + linear ones of ``linattn.integrations.fla``) against fla.

Each is compared with fla's PyTorch reference where fla has one, and with fla's Triton kernel run
by Triton's interpreter (``tests.fla_interpreter``, imported before fla) on small shapes, forward
and backward (float32 within 1e-5 relative; the quantised BitNet linear within 1e-5 too, its
rounding being the kernel's). fla's own functions are the module attributes while ``enable()`` is
off.
"""

from __future__ import annotations

import pytest
import torch

interp = pytest.importorskip("tests.fla_interpreter")  # before fla
pytest.importorskip("fla")

from fla.modules.norm import fused_norm_gate, layernorm, layernorm_gated  # noqa: E402
from fla.modules.rotary import ops as rotary_ops  # noqa: E402
from fla.ops.kda import gate as kda_gate  # noqa: E402

from linattn.integrations import _fla_modules  # noqa: E402
from linattn.integrations import fla as linattn_fla  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
relative = interp.relative
TOL = 1e-5


def grads(fn, inputs: list[torch.Tensor], weight_seed: int = 7):
    """fn(*inputs)'s outputs (a tuple) and the gradients of a random weighting of the
    floating outputs with respect to each input that requires a gradient."""
    inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(weight_seed)
    loss = sum(
        (o.float() * torch.randn(o.shape, generator=gen)).where(torch.isfinite(o), 0.0).sum()
        for o in out
        if o.requires_grad
    )
    wanted = [x for x in inputs if x.requires_grad]
    return [o.detach() for o in out], torch.autograd.grad(loss, wanted, allow_unused=True)


def assert_close(got, want, tol=TOL):
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        finite = torch.isfinite(b)
        assert torch.equal(finite, torch.isfinite(a))
        assert relative(a[finite], b[finite]) < tol


def assert_same_as_fla(fla_fn, ours, inputs, tol=TOL):
    """Outputs and input gradients of ours equal fla_fn's (its kernel under the interpreter)."""
    out, dx = grads(ours, inputs)
    out_ref, dx_ref = grads(fla_fn, inputs)
    assert_close(out, out_ref, tol)
    assert_close(dx, dx_ref, tol)


# ------------------------------------------------------------------------------- rotary


def rotary_tables(TR: int, R: int):
    angles = torch.arange(TR)[:, None] / 10000 ** (torch.arange(R) / R)
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_equals_flas_reference(interleaved):
    B, T, H, D, R = 2, 9, 3, 16, 6  # partial rotary: 12 of 16 channels
    x = torch.randn(B, T, H, D)
    cos, sin = rotary_tables(T, R)
    got = _fla_modules.rotary_embedding_fwdbwd(x, cos, sin, interleaved=interleaved)
    want = rotary_ops.rotary_embedding_ref(x, cos, sin, interleaved)
    assert relative(got, want) < 1e-6


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offsets", ["int", "tensor"])
def test_rotary_equals_flas_kernel_forward_and_backward(interleaved, offsets):
    """fla's autograd function with its kernel, then with ours in its place (the backward is
    the conjugate turn); offsets as one int or one per sequence, some rows out of the table
    (left padding) which both leave zero."""
    B, T, H, D, R = 2, 7, 2, 16, 8
    cos, sin = rotary_tables(12, R)
    seqlen_offsets = 3 if offsets == "int" else torch.tensor([-2, 5])
    x = torch.randn(B, T, H, D, requires_grad=True)

    def run(fn):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rotary_ops, "rotary_embedding_fwdbwd", fn)
            return grads(
                lambda x: rotary_ops.rotary_embedding(
                    x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets
                ),
                [x],
            )

    fla_fn = rotary_ops.rotary_embedding_fwdbwd
    (y, dx), (y_ref, dx_ref) = run(_fla_modules.rotary_embedding_fwdbwd), run(fla_fn)
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)


def test_rotary_packed_sequences_equal_flas_kernel():
    T, H, D, R = 9, 2, 8, 4
    cos, sin = rotary_tables(16, R)
    x = torch.randn(1, T, H, D)
    cu = torch.tensor([0, 1, 5, 9])
    kw = {"cu_seqlens": cu, "seqlen_offsets": torch.tensor([0, 2, 7])}
    got = _fla_modules.rotary_embedding_fwdbwd(x, cos, sin, **kw)
    want = rotary_ops.rotary_embedding_fwdbwd(x, cos, sin, **kw)
    assert relative(got, want) < TOL
    # each piece is its own sequence from position 0 + its offset
    piece = _fla_modules.rotary_embedding_fwdbwd(x[:, 1:5], cos, sin, seqlen_offsets=2)
    assert torch.equal(got[:, 1:5], piece)


# ------------------------------------------------------------------------------- gated norms


@pytest.mark.parametrize("norm_before_gate", [False, True])
@pytest.mark.parametrize("group_size", [None, 8])
@pytest.mark.parametrize("is_rms_norm", [True, False])
def test_layernorm_gated_equals_flas_kernel(norm_before_gate, group_size, is_rms_norm):
    N, D = 10, 24
    x, z = torch.randn(N, D, requires_grad=True), torch.randn(N, D, requires_grad=True)
    w = (1 + 0.1 * torch.randn(D)).requires_grad_()
    b = (0.1 * torch.randn(D)).requires_grad_()

    def call(fn):
        return lambda x, z, w, b: fn(x, w, b, z, 1e-5, group_size, norm_before_gate, is_rms_norm)

    assert_same_as_fla(
        call(layernorm_gated.layernorm_fn), call(_fla_modules.layernorm_fn), [x, z, w, b]
    )
    if is_rms_norm:  # fla's reference (its bias is None in RMSNormGated)
        got = _fla_modules.rmsnorm_fn(x, w, None, z, 1e-5, group_size, norm_before_gate)
        want = layernorm_gated.rms_norm_ref(x, w, None, z, 1e-5, group_size, norm_before_gate)
        assert relative(got, want) < 1e-6


def test_rms_norm_gated_module_runs_ours_under_enable():
    norm = layernorm_gated.RMSNormGated(16, group_size=8)
    x, z = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    want = norm(x, z)
    linattn_fla.enable()
    try:
        assert layernorm_gated.rmsnorm_fn.linattn_cpu is _fla_modules.rmsnorm_fn
        got = norm(x, z)
    finally:
        linattn_fla.disable()
    assert relative(got, want) < TOL


# ------------------------------------------------------------------------------- norm + linear


@pytest.mark.parametrize("is_rms_norm", [True, False])
@pytest.mark.parametrize("prenorm", [False, True])
def test_layer_norm_linear_equals_flas_kernel_and_reference(is_rms_norm, prenorm):
    N, D, E = 6, 16, 12
    x, res = torch.randn(N, D, requires_grad=True), torch.randn(N, D, requires_grad=True)
    nw, nb = (1 + 0.1 * torch.randn(D)).requires_grad_(), (0.1 * torch.randn(D)).requires_grad_()
    lw, lb = torch.randn(E, D, requires_grad=True), torch.randn(E, requires_grad=True)

    def call(fn):
        return lambda *a: fn(*a, 1e-5, prenorm, False, is_rms_norm)

    inputs = [x, nw, nb, lw, lb, res]
    assert_same_as_fla(
        call(layernorm.layer_norm_linear), call(linattn_fla.layer_norm_linear), inputs
    )
    ref = layernorm.rms_norm_ref if is_rms_norm else layernorm.layer_norm_ref
    normed = ref(x, nw, nb, res, 1e-5)
    got = linattn_fla.layer_norm_linear(x, nw, nb, lw, lb, res, 1e-5, False, False, is_rms_norm)
    assert relative(got, torch.nn.functional.linear(normed, lw, lb)) < 1e-6


@pytest.mark.parametrize("name", ["rms_norm_swish_gate_linear", "layer_norm_swish_gate_linear"])
def test_swish_gate_linear_equals_flas_kernel(name):
    N, D, E = 6, 16, 12
    x, g = torch.randn(N, D, requires_grad=True), torch.randn(N, D, requires_grad=True)
    nw, nb = (1 + 0.1 * torch.randn(D)).requires_grad_(), (0.1 * torch.randn(D)).requires_grad_()
    lw, lb = torch.randn(E, D, requires_grad=True), torch.randn(E, requires_grad=True)
    inputs = [x, g, nw, nb, lw, lb]
    assert_same_as_fla(getattr(fused_norm_gate, name), getattr(linattn_fla, name), inputs)


# ------------------------------------------------------------------------------- BitNet


@pytest.mark.parametrize("prenorm", [False, True])
def test_bitlinear_equals_flas_kernel_and_straight_through_reference(prenorm):
    """fla's fused quantised norm + linear (kernel) and ours; and ours against fla's unfused
    ``BitLinear`` formula (the norm, then the straight-through quantisations)."""
    from fla.modules import fused_bitlinear

    N, D, E = 8, 32, 16
    x, res = torch.randn(N, D, requires_grad=True), torch.randn(N, D, requires_grad=True)
    nw = (1 + 0.1 * torch.randn(D)).requires_grad_()
    lw, lb = torch.randn(E, D, requires_grad=True), torch.randn(E, requires_grad=True)

    def call(fn):
        return lambda x, nw, lw, lb, res: fn(x, nw, None, lw, lb, res, 1e-6, prenorm, False, True)

    inputs = [x, nw, lw, lb, res]
    fla_fn = fused_bitlinear.layer_norm_linear_quant
    assert_same_as_fla(call(fla_fn), call(_fla_modules.layer_norm_linear_quant), inputs)

    def unfused(x, nw, lw, lb, res):
        h = x + res
        y = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6) * nw
        yq = y + (fused_bitlinear.activation_quant(y) - y).detach()
        wq = lw + (fused_bitlinear.weight_quant(lw) - lw).detach()
        out = torch.nn.functional.linear(yq, wq, lb)
        return (out, h) if prenorm else out

    ours = call(_fla_modules.layer_norm_linear_quant)
    out, dx = grads(ours, inputs)
    out_ref, dx_ref = grads(unfused, inputs)
    assert_close(out, out_ref)  # torch.round's ties to even vs the kernel's: no ties here
    assert_close(dx, dx_ref)


# ------------------------------------------------------------------------------- GSA's gate


def test_additive_gate_equals_flas_reference():
    """fla's naive GSA computes the gate itself when given none (its logcumsumexp formula):
    the same output with ours given as (s, g). fla's gate kernel does not run under triton
    3.9's interpreter (the ``logaddexp`` of its ``tl.associative_scan`` calls libdevice's
    ``log1p``, None in the interpreter: "'NoneType' object has no attribute 'dtype'"), so the
    kernel is not compared here."""
    from fla.ops.gsa.naive import naive_recurrent_gsa

    B, T, H, K, V, M = 2, 7, 2, 4, 4, 3
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v, x = torch.randn(B, T, H, V), torch.randn(B, T, H, M)
    want, _ = naive_recurrent_gsa(q, k, v, x)
    s, g, _ = _fla_modules.fused_additive_gate(x)
    got, _ = naive_recurrent_gsa(q, k, v, s, g)
    assert relative(got, want) < 1e-6


def test_additive_gate_initial_state_and_packed_sequences():
    """A call continued from the final state equals one call over both parts (the gradient
    through the state included), and packed sequences (a length-1 and an empty one among them)
    equal separate calls."""
    x = torch.randn(1, 10, 2, 4, dtype=torch.float64, requires_grad=True)
    k, g, final = _fla_modules.fused_additive_gate(x)
    k1, g1, z1 = _fla_modules.fused_additive_gate(x[:, :4])
    k2, g2, z2 = _fla_modules.fused_additive_gate(x[:, 4:], z1)
    for whole, parts in ((k, (k1, k2)), (g, (g1, g2))):
        assert torch.allclose(whole, torch.cat(parts, 1), rtol=1e-12, atol=1e-14)
    assert torch.allclose(final, z2, rtol=1e-12, atol=0)
    dx = torch.autograd.grad(k2.sum() + g2.sum(), x)[0]
    dx_whole = torch.autograd.grad(k[:, 4:].sum() + g[:, 4:].sum(), x)[0]
    assert torch.allclose(dx, dx_whole, rtol=1e-10, atol=1e-12)

    h0 = torch.randn(4, 1, 2, 4, dtype=torch.float64)
    cu = torch.tensor([0, 1, 1, 6, 10])
    kp, gp, fp = _fla_modules.fused_additive_gate(x, h0, cu)
    for n, (a, b) in enumerate([(0, 1), (1, 1), (1, 6), (6, 10)]):
        kn, gn, fn = _fla_modules.fused_additive_gate(x[:, a:b], h0[n : n + 1])
        assert torch.equal(kp[:, a:b], kn) and torch.equal(gp[:, a:b], gn)
        assert torch.equal(fp[n : n + 1], fn)
    assert torch.equal(fp[1], h0[1])  # the empty sequence keeps its state


def test_additive_gate_definition():
    """z_t = logaddexp(z_{t-1}, x_t) literally, in float64."""
    x = torch.randn(1, 6, 1, 3, dtype=torch.float64)
    k, g, final = _fla_modules.fused_additive_gate(x)
    z = torch.full((1, 1, 3), -torch.inf, dtype=torch.float64)
    for t in range(6):
        z_new = torch.logaddexp(z, x[:, t])
        assert torch.allclose(k[:, t], torch.exp(x[:, t] - z_new), rtol=1e-12, atol=0)
        want_g = torch.zeros_like(z) if t == 0 else z - z_new
        assert torch.allclose(g[:, t], want_g, rtol=1e-12, atol=1e-15)
        z = z_new
    assert torch.allclose(final[:, 0], z, rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------- KDA's gate


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_kda_gate_equals_flas_reference_and_kernel(lower_bound):
    B, T, H, K = 2, 9, 2, 8
    g = torch.randn(B, T, H, K, requires_grad=True)
    A_log = torch.randn(H, requires_grad=True)
    dt_bias = torch.randn(H * K, requires_grad=True)
    got = _fla_modules.fused_kda_gate(g, A_log, dt_bias, lower_bound)
    if lower_bound is None:
        want = kda_gate.naive_kda_gate(g, A_log, dt_bias)
    else:
        want = kda_gate.naive_kda_lowerbound_gate(g, A_log, dt_bias, lower_bound)
    assert relative(got, want) < 1e-6

    def call(fn):
        return lambda g, a, b: fn(g, a, b, lower_bound)

    assert_same_as_fla(
        call(kda_gate.fused_kda_gate), call(_fla_modules.fused_kda_gate), [g, A_log, dt_bias]
    )
    dy = torch.randn(B, T, H, K)
    fla_bwd = kda_gate.kda_gate_bwd(g.detach(), A_log.detach(), dt_bias.detach(), dy, lower_bound)
    ours_bwd = _fla_modules.kda_gate_bwd(
        g.detach(), A_log.detach(), dt_bias.detach(), dy, lower_bound
    )
    assert_close(ours_bwd, fla_bwd)
    fwd = kda_gate.kda_gate_fwd(g.detach(), A_log.detach(), dt_bias.detach(), lower_bound)
    assert relative(_fla_modules.kda_gate_fwd(g, A_log, dt_bias, lower_bound), fwd) < TOL


# ------------------------------------------------------------------------------- activations


@pytest.mark.parametrize("name", ["sigmoid", "elu_p1", "logsigmoid"])
def test_activations_equal_torch_and_flas_kernels(name):
    """fla's autograd functions (``sigmoid``, ``elu_p1``, ``logsigmoid``) with their kernels and
    with ours in their place; and ours against torch's definitions (logsigmoid at temperature 4,
    the value GLA-style gates use)."""
    from fla.modules.activations import ops as act

    x = torch.randn(5, 12, requires_grad=True)
    x.data[0, :3] = torch.tensor([0.0, -30.0, 30.0])
    fwd, bwd = f"{name}_fwd", f"{name}_bwd"

    def run(ours: bool):
        with pytest.MonkeyPatch.context() as patch:
            if ours:
                patch.setattr(act, fwd, getattr(linattn_fla, fwd))
                patch.setattr(act, bwd, getattr(linattn_fla, bwd))
            if name == "logsigmoid":
                return grads(lambda x: act.logsigmoid(x, 4.0), [x])
            return grads(getattr(act, name), [x])

    if name != "elu_p1":  # elu_p1's kernel calls libdevice.exp, None under the interpreter
        (y, dx), (y_ref, dx_ref) = run(True), run(False)
        assert_close(y, y_ref)
        assert_close(dx, dx_ref)
    torch_fn = {
        "sigmoid": torch.sigmoid,
        "elu_p1": lambda x: torch.nn.functional.elu(x) + 1,
        "logsigmoid": lambda x: torch.nn.functional.logsigmoid(x) / 4.0,
    }[name]
    (y,), (dx,) = run(True)
    (y_ref,), (dx_ref,) = grads(torch_fn, [x])
    assert relative(y, y_ref) < 1e-6 and relative(dx, dx_ref) < 1e-6
