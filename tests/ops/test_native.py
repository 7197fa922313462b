"""The fused C++ chunk form (``linattn.ops._native``) against the float64 engine.

It serves float32 CPU inputs in the op ``linattn::chunk_forward`` (``library.chunk``); every rule,
gate, chunk size (dividing T or not, longer than T), initial state and stride is checked against
the float64 block engine (``chunk.chunk_forward``) and against the PyTorch group loop in float32,
and its backward pass (from the chunk states the forward saves) against the gradients of plain
float64 autograd. Also: its block cache, and the fused generation step.
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from linattn.ops import _native, delta_rule, library, linear_attention, recurrent_step
from linattn.ops.chunk import chunk_forward
from linattn.ops.library import chunk

from .cases import internal, make_inputs, mechanism, rel_rms, schema_mechanism
from .step_cases import B, H, K, V
from .step_cases import inputs as step_inputs

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)


def test_builds_where_there_is_a_compiler(monkeypatch):
    # CI has a compiler: a broken build must fail here, not fall back to the loop in silence.
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    assert _native.available(), _native.reason()


@pytest.mark.parametrize("value", [None, "0", "1", "", "00", " 0", "no"])
def test_the_switch_is_read_as_os_environ_reads_it(value, monkeypatch):
    # The switch is read from os.environ's encoded pairs (fast) where CPython keeps them, with
    # os.environ.get's meaning: off only for "0"; every change through os.environ seen at once.
    if value is None:
        monkeypatch.delenv("LINATTN_NATIVE", raising=False)
    else:
        monkeypatch.setenv("LINATTN_NATIVE", value)
    expected = os.environ.get("LINATTN_NATIVE", "1") != "0"
    assert _native._enabled() is expected
    on = expected and _native._state.get("ok")  # the step bound directly only then
    assert _native.fast_step() is (_native._state["step"] if on else None)
    monkeypatch.setenv("LINATTN_NATIVE", "0" if expected else "1")
    assert _native._enabled() is not expected


def test_disabled_by_the_environment(monkeypatch):
    q = torch.zeros(1, 1, 4, 2)
    # A session that starts disabled neither builds nor keeps that answer once re-enabled.
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    assert not _native.applies(q) and not _native.available()
    assert _native.reason() == "disabled by LINATTN_NATIVE=0" and _native._state == {}
    monkeypatch.delenv("LINATTN_NATIVE")
    assert _native.applies(q) == _native.available()
    assert not _native.applies(q.double())  # float32 only


CASES = list(
    itertools.product(["additive", "delta"], [None, "scalar", "channel", "steep"], [1, 7, 16, 64])
)


@needs_native
@pytest.mark.parametrize(("rule", "gate", "C"), CASES)
def test_equals_the_float64_engine(rule, gate, C):
    # T = 45: chunks of 7 and 16 leave a partial last chunk, 64 is one chunk longer than T.
    steep = gate == "steep"
    x = make_inputs(
        B=2, T=45, H=3, K=8, V=5, gate="channel" if steep else gate, rule=rule, state=True
    )
    if steep:  # log-decays down to about -1,600 per token: the products halve (budget)
        x["g"] = 400 * x["g"]
    scale = 0.7
    q, k, v, beta, g = internal(x, torch.float32)
    S0 = x["S0"].float()
    mech = schema_mechanism(beta, g)
    run = _native.kernel("chunk_forward")
    o, S, states = run(q, k, v, beta, g, S0, scale, min(C, 45), True, *mech)
    q64, k64, v64, beta64, g64 = internal(x, torch.float64)
    o64, S64 = chunk_forward(q64 * scale, k64, v64, beta64, g64, x["S0"], C, mechanism(x))
    assert rel_rms(o, o64) < 2e-6
    assert rel_rms(S, S64) < 2e-6
    # The saved states: the state entering chunk n is the final state of the first n C tokens.
    n = states.shape[0] - 1
    t = n * min(C, 45)
    assert torch.equal(states[0].view_as(S0), S0)
    if n == 0:
        return
    _, S_n = chunk_forward(
        q64[:, :, :t] * scale,
        k64[:, :, :t],
        v64[:, :, :t],
        None if beta64 is None else beta64[:, :, :t],
        None if g64 is None else g64[:, :, :t],
        x["S0"],
        C,
        mechanism(x),
    )
    assert rel_rms(states[n].view_as(S_n), S_n) < 2e-6


@needs_native
@pytest.mark.parametrize(
    ("rule", "gate"), list(itertools.product(["additive", "delta"], [None, "scalar", "channel"]))
)
def test_equals_the_pytorch_loop_in_float32(rule, gate, monkeypatch):
    x = make_inputs(B=1, T=300, H=4, K=16, V=16, gate=gate, rule=rule, state=True)
    q, k, v, beta, g = internal(x, torch.float32)
    mech = library.mechanism(*schema_mechanism(beta, g))
    args = (q, k, v, beta, g, x["S0"].float(), 64, 0.25, mech)
    o1, S1 = chunk(*args)
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    o2, S2 = chunk(*args)
    assert rel_rms(o1, o2) < 2e-6 and rel_rms(S1, S2) < 2e-6


@needs_native
@pytest.mark.parametrize(
    ("rule", "gate", "C"),
    [
        *itertools.product(["additive", "delta"], [None, "scalar", "channel"], [16]),
        *itertools.product(
            ["additive", "delta"], ["scalar", "steep-scalar", "channel", "steep-channel"], [7, 64]
        ),
        *itertools.product(["additive", "delta"], ["budget-scalar", "budget-channel"], [16, 64]),
    ],
)
def test_gradients_from_its_saved_states(rule, gate, C):
    # The fused backward pass recomputes every chunk from the states the fused forward saved.
    # T = 40: chunks of 7 and 16 leave a partial last chunk, 64 is one chunk longer than T.
    kind, _, gate = gate.rpartition("-") if gate else ("", "", None)
    x = make_inputs(B=2, T=40, H=2, K=8, V=4, gate=gate, rule=rule, state=True)
    if kind == "steep":  # log-decays down to about -1,600 per token: flushed, halved products
        x["g"] = 400 * x["g"]
    if kind == "budget":  # a full chunk's spread of gates 3% below the factor budget (head 0) and
        # 3% above it (head 1): its products are factored about its last row from the end decays
        # exp(G_c - G), whose reciprocals reach e^21.5, or halved with exponentials as before
        budget = math.log(torch.finfo(torch.float32).max) / 4
        gen = torch.Generator().manual_seed(0)
        jitter = 1 + 0.005 * (2 * torch.rand(x["g"].shape, generator=gen, dtype=torch.float64) - 1)
        x["g"] = -budget / (min(C, 40) - 1) * jitter
        x["g"][:, :, 0] *= 0.97
        x["g"][:, :, 1] *= 1.03
    fused, exact = _gradients(x, rule, C, torch.float32), _gradients(x, rule, C, torch.float64)
    for n in fused:
        # Steep gates too: dg is formed without the undecayed terms that cancel.
        assert rel_rms(fused[n], exact[n]) < 2e-6, n


def _gradients(x, rule, C, dtype):
    """The gradients of o.square().sum() + S.sum() for the inputs of ``x`` (make_inputs) in
    ``dtype``: the fused kernels in float32, plain autograd in float64."""
    names = [n for n in ("q", "k", "v", "beta", "g", "S0") if x[n] is not None]
    leaves = {n: x[n].to(dtype, copy=True).requires_grad_() for n in names}
    op = linear_attention if rule == "additive" else delta_rule
    extra = (leaves.get("g"),) if rule == "additive" else (leaves["beta"], leaves.get("g"))
    o, S = op(
        leaves["q"], leaves["k"], leaves["v"], *extra, chunk_size=C,
        initial_state=leaves["S0"], output_final_state=True,
    )  # fmt: skip
    (o.square().sum() + S.sum()).backward()
    return {n: t.grad for n, t in leaves.items()}


@needs_native
@pytest.mark.parametrize(
    ("gate", "C"), list(itertools.product([None, "scalar", "channel"], [16, 64]))
)
def test_delta_rule_solves_at_every_block_width(gate, C):
    # The UT transform's solves (csrc/triangular.cpp) take rows in groups of 4, then one by one,
    # and columns in blocks of 4 SIMD vectors, then of 1, then one by one: K + V = 83 and V = 35
    # reach every kind of block (64 + 16 + 3 and 2 x 16 + 3 columns with AVX-512), and T = 45 a
    # last group of one row (C = 64) and a last chunk of 13 rows (C = 16).
    x = make_inputs(B=1, T=45, H=2, K=48, V=35, gate=gate, rule="delta", state=True)
    q, k, v, beta, g = internal(x, torch.float32)
    run = _native.kernel("chunk_forward")
    o, S, _ = run(
        q, k, v, beta, g, x["S0"].float(), 0.5, min(C, 45), False, *schema_mechanism(beta, g)
    )
    q64, k64, v64, beta64, g64 = internal(x, torch.float64)
    o64, S64 = chunk_forward(q64 * 0.5, k64, v64, beta64, g64, x["S0"], C, mechanism(x))
    assert rel_rms(o, o64) < 2e-6 and rel_rms(S, S64) < 2e-6
    fused = _gradients(x, "delta", C, torch.float32)
    exact = _gradients(x, "delta", C, torch.float64)
    for n in fused:
        assert rel_rms(fused[n], exact[n]) < 2e-6, n


@needs_native
def test_strided_inputs_are_read_in_place():
    # Rows wider than K (a slice of a fused projection) and a transposed last dimension.
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(1, 50, 2, 3 * 8, generator=gen)
    q, k, v = qkv.split(8, dim=-1)
    v_t = torch.randn(1, 50, 8, 2, generator=gen).transpose(-1, -2)  # last stride 2
    beta = torch.rand(1, 50, 2, generator=gen)
    for vv in (v, v_t):
        o, S = delta_rule(q, k, vv, beta, chunk_size=16, output_final_state=True)
        o64, S64 = delta_rule(
            q.double(),
            k.double(),
            vv.double(),
            beta.double(),
            chunk_size=16,
            output_final_state=True,
        )
        assert rel_rms(o, o64) < 2e-6 and rel_rms(S, S64) < 2e-6


@needs_native
def test_threads_change_no_bit():
    # Heads are split over threads; each head's arithmetic is the same on any thread.
    x = make_inputs(B=2, T=130, H=3, K=16, V=8, gate="channel", rule="delta", dtype=torch.float32)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"])[0])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    return []


def test_empty_keeps_small_tensors_plain():
    like = torch.zeros(1, dtype=torch.float64)
    x = _native.empty((3, 5), like)
    assert x.shape == (3, 5) and x.dtype == torch.float64 and x.device == like.device


@needs_native
def test_large_outputs_are_backed_by_huge_pages():
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("no transparent huge pages on this machine")
    x = _native.empty((4, 2**20), torch.zeros(1))  # 16 MiB
    assert x.shape == (4, 2**20) and x.dtype == torch.float32
    # madvise(MADV_HUGEPAGE) marks the mapping "hg"; whether the kernel then finds free 2 MiB
    # pages for it depends on the machine's memory, so the pages themselves are not asserted.
    assert "hg" in _vm_flags(x.data_ptr() + x.nbytes // 2)


STEP_MECHANISMS = ["linear", "scalar_decay", "gla", "delta", "gated_delta", "kda"]


def _step_inputs(mechanism: str, seed=0):
    return step_inputs(mechanism, seed=seed, dtype=torch.float32)


@needs_native
@pytest.mark.parametrize("mechanism", STEP_MECHANISMS)
def test_fused_step_equals_the_pytorch_step(mechanism, monkeypatch):
    steps = [_step_inputs(mechanism, seed=s) for s in range(5)]
    S0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(1))
    fused, plain = S0.clone(), S0.clone()
    memory = fused.data_ptr()
    outs_fused = [recurrent_step(fused, **x, scale=0.7) for x in steps]
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    outs_plain = [recurrent_step(plain, **x, scale=0.7) for x in steps]
    assert fused.data_ptr() == memory  # in place
    torch.testing.assert_close(torch.stack(outs_fused), torch.stack(outs_plain), rtol=0, atol=2e-6)
    torch.testing.assert_close(fused, plain, rtol=0, atol=2e-6)


@needs_native
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("q", float("nan"), "q contains non-finite"),
        ("k", float("inf"), "k contains non-finite"),
        ("v", float("-inf"), "v contains non-finite"),
        ("state", float("nan"), "state contains non-finite"),
        ("beta", 2.5, r"beta must lie in \[0, 2\]"),
        ("beta", -0.1, r"beta must lie in \[0, 2\]"),
        ("beta", float("nan"), "beta contains non-finite"),
        ("g", 0.1, "g is a log-decay"),
        ("g", float("nan"), "g contains NaN"),
    ],
)
def test_fused_step_names_a_bad_value_and_leaves_the_state(name, value, message):
    x = _step_inputs("kda")
    state = torch.randn(B, H, K, V)
    target = state if name == "state" else x[name]
    target.view(-1)[3] = value  # one bad entry
    before = state.clone()
    with pytest.raises(ValueError, match=message):
        recurrent_step(state, **x)
    assert torch.equal(state, before) or name == "state"


def _wide_step_inputs(rule: str, gate: str | None, dtype, seed: int) -> dict:
    """One token of 2 sequences of 4 value heads (2 q/k heads) with V = 147 columns: the fused
    step's blocks of every width (csrc/step.h: 128 + 16 + 3 columns with AVX-512, 4 x 32 + 2 x 8
    + 3 with AVX2) and K = 9; dplr's [a | b] gentle (a = -0.5 b-ish), so that steps stay bounded."""
    gen = torch.Generator().manual_seed(seed)
    Bw, Hq, Hv, Kw, Vw = 2, 2, 4, 9, 147
    x = {
        "q": torch.randn(Bw, Hq, Kw, generator=gen),
        "k": torch.nn.functional.normalize(torch.randn(Bw, Hq, Kw, generator=gen), dim=-1),
        "v": torch.randn(Bw, Hv, Vw, generator=gen),
        "beta": torch.rand(Bw, Hv, generator=gen) * 2 if rule == "delta" else None,
        "g": {None: None, "head": -torch.rand(Bw, Hv, generator=gen),
              "channel": -torch.rand(Bw, Hv, Kw, generator=gen)}[gate],
    }  # fmt: skip
    if rule == "dplr":
        b = torch.nn.functional.normalize(torch.randn(Bw, Hv, Kw, generator=gen), dim=-1)
        x["a"], x["b"] = -0.5 * b + 0.1 * torch.randn(Bw, Hv, Kw, generator=gen) / Kw, b
    return {n: None if t is None else t.to(dtype) for n, t in x.items()}


@needs_native
@pytest.mark.parametrize("gate", [None, "head", "channel"])
@pytest.mark.parametrize("rule", ["additive", "delta", "dplr"])
def test_fused_step_of_every_rule_and_block_width_equals_float64(rule, gate):
    # Four steps in float32 through the fused C++ step (dplr's included) against the
    # same steps in float64 (the PyTorch step: the recurrence's own arithmetic).
    gen = torch.Generator().manual_seed(7)
    S0 = torch.randn(2, 4, 9, 147, generator=gen, dtype=torch.float64)
    fused, exact = S0.float(), S0.clone()
    for t in range(4):
        x = _wide_step_inputs(rule, gate, torch.float32, t)
        a, b = x.pop("a", None), x.pop("b", None)
        beta = x["beta"] if a is None else torch.cat([a, b], dim=-1)  # dplr: [a | b] [B, H, 2K]
        o = _native.recurrent_step(fused, x["q"], x["k"], x["v"], beta, x["g"], 0.6, rule)
        o64 = recurrent_step(exact, **_wide_step_inputs(rule, gate, torch.float64, t), scale=0.6)
        assert o is not None and rel_rms(o, o64) < 2e-6, t
    assert rel_rms(fused, exact) < 2e-6


@needs_native
@pytest.mark.parametrize("gate", [None, "channel"])
def test_fused_dplr_step_takes_a_and_b_apart_as_it_takes_them_stacked(gate):
    # The fast path hands a and b to the kernel apart (no concatenation per token): the same
    # step, number for number, as [a | b] in beta's slot; b with any other rule, or of another
    # shape, is refused before the state is touched.
    x = _wide_step_inputs("dplr", gate, torch.float32, 0)
    a, b = x.pop("a"), x.pop("b")
    gen = torch.Generator().manual_seed(3)
    S = torch.randn(2, 4, 9, 147, generator=gen)
    stacked, apart = S.clone(), S.clone()
    g = x["g"]
    gate_name = "none" if gate is None else gate
    step = torch.ops.linattn_native.recurrent_step
    o1 = step(stacked, x["q"], x["k"], x["v"], torch.cat([a, b], -1), g, 0.6, "dplr", gate_name)
    o2 = step(apart, x["q"], x["k"], x["v"], a, g, 0.6, "dplr", gate_name, None, b)
    assert torch.equal(o1, o2) and torch.equal(stacked, apart)
    torch.library.opcheck(step, (S.clone(), x["q"], x["k"], x["v"], a, g, 0.6, "dplr",
                                 gate_name, None, b))  # fmt: skip
    before = S.clone()
    with pytest.raises(RuntimeError, match="b must be None for the delta rule"):
        step(S, x["q"], x["k"], x["v"], torch.rand(2, 4), g if gate else None, 0.6, "delta",
             gate_name, None, b)  # fmt: skip
    with pytest.raises(RuntimeError, match=r"b must be of shape \[B, H, K\]"):
        step(S, x["q"], x["k"], x["v"], a, g, 0.6, "dplr", gate_name, None, b[..., :-1])
    b_nan = b.clone()
    b_nan[0, 0, 0] = float("nan")
    assert step(S, x["q"], x["k"], x["v"], a, g, 0.6, "dplr", gate_name, None, b_nan).numel() == 0
    assert torch.equal(S, before)


MIB = 2**20


@pytest.fixture
def empty_cache():
    """Start and end with no kept blocks (other tests leave freed outputs in the cache); no
    garbage collection in between, which could free another test's tensors into the cache."""
    gc.collect()
    gc.disable()
    _native.cache_release()
    try:
        yield
    finally:
        gc.enable()
        _native.cache_release()


@needs_native
def test_a_freed_block_serves_the_next_tensor_of_its_size(empty_cache):
    x = _native.empty((4, MIB), torch.zeros(1))  # 16 MiB
    address = x.data_ptr()
    assert _native.cache_bytes() == 0
    del x
    assert _native.cache_bytes() == 16 * MIB
    y = _native.empty((2, 2 * MIB), torch.zeros(1))  # the same 16 MiB, another shape
    assert y.data_ptr() == address and _native.cache_bytes() == 0


@needs_native
def test_a_new_size_returns_the_kept_blocks_first(empty_cache):
    del_me = [_native.empty((4, MIB), torch.zeros(1)) for _ in range(2)]
    del del_me
    assert _native.cache_bytes() == 32 * MIB
    x = _native.empty((6, MIB), torch.zeros(1))  # 24 MiB: no block of that size is kept
    assert _native.cache_bytes() == 0  # the 16 MiB blocks went back before the new one
    del x
    assert _native.cache_bytes() == 24 * MIB
    assert _native.cache_release() == 24 * MIB and _native.cache_bytes() == 0


@needs_native
def test_the_cache_keeps_at_most_its_limit(empty_cache, monkeypatch):
    monkeypatch.setenv("LINATTN_CACHE_MIB", "20")
    two = [_native.empty((4, MIB), torch.zeros(1)) for _ in range(2)]
    del two
    assert _native.cache_bytes() == 16 * MIB  # the second block would pass 20 MiB
    _native.cache_release()
    monkeypatch.setenv("LINATTN_CACHE_MIB", "0")
    x = _native.empty((4, MIB), torch.zeros(1))
    del x
    assert _native.cache_bytes() == 0


@needs_native
def test_a_cached_tensor_resizes_like_any_other(empty_cache):
    x = _native.empty((4, MIB), torch.zeros(1))
    x.fill_(3.0)
    x.resize_(8, MIB)  # past its block: PyTorch's allocator takes over, the block comes back
    assert bool((x[:4] == 3.0).all()) and x.shape == (8, MIB)
    assert _native.cache_bytes() == 16 * MIB


@needs_native
@pytest.mark.parametrize("mechanism", STEP_MECHANISMS)
def test_outputs_in_reused_blocks_are_written_whole(mechanism, empty_cache):
    """Outputs, saved states and gradients that land in blocks full of NaN (a previous tensor's
    leftovers) equal those computed in fresh, zeroed memory, bit for bit."""
    beta = mechanism in ("delta", "gated_delta", "kda")
    gate = {"scalar_decay": "scalar", "gated_delta": "scalar", "gla": "channel", "kda": "channel"}
    rule = "delta" if beta else "additive"
    x = make_inputs(
        B=1, T=2048, H=8, K=64, V=64, rule=rule, gate=gate.get(mechanism), dtype=torch.float32
    )  # o, dq, dk, dv, the saved states: 4 MiB each

    def run():
        inputs = {
            n: t.clone().requires_grad_(True) for n, t in x.items() if t is not None and n != "S0"
        }
        op = delta_rule if beta else linear_attention
        extra = (inputs["beta"],) if beta else ()
        o, S = op(
            inputs["q"],
            inputs["k"],
            inputs["v"],
            *extra,
            g=inputs.get("g"),
            mode="chunk",
            output_final_state=True,
        )
        (o.square().sum() + S.sum()).backward()
        return [o.detach(), S.detach()] + [inputs[n].grad for n in sorted(inputs)]

    fresh = run()
    _native.cache_release()
    poison = [_native.empty((2048, 8, 64), torch.zeros(1)).fill_(float("nan")) for _ in range(12)]
    addresses = {t.data_ptr() for t in poison}
    del poison
    assert _native.cache_bytes() == 12 * 4 * MIB
    reused = run()
    assert reused[0].data_ptr() in addresses  # the output did land in a poisoned block
    for a, b in zip(fresh, reused, strict=True):
        assert torch.equal(a, b)
