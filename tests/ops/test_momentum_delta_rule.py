"""linattn.ops.momentum_delta_rule (Momentum DeltaNet): every form against the float64
token loop of ``linattn.reference.momentum_delta`` with packed sequences (a length-1 piece) and
both initial states, chunk sizes that do and do not divide T; the decoding step; float32's error;
gradients; bad input named. (tests/registry runs the registry's case too.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linattn.ops import _native
from linattn.ops import momentum_delta_rule as module
from linattn.ops.momentum_delta_rule import momentum_delta_rule_step
from linattn.reference.momentum_delta import recurrence

from .native_calls import fused_calls, on_threads


def momentum_delta_rule(*args, initial_state=None, initial_momentum=None, **kwargs):
    """The op on the reference's q, k, p as given, with the two states apart: (o, S, M)."""
    o, state = module.momentum_delta_rule(
        *args, initial_state=torch.stack([initial_state, initial_momentum]),
        use_qk_l2norm=False, use_p_times_alpha=False, **kwargs,
    )  # fmt: skip
    return o, *((None, None) if state is None else (state[0], state[1]))


B, T, H, K, V = 1, 29, 2, 8, 4
NAMES = ("q", "k", "v", "p", "log_alpha", "log_mu", "beta", "eta")


def make(dtype=torch.float64, seed=0, N=1):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(B, T, H, K), "k": F.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, H, V), "p": F.normalize(randn(B, T, H, K), dim=-1),
        "log_alpha": F.logsigmoid(randn(B, T, H) + 2), "log_mu": F.logsigmoid(randn(B, T, H)),
        "beta": rand(B, T, H), "eta": 2 * rand(B, T, H),
        "initial_state": randn(N, H, K, V), "initial_momentum": randn(N, H, K, V),
    }  # fmt: skip
    return {n: t.to(dtype) for n, t in x.items()}


def oracle(x, scale, bounds):
    o = np.zeros((T, H, V))
    S = np.zeros((len(bounds) - 1, H, K, V))
    M = np.zeros_like(S)
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        for h in range(H):
            o[s:e, h], S[n, h], M[n, h] = recurrence(
                *(x[name][0, s:e, h].numpy() for name in NAMES), scale=scale,
                initial_state=x["initial_state"][n, h].numpy(),
                initial_momentum=x["initial_momentum"][n, h].numpy(),
            )  # fmt: skip
    return torch.from_numpy(o)[None], torch.from_numpy(S), torch.from_numpy(M)


@pytest.mark.parametrize(
    "mode,C", [("parallel", 1), ("recurrent", 1), ("chunk", 8), ("chunk", 1), ("chunk", 64)]
)
def test_every_form_equals_the_reference_packed(mode, C):
    cu = [0, 1, 12, 29]
    x = make(N=3)
    got = momentum_delta_rule(
        *(x[n] for n in NAMES), scale=0.4, mode=mode, chunk_size=C, output_final_state=True,
        initial_state=x["initial_state"], initial_momentum=x["initial_momentum"],
        cu_seqlens=torch.tensor(cu),
    )  # fmt: skip
    for a, b in zip(got, oracle(x, 0.4, cu), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("C", [3, 8])
def test_the_chunk_form_in_blocks_equals_the_reference_and_its_gradients_autograd_s(monkeypatch, C):
    """The chunk form a few chunks at a time (a block size small enough for several blocks,
    one of them short): the reference's outputs and states, and the gradients of one block."""
    cu = [0, 1, 12, 29]
    x = make(N=3)
    args = dict(
        scale=0.4, chunk_size=C, output_final_state=True, cu_seqlens=torch.tensor(cu),
    )  # fmt: skip
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}

    def run(mode):
        o, S, M = momentum_delta_rule(
            *(leaves[n] for n in NAMES), mode=mode, **args,
            initial_state=leaves["initial_state"], initial_momentum=leaves["initial_momentum"],
        )  # fmt: skip
        loss = (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
        loss = loss + S.square().sum() + M.sum()
        return (o, S, M), torch.autograd.grad(loss, list(leaves.values()))

    whole, whole_grads = run("chunk")
    monkeypatch.setattr(module, "BLOCK_NUMBERS", 2 * H * (C + 1) ** 2)  # two chunks a block
    blocks, block_grads = run("chunk")
    for a, b in zip(blocks, oracle(x, 0.4, cu), strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=1e-12)
    for a, b in zip(blocks, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for a, b in zip(block_grads, run("recurrent")[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    for a, b in zip(block_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_step_equals_the_recurrent_form():
    x = make()
    o, S, M = momentum_delta_rule(
        *(x[n] for n in NAMES), mode="recurrent", output_final_state=True,
        initial_state=x["initial_state"], initial_momentum=x["initial_momentum"],
    )  # fmt: skip
    state, momentum = x["initial_state"].clone(), x["initial_momentum"].clone()
    for t in range(T):
        o_t = momentum_delta_rule_step(state, momentum, *(x[n][:, t] for n in NAMES))
        torch.testing.assert_close(o_t, o[:, t], rtol=0, atol=1e-12)
    torch.testing.assert_close(state, S, rtol=0, atol=1e-12)
    torch.testing.assert_close(momentum, M, rtol=0, atol=1e-12)


def test_float32_relative_rms_error():
    """float32 against the float64 reference: relative RMS below 2e-6 (measured: 2e-7 in the
    recurrent form, up to 9e-7 in the chunk form's final momentum)."""
    x = make()
    want = oracle(x, 0.4, [0, T])
    x32 = {n: t.float() for n, t in x.items()}
    for mode in ("recurrent", "chunk"):
        got = momentum_delta_rule(
            *(x32[n] for n in NAMES), scale=0.4, mode=mode, output_final_state=True,
            initial_state=x32["initial_state"], initial_momentum=x32["initial_momentum"],
        )  # fmt: skip
        for a, b in zip(got, want, strict=True):
            error = float((a.double() - b).norm() / b.norm())
            assert error < 2e-6, (mode, error)


def test_chunk_gradients_equal_the_recurrent_form_s():
    x = make()
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}

    def grads(mode):
        o, S, M = momentum_delta_rule(
            *(leaves[n] for n in NAMES), mode=mode, chunk_size=8, output_final_state=True,
            initial_state=leaves["initial_state"], initial_momentum=leaves["initial_momentum"],
        )  # fmt: skip
        loss = (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
        loss = loss + S.square().sum() + M.sum()
        return torch.autograd.grad(loss, list(leaves.values()))

    for a, b in zip(grads("chunk"), grads("recurrent"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_bad_input_is_named():
    x = make()
    args = [x[n] for n in NAMES]
    states = {n: x[n] for n in ("initial_state", "initial_momentum")}
    with pytest.raises(ValueError, match="log_alpha is a log-decay"):
        momentum_delta_rule(*args[:4], -x["log_alpha"], *args[5:], **states)
    with pytest.raises(ValueError, match=r"p must have k's shape"):
        momentum_delta_rule(*args[:3], x["p"][..., :3], *args[4:], **states)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, N, H, K, V\]"):
        momentum_delta_rule(
            *args, initial_state=x["initial_state"][..., :2],
            initial_momentum=x["initial_momentum"][..., :2],
        )  # fmt: skip
    with pytest.raises(ValueError, match="initial_state must stack the memory and the momentum"):
        module.momentum_delta_rule(
            *args, initial_state=x["initial_state"][None].expand(3, -1, -1, -1, -1)
        )
    with pytest.raises(ValueError, match="mode must be one of"):
        momentum_delta_rule(*args, mode="fast", **states)
    state = x["initial_state"].clone()
    with pytest.raises(ValueError, match="momentum must have the state's shape"):
        momentum_delta_rule_step(state, state[..., :2], *(x[n][:, 0] for n in NAMES))


def gradients(x, mode, C=8, cu=None, outputs=True, states=True):
    """The op's gradients of a weighted loss of its outputs and/or final states, every input
    differentiated (the chunk form's backward is written out, ``_Block``)."""
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, S, M = momentum_delta_rule(
        *(leaves[n] for n in NAMES), mode=mode, chunk_size=C, output_final_state=states,
        initial_state=leaves["initial_state"], initial_momentum=leaves["initial_momentum"],
        cu_seqlens=None if cu is None else torch.tensor(cu), scale=0.4,
    )  # fmt: skip
    loss = 0
    if outputs:
        loss = (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
    if states:
        loss = loss + S.square().sum() + (M * torch.cos(torch.arange(M.numel()).view_as(M))).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    # an input the loss does not reach (q without the outputs) has a zero gradient
    pairs = zip(leaves.values(), grads, strict=True)
    return [torch.zeros_like(t) if g is None else g for t, g in pairs]


def steep(x):
    """x with log-decays from 0 to -1000 (decays of exactly 1, and ones that underflow)."""
    x = dict(x)
    for name, shift in (("log_alpha", 0), ("log_mu", 1)):
        levels = torch.tensor([0.0, -0.01, -3.0, -30.0, -1000.0], dtype=x[name].dtype)
        index = (torch.arange(T)[:, None] * 3 + torch.arange(H) + shift) % len(levels)
        x[name] = levels[index][None]
    return x


@pytest.mark.parametrize(
    "case,C",
    [("steep", 8), ("steep", 64), ("packed", 8), ("packed", 3), ("outputs", 8), ("states", 8)],
)
def test_chunk_gradients_equal_the_recurrent_form_in_each_case_s(case, C):
    """Steep gates (decays of 1 and decays that underflow), packed sequences with length-1
    pieces, and a loss of the outputs alone or of the final states alone (the backward's
    absent gradients), with chunks that do and do not divide T; float64 against the loop."""
    x = steep(make()) if case == "steep" else make()
    cu = None
    if case == "packed":
        x = make(N=5)
        cu = [0, 1, 2, 11, 12, 29]
    options = dict(cu=cu, outputs=case != "states", states=case != "outputs")
    got, want = gradients(x, "chunk", C, **options), gradients(x, "recurrent", **options)
    for name, a, b in zip(x, got, want, strict=True):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("C", [1, 64])
def test_one_token_chunk_form_and_gradients_equal_the_reference(C):
    x = {n: (t[:, :1] if n in NAMES else t) for n, t in make().items()}
    got = momentum_delta_rule(
        *(x[n] for n in NAMES), scale=0.4, chunk_size=C, output_final_state=True,
        initial_state=x["initial_state"], initial_momentum=x["initial_momentum"],
    )  # fmt: skip
    want = momentum_delta_rule(
        *(x[n] for n in NAMES), scale=0.4, mode="recurrent", output_final_state=True,
        initial_state=x["initial_state"], initial_momentum=x["initial_momentum"],
    )  # fmt: skip
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for a, b in zip(gradients(x, "chunk", C), gradients(x, "recurrent"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_float32_chunk_gradients_against_float64():
    """The chunk form's float32 gradients against its float64 ones (themselves equal to the
    loop's, above), steep gates included: relative error of each input's gradient below 1e-4
    (measured: up to 1e-5 with steep gates, as with the composite autograd graph before)."""
    for x in (make(), steep(make())):
        want = gradients(x, "chunk", 8)
        got = gradients({n: t.float() for n, t in x.items()}, "chunk", 8)
        for name, a, b in zip(x, got, want, strict=True):
            error = float((a.double() - b).norm() / b.norm())
            assert error < 1e-4, (name, error)


# --- the compiled chunk form (csrc/momentum.cpp) on float32 CPU tensors ---------------------

native = pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")


def _loss_and_grads(x, **options):
    """The op's outputs (o, the final pair) and the gradients of a weighted loss of both with
    respect to every input (float64 weights, cast: the same loss for either dtype), through the
    public entry point (q, k, p normalised, p times alpha: fla's defaults)."""
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    state = torch.stack([leaves["initial_state"], leaves["initial_momentum"]])
    o, Z = module.momentum_delta_rule(
        *(leaves[n] for n in NAMES), initial_state=state, output_final_state=True, **options
    )
    gen = torch.Generator().manual_seed(7)
    w_o = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)
    w_Z = torch.randn(Z.shape, generator=gen, dtype=torch.float64).to(Z.dtype)
    grads = torch.autograd.grad((o * w_o).sum() + (Z * w_Z).sum(), list(leaves.values()))
    return (o.detach(), Z.detach()), grads


def _assert_float32_close(got, want, bound):
    """Each float32 tensor against its float64 counterpart: largest error relative to the
    largest entry (or to 1, the inputs' size, where every entry is smaller) below ``bound``."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        error = float((a.double() - b).abs().max() / b.abs().max().clamp_min(1.0))
        assert error < bound, (i, error)


def _float32(x):
    return {n: t.float() for n, t in x.items()}


def _assert_compiled_equals_float64(monkeypatch, x, options) -> None:
    """x's call in float32, which must run the compiled forward and backward, against its
    float64 call: outputs and every gradient within 2e-6 (``_assert_float32_close``)."""
    want, want_grads = _loss_and_grads(x, **options)
    called = fused_calls(monkeypatch)
    got, got_grads = _loss_and_grads(_float32(x), **options)
    assert called == ["momentum_forward", "momentum_backward"]
    _assert_float32_close(got, want, 2e-6)
    _assert_float32_close(got_grads, want_grads, 2e-6)


@native
@pytest.mark.parametrize(
    "C,cu",
    [(8, None), (5, None), (64, None), (1, None), (8, [0, 1, 2, 12, 13, 29]), (4, [0, 28, 29])],
)
def test_the_compiled_form_equals_float64_and_its_gradients(monkeypatch, C, cu):
    """float32 through the compiled kernels against the float64 chunk form (itself the
    reference's to 1e-12, the tests above): outputs, final pair and every gradient, with an
    initial pair, T not a multiple of C (and C = 1, C > T), packed sequences with pieces of one
    token; the kernels run, forward and backward."""
    x = make(N=1 if cu is None else len(cu) - 1)
    options = {"scale": 0.4, "mode": "chunk", "chunk_size": C}
    if cu is not None:
        options["cu_seqlens"] = torch.tensor(cu)
    _assert_compiled_equals_float64(monkeypatch, x, options)


@native
@pytest.mark.parametrize("T_", [1, 3])
def test_the_compiled_form_with_a_batch_and_few_tokens(monkeypatch, T_):
    """B = 2 sequences of T_ tokens (T = 1: one chunk of one token) through the kernels."""
    x = make(N=2)
    x = {
        n: (t[:, :T_].expand(2, *[-1] * (t.dim() - 1)).clone() if n in NAMES else t)
        for n, t in x.items()
    }
    x["q"] = x["q"] * torch.tensor([1.0, -0.5], dtype=torch.float64).view(2, 1, 1, 1)
    options = {"scale": 0.4, "chunk_size": 2}
    _assert_compiled_equals_float64(monkeypatch, x, options)


@native
@pytest.mark.parametrize("C,cu", [(8, None), (5, [0, 1, 2, 12, 13, 29])])
def test_the_compiled_forward_without_grad_gives_the_same_bits(monkeypatch, C, cu):
    """Without grad the forward keeps neither the pairs nor the errors (the op's keep=False): its
    outputs and final pair are bit for bit those of the forward that keeps them."""
    x = _float32(make(N=1 if cu is None else len(cu) - 1))
    options = {"scale": 0.4, "mode": "chunk", "chunk_size": C, "output_final_state": True}
    if cu is not None:
        options["cu_seqlens"] = torch.tensor(cu)
    state = torch.stack([x["initial_state"], x["initial_momentum"]])
    called = fused_calls(monkeypatch)
    leaves = [x[n].clone().requires_grad_() for n in NAMES]
    kept = module.momentum_delta_rule(*leaves, initial_state=state, **options)
    with torch.no_grad():
        bare = module.momentum_delta_rule(*(x[n] for n in NAMES), initial_state=state, **options)
    assert called == ["momentum_forward", "momentum_forward"]
    for a, b in zip(kept, bare, strict=True):
        assert torch.equal(a.detach(), b)


@native
@pytest.mark.parametrize("C", [8, 64])
def test_steep_gates_stay_in_the_compiled_form(monkeypatch, C):
    """Log-decays from 0 to -1000 (decays of exactly 1, and ones that underflow): the kernels
    form every decay as a product of decays <= 1, so no chunk is beyond float32's range and the
    compiled form serves them all at float32's accuracy."""
    x = steep(make())
    options = {"scale": 0.4, "chunk_size": C}
    _assert_compiled_equals_float64(monkeypatch, x, options)


@native
def test_the_pytorch_forms_serve_what_the_kernels_do_not(monkeypatch):
    """float64, the parallel and recurrent modes and a chunk larger than the kernels take run
    the PyTorch forms; no gradient asked: the forward alone, nothing kept."""
    x = make()
    args = [x[n] for n in NAMES]
    states = {n: x[n] for n in ("initial_state", "initial_momentum")}
    called = fused_calls(monkeypatch)
    momentum_delta_rule(*args, **states)
    args32 = [t.float() for t in args]
    states32 = {n: t.float() for n, t in states.items()}
    for options in ({"mode": "parallel"}, {"mode": "recurrent"},
                    {"chunk_size": module.FUSED_MAX_CHUNK + 1}):  # fmt: skip
        momentum_delta_rule(*args32, **states32, **options)
    assert called == []
    want = momentum_delta_rule(*args, **states, output_final_state=True, scale=0.4)
    got = momentum_delta_rule(*args32, **states32, output_final_state=True, scale=0.4)
    assert called == ["momentum_forward"]
    _assert_float32_close(got, want, 2e-6)


def _flat(x):
    """The kernels' arguments ([TT, H, .] rows and the pair) of make()'s float32 inputs."""
    flat = [x[n][0].contiguous() for n in NAMES]
    Z0 = torch.stack([x["initial_state"], x["initial_momentum"]])
    return flat, Z0


@native
def test_opcheck_the_compiled_ops():
    """Schema, fake (Meta) kernels and the dispatcher's checks of both ops."""
    bounds = [0, 1, 12, 29]
    x = _float32(make(N=3))
    flat, Z0 = _flat(x)
    op = torch.ops.linattn_native
    utils = ("test_schema", "test_faketensor")
    args = (*flat, Z0, bounds, 0.4, 8, True)
    torch.library.opcheck(op.momentum_forward.default, args, test_utils=utils)
    o, _, states, errors = op.momentum_forward(*args)
    q, k, _, p, *rates = flat
    d_o, dZ = torch.randn_like(o), torch.randn_like(Z0)
    for d_pair in (dZ, None):
        back = (q, k, p, *rates, states, errors, d_o, d_pair, bounds, 0.4, 8)
        torch.library.opcheck(op.momentum_backward.default, back, test_utils=utils)


@native
def test_the_compiled_ops_name_bad_input():
    x = _float32(make())
    (q, k, v, p, la, lm, beta, eta), Z0 = _flat(x)
    op = torch.ops.linattn_native.momentum_forward
    with pytest.raises(RuntimeError, match="bounds must run from 0 to 29"):
        op(q, k, v, p, la, lm, beta, eta, Z0, [0, 28], 0.4, 8, False)
    with pytest.raises(RuntimeError, match="log_mu must be float32"):
        op(q, k, v, p, la, lm.double(), beta, eta, Z0, [0, T], 0.4, 8, False)
    with pytest.raises(RuntimeError, match="p must have q's shape"):
        op(q, k, v, p[:, :, :2].contiguous(), la, lm, beta, eta, Z0, [0, T], 0.4, 8, False)
    with pytest.raises(RuntimeError, match="eta must have shape"):
        op(q, k, v, p, la, lm, beta, eta[:5].contiguous(), Z0, [0, T], 0.4, 8, False)
    with pytest.raises(RuntimeError, match="Z0 must have shape"):
        op(q, k, v, p, la, lm, beta, eta, Z0[..., :2].contiguous(), [0, T], 0.4, 8, False)
    with pytest.raises(RuntimeError, match="C .the chunk size. must be in"):
        op(q, k, v, p, la, lm, beta, eta, Z0, [0, T], 0.4, 0, False)


@native
def test_the_compiled_form_gives_the_same_bits_on_two_threads():
    """The kernels split the (sequence, head)s between threads, each computed alone: two
    threads give one thread's numbers exactly, forward and backward."""
    cu = [0, 1, 12, 29]
    x = _float32(make(N=3))
    options = {"scale": 0.4, "chunk_size": 8, "cu_seqlens": torch.tensor(cu)}
    one, two = on_threads(lambda: _loss_and_grads(x, **options), 1, 2)
    for a, b in zip([*one[0], *one[1]], [*two[0], *two[1]], strict=True):
        assert torch.equal(a, b)
