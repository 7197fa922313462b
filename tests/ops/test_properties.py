"""Property tests (hypothesis): every accepted input equals an independent float64
recurrence, forward and gradients, and every refused input gets our named error.

The suite is organised by *region*: each test is parametrised over the forms (parallel, recurrent,
chunk with the fused C++ loop, chunk with ``LINATTN_NATIVE=0``) or the step's precision, and one
family of inputs (gentle gates, resets, -inf, steep gates; strided, expanded or 1-token stride-0
layouts; empty dimensions; one kind of bad input); inside a region hypothesis draws everything
else (mechanism, shapes with size-1 dimensions, dtype, chunk size from 1 to beyond T, beta over
[0, 2], initial states, ``cu_seqlens``, normalize, use_qk_l2norm, scale, seed). A region with a
known defect is marked ``xfail(strict=True)`` in ``KNOWN_DEFECTS`` only, so that it
must fail until the defect is fixed and its mark removed.

Profiles: ``FAST`` runs in the default test run (few examples, no deadline, derandomized so that CI
is reproducible, no shrinking); ``SLOW`` (``-m slow``) draws many more examples and shrinks a
failure to a minimal reproducer.

Tolerances follow the dtype's rounding (``TOLERANCE``): relative RMS error, with an absolute floor
(``ABSOLUTE`` times the problem's magnitude) where the reference itself is tiny, never a skip.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from linattn.ops import (
    _engine,
    delta_rule,
    generalized_delta_rule,
    linear_attention,
    recurrent_step,
)

from .float64_recurrence import recurrence

# ---------------------------------------------------------------------------------------------
# Profiles, tolerances, regions
# ---------------------------------------------------------------------------------------------

FAST = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)
SLOW = settings(FAST, max_examples=150, phases=(Phase.explicit, Phase.generate, Phase.shrink))

# Relative RMS error allowed per dtype. float32 is the 1e-5; bfloat16 keeps the suite's
# existing 1e-2 (2.6 units of its rounding, 2^-8); float16 the same multiple of its unit 2^-11.
TOLERANCE = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.bfloat16: 1e-2,
    torch.float16: 2.56 * 2.0**-11,
}
DTYPES = tuple(TOLERANCE)
# Where a tensor is tiny (a sum that cancels, a zero gradient), relative error means nothing: its
# error is then bounded in absolute terms, ABSOLUTE[compute dtype] x the problem's magnitude (the
# largest RMS of the reference's tensors compared together), about 17 units of float32 rounding.
ABSOLUTE = {torch.float64: 1e-13, torch.float32: 1e-6}

FORMS = ("parallel", "recurrent", "chunk", "chunk_torch")
GATES = ("gentle", "reset", "neg_inf", "steep")
# "token": one token (T = 1, or 1-token packed sequences) sliced from inputs expanded along time.
LAYOUTS = ("strided", "expanded", "token")
STATE_DTYPES = ("float32", "float64")  # the generation step's state
# The step's precision: "float32" (every input and the state, contiguous: the fused C++ step),
# "float64", "mixed" (a float32 or float64 state, inputs of any dtype, any state layout).
PRECISIONS = ("float32", "float64", "mixed")
RULES = ("additive", "delta", "dplr")  # dplr: generalized_delta_rule
RESETS = (-1e3, -1e4, -1e5, -1e6, -1e7, -1e20, -1e38)  # finite log-gates that flush a memory


# Regions that fail because of a known defect: region -> issue number, each marked
# xfail(strict=True) so that it must fail until fixed and its entry removed. Empty: the known
# defects (resets, stride-0 slices, double backward, the step's gradients, empty dimensions,
# strictness) are fixed, and every region passes.
KNOWN_DEFECTS: dict[tuple[str, ...], int] = {}


def regions(test: str, *axes) -> list:
    """Every combination of the axes' values, once per profile: (*values, profile) parameter
    sets, the SLOW ones marked slow, and xfail(strict) where KNOWN_DEFECTS names the region
    (its values' ids; with "fast" or "slow" appended, in that profile only)."""
    out = []
    for combo in itertools.product(*axes):
        ids = tuple(str(getattr(c, "label", c)) for c in combo)
        for name, profile in (("fast", FAST), ("slow", SLOW)):
            marks = [pytest.mark.slow] if profile is SLOW else []
            defect = KNOWN_DEFECTS.get((test, *ids), KNOWN_DEFECTS.get((test, *ids, name)))
            if defect is not None:
                marks.append(pytest.mark.xfail(strict=True, reason=f"issue 18 defect {defect}"))
            out.append(pytest.param(*combo, profile, id="-".join((*ids, name)), marks=marks))
    return out


def holds(profile: settings, strategy, check) -> None:
    """Run ``check`` on examples of ``strategy`` under a profile (hypothesis prints a failure)."""

    @profile
    @given(strategy)
    def prop(example):
        check(example)

    prop()


# ---------------------------------------------------------------------------------------------
# Problems: everything about an input but its values, drawn by hypothesis
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How a tensor is laid out in memory (the values are the same in every layout).

    kind: "contiguous"; "permuted" (stored in the order ``perm``, then permuted back: transposed
    strides); "sliced" (every ``step``-th entry of dimension ``dim``, from ``offset``: a storage
    offset and a stride wider than the size, the gaps filled with NaN); "expanded" (dimension
    ``dim`` broadcast from one entry: stride 0, to ``extra`` entries more than its size, then
    sliced back: a 1-token slice of an expanded tensor keeps its stride 0).
    """

    kind: str = "contiguous"
    dim: int = 0
    perm: tuple[int, ...] = ()
    step: int = 1
    offset: int = 0
    extra: int = 0


@dataclass(frozen=True)
class Problem:
    """One call of ``linear_attention`` (rule "additive"), ``delta_rule`` (rule "delta") or
    ``generalized_delta_rule`` (rule "dplr")."""

    rule: str  # "additive" | "delta" | "dplr"
    gate: str | None  # None | "scalar" ([B, T, H]) | "channel" ([B, T, H, K])
    gates: str  # a family of GATES (or "zero": alpha = 1 exactly)
    B: int
    T: int
    H: int
    K: int
    V: int
    dtype: torch.dtype
    lengths: tuple[int, ...] | None  # packed sequences (cu_seqlens), B = 1
    state: bool
    normalize: bool
    l2norm: bool
    scale: float | None
    chunk_size: int
    beta: str  # "uniform" | "ends" (0 and 2 mixed in) | "two" (Householder) | "zero"
    layouts: tuple[tuple[str, Layout], ...]
    seed: int

    @property
    def mechanism(self) -> str:
        names = {
            "additive": ("linear", "scalar_decay", "gla"),
            "delta": ("delta", "gdn", "kda"),
            "dplr": ("iplr", "dplr_head", "dplr"),
        }
        return names[self.rule][(None, "scalar", "channel").index(self.gate)]

    @property
    def N(self) -> int:
        return self.B if self.lengths is None else len(self.lengths)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every input this problem passes (S0 is the initial state)."""
        V = self.V + 1 if self.normalize else self.V
        out = {
            "q": (self.B, self.T, self.H, self.K),
            "k": (self.B, self.T, self.H, self.K),
            "v": (self.B, self.T, self.H, self.V),
        }
        if self.rule == "delta":
            out["beta"] = (self.B, self.T, self.H)
        if self.rule == "dplr":  # b first: a is drawn from it (``values``)
            out["b"] = out["a"] = (self.B, self.T, self.H, self.K)
        if self.gate is not None:
            out["g"] = (self.B, self.T, self.H) + ((self.K,) if self.gate == "channel" else ())
        if self.state:
            out["S0"] = (self.N, self.H, self.K, V)
        return out


@st.composite
def layouts(draw, ndim: int, kinds: tuple[str, ...]) -> Layout:
    kind = draw(st.sampled_from(kinds))
    if kind == "permuted":
        return Layout(kind, perm=tuple(draw(st.permutations(range(ndim)))))
    dim = draw(st.integers(0, ndim - 1))
    if kind == "sliced":
        return Layout(kind, dim=dim, step=draw(st.integers(1, 3)), offset=draw(st.integers(0, 3)))
    if kind == "expanded":
        return Layout(kind, dim=dim, extra=draw(st.integers(0, 3)))
    return Layout()


LAYOUT_KINDS = {
    "contiguous": ("contiguous",),
    "strided": ("contiguous", "permuted", "sliced"),
    "expanded": ("contiguous", "expanded", "permuted", "sliced"),
    "token": ("contiguous", "expanded", "permuted", "sliced"),
}


@st.composite
def problems(
    draw,
    gates: str = "gentle",
    layout: str = "contiguous",
    empty: bool = False,
    rules: tuple[str, ...] = RULES,
    gated: bool = False,
):
    """A Problem in one region: a gate family, a layout family, empty dimensions or not (rules:
    the ops to draw from; gated: never g = None)."""
    rule = draw(st.sampled_from(rules))
    gated = gated or gates != "gentle"
    gate_shapes = ["scalar", "channel"] if gated else [None, "scalar", "channel"]
    gate = draw(st.sampled_from(gate_shapes))
    if gates == "gentle" and gate is not None:
        gates = draw(st.sampled_from(["gentle", "gentle", "zero"]))
    if empty:  # B, H or T = 0 (T = 0 below)
        B, H = draw(st.sampled_from([(0, 1), (0, 2), (1, 0), (2, 0), (0, 0), (1, 1), (2, 1)]))
    else:
        B, H = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    lengths = None
    if not empty and draw(st.integers(0, 3)) == 0:
        lengths = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=4)))
        B = 1
    if layout == "token":
        lengths = (*lengths, 1) if lengths else None  # a 1-token sequence among others
    T = sum(lengths) if lengths else (1 if layout == "token" else draw(st.integers(1, 24)))
    if empty:
        T = draw(st.integers(0, 5)) if B * H == 0 else 0
    normalize = rule == "additive" and draw(st.integers(0, 3)) == 0
    shape = dict(
        rule=rule, gate=gate, gates=gates, B=B, T=T, H=H, K=draw(st.integers(1, 6)),
        V=draw(st.integers(1, 5)), dtype=draw(st.sampled_from(DTYPES)), lengths=lengths,
        state=draw(st.booleans()), normalize=normalize,
    )  # fmt: skip
    # use_qk_l2norm with K = 1 maps every key to about +-1: its derivative, 1e-6 / (k^2 + 1e-6)^1.5,
    # is all cancellation in float32 (an ill-conditioned input, not a defect), so K >= 2 there.
    p = Problem(
        **shape,
        l2norm=rule == "delta" and shape["K"] > 1 and draw(st.integers(0, 3)) == 0,
        scale=draw(st.sampled_from([None, 1.0, 0.3])),
        chunk_size=draw(st.integers(1, T + 8)),
        beta=draw(st.sampled_from(["uniform", "uniform", "ends", "two", "zero"])),
        layouts=(),
        seed=draw(st.integers(0, 2**16)),
    )
    return _replace(p, layouts=draw(layouts_of(p, layout)))


@st.composite
def layouts_of(draw, p: Problem, layout: str) -> tuple[tuple[str, Layout], ...]:
    """A layout for each of the problem's inputs, from the family ``layout``."""
    ndim = {n: len(shape) for n, shape in p.shapes().items()}
    drawn = tuple((n, draw(layouts(ndim[n], LAYOUT_KINDS[layout]))) for n in ndim)
    if layout == "token":  # every token input expanded along time (stride 0), then sliced
        drawn = tuple((n, Layout("expanded", dim=1, extra=draw(st.integers(1, 3)))
                       if n != "S0" else lay) for n, lay in drawn)  # fmt: skip
    if layout == "expanded" and all(lay.kind != "expanded" for _, lay in drawn):
        n = draw(st.sampled_from(list(ndim)))  # at least one stride 0
        drawn = tuple((m, Layout("expanded", dim=draw(st.integers(0, ndim[m] - 1)), extra=1))
                      if m == n else (m, lay) for m, lay in drawn)  # fmt: skip
    return drawn


@st.composite
def step_problems(
    draw, gates: str = "gentle", precision: str = "mixed", rules=RULES, empty: bool = False
):
    """(Problem, state dtype) for ``recurrent_step``: up to 4 steps from an initial state, the
    step's inputs the tokens of [B, T, H, D] inputs in strided layouts."""
    p = draw(problems(gates=gates, layout="strided", empty=empty, rules=rules))
    T = draw(st.integers(1, 4))
    p = _replace(p, T=T, lengths=None, normalize=False, l2norm=False, state=True, chunk_size=1)
    if empty and p.B * p.H:
        p = _replace(p, B=0)  # a step has no token axis: an empty batch
    if precision == "mixed":  # not all float32 (that is the fused step's region)
        state_dtype = getattr(torch, draw(st.sampled_from(STATE_DTYPES)))
        if state_dtype == p.dtype == torch.float32:
            p = _replace(p, dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])))
    else:
        state_dtype = getattr(torch, precision)
        p = _replace(p, dtype=state_dtype)
    p = _replace(p, layouts=draw(layouts_of(p, "strided")))
    if precision == "float32":
        p = _replace(p, layouts=tuple((n, Layout() if n == "S0" else lay) for n, lay in p.layouts))
    return p, state_dtype


def _replace(p: Problem, **changes) -> Problem:
    return Problem(**{**p.__dict__, **changes})


# ---------------------------------------------------------------------------------------------
# Values: float64 numbers from the seed, rounded to the dtype, placed in the drawn layouts
# ---------------------------------------------------------------------------------------------


def log_gates(p: Problem, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """g <= 0 of the problem's family (float64). Steep: Gated DeltaNet's
    -exp(A_log) * softplus(x + dt_bias), A = exp(A_log) up to 16, large pre-activations x; with a
    per-channel shape the same per channel (KDA)."""
    normal = torch.randn(shape, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(normal + 2.0)  # decays mostly in (0.5, 1)
    if p.gates == "zero":
        return torch.zeros(shape, dtype=torch.float64)
    if p.gates == "steep":
        H = shape[2]
        A = torch.exp(torch.rand(H, generator=gen, dtype=torch.float64) * math.log(16.0))
        dt = torch.exp(torch.empty(shape[2:], dtype=torch.float64).uniform_(
            math.log(1e-3), math.log(0.1), generator=gen))  # fmt: skip
        dt_bias = dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt), as Mamba-2 initialises
        x = normal * torch.tensor([1.0, 5.0, 30.0], dtype=torch.float64)[p.seed % 3]
        A = A.reshape(H, *([1] * (len(shape) - 3)))
        return -A * torch.nn.functional.softplus(x + dt_bias)
    if p.gates in ("reset", "neg_inf"):
        finite = [r for r in RESETS if r > -torch.finfo(p.dtype).max]
        values = torch.tensor(finite if p.gates == "reset" else [-math.inf], dtype=torch.float64)
        where = torch.rand(shape, generator=gen) < 0.2
        if where.numel():
            where.view(-1)[torch.randint(where.numel(), (1,), generator=gen)] = True
        pick = values[torch.randint(len(values), shape, generator=gen)]
        g = torch.where(where, pick, g)
    return g


def betas(p: Problem, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    beta = 2 * torch.rand(shape, generator=gen, dtype=torch.float64)
    if p.beta == "ends":
        ends = 2.0 * torch.randint(2, shape, generator=gen)
        beta = torch.where(torch.rand(shape, generator=gen) < 0.5, ends, beta)
    elif p.beta in ("two", "zero"):
        beta = torch.full(shape, 2.0 if p.beta == "two" else 0.0, dtype=torch.float64)
    return beta


def expand_like(x: torch.Tensor, lay: Layout) -> torch.Tensor:
    """The values an expanded layout can hold: the first entry of ``lay.dim`` broadcast."""
    if lay.kind != "expanded" or x.shape[lay.dim] == 0:
        return x
    return x.narrow(lay.dim, 0, 1).expand_as(x).clone()


def values(p: Problem) -> dict[str, torch.Tensor]:
    """The problem's inputs as float64 values (keys of unit length unless normalize or l2norm
    asks otherwise; positive features with normalize), already rounded to the dtype."""
    gen = torch.Generator().manual_seed(p.seed)
    shapes, lay = p.shapes(), dict(p.layouts)
    out = {}
    for n, shape in shapes.items():
        if n == "g":
            x = log_gates(p, shape, gen)
        elif n == "beta":
            x = betas(p, shape, gen)
        else:
            x = torch.randn(shape, generator=gen, dtype=torch.float64)
        if p.normalize and n in ("q", "k"):
            x = torch.nn.functional.elu(x) + 1  # positive features: a positive denominator
        if p.normalize and n == "S0":
            x[..., -1] = x[..., -1].abs()  # the normaliser's column z_0 >= 0
        x = expand_like(x, lay[n])
        if n in ("k", "b") and not (p.normalize or p.l2norm):
            x = x / x.norm(dim=-1, keepdim=True)
        if n == "a":  # a = -beta b + a little noise: transitions near I - beta b b^T, contracting
            beta = betas(p, shape[:-1], gen).unsqueeze(-1)
            x = expand_like(-beta * out["b"] + 0.1 * x / math.sqrt(p.K), lay[n])
        out[n] = x.to(p.dtype).double()
    return out


def place(x: torch.Tensor, lay: Layout):
    """(storage, view): ``view(storage)`` holds x's values in layout ``lay``; the storage is the
    leaf that gradients reach."""
    if lay.kind == "permuted":
        inverse = tuple(int(i) for i in np.argsort(lay.perm))
        return x.permute(lay.perm).contiguous(), lambda s: s.permute(inverse)
    if lay.kind == "sliced":
        size = x.shape[lay.dim]
        big = list(x.shape)
        big[lay.dim] = lay.offset + lay.step * size
        index = [slice(None)] * x.dim()
        index[lay.dim] = slice(lay.offset, lay.offset + lay.step * size, lay.step)
        storage = torch.full(big, math.nan, dtype=x.dtype)  # never read: the gaps are NaN
        storage[tuple(index)] = x
        return storage, lambda s: s[tuple(index)]
    if lay.kind == "expanded":
        size = x.shape[lay.dim]
        wide = list(x.shape)
        wide[lay.dim] = size + lay.extra
        one = torch.zeros_like(x.narrow(lay.dim, 0, 0)).sum(lay.dim, keepdim=True)
        storage = x.narrow(lay.dim, 0, 1).clone() if size else one
        return storage, lambda s: s.expand(wide).narrow(lay.dim, 0, size)
    return x.clone(), lambda s: s


@dataclass
class Inputs:
    """The leaves (storages, requiring grad if asked) and the views passed to the op."""

    leaves: dict[str, torch.Tensor]
    views: dict[str, torch.Tensor]


def build(p: Problem, dtype: torch.dtype | None, grad: bool = False) -> Inputs:
    """The problem's inputs in ``dtype`` (None: the problem's own), in its layouts."""
    lay = dict(p.layouts)
    leaves, views = {}, {}
    for n, x in values(p).items():
        storage, view = place(x.to(dtype or p.dtype), lay[n])
        leaves[n] = storage.requires_grad_(grad)
        views[n] = view(leaves[n])
    return Inputs(leaves, views)


# ---------------------------------------------------------------------------------------------
# Running the op under test and the reference
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def loop(form: str):
    """chunk_torch: the chunk form's PyTorch loop (LINATTN_NATIVE=0), read at every call."""
    if form == "chunk_torch":
        with mock.patch.dict(os.environ, {"LINATTN_NATIVE": "0"}):
            yield
    else:
        yield


def cu_seqlens(p: Problem) -> torch.Tensor | None:
    if p.lengths is None:
        return None
    return torch.tensor((0, *p.lengths)).cumsum(0)


def call(p: Problem, form: str, x: dict[str, torch.Tensor], **overrides):
    """The public op on the inputs x (keyword ``overrides`` replace any argument)."""
    kw = dict(
        scale=p.scale, mode="chunk" if form.startswith("chunk") else form,
        chunk_size=p.chunk_size, initial_state=x.get("S0"), output_final_state=True,
        cu_seqlens=cu_seqlens(p),
    )  # fmt: skip
    if p.rule == "additive":
        args = dict(q=x["q"], k=x["k"], v=x["v"], g=x.get("g"), normalize=p.normalize)
        return linear_attention(**{**args, **kw, **overrides})
    if p.rule == "dplr":
        args = dict(q=x["q"], k=x["k"], v=x["v"], a=x["a"], b=x["b"], g=x.get("g"))
        return generalized_delta_rule(**{**args, **kw, **overrides})
    args = dict(q=x["q"], k=x["k"], v=x["v"], beta=x["beta"], g=x.get("g"))
    return delta_rule(**{**args, **kw, "use_qk_l2norm": p.l2norm, **overrides})


def reference(p: Problem, x: dict[str, torch.Tensor]):
    bounds = None if p.lengths is None else cu_seqlens(p).tolist()
    return recurrence(
        x["q"], x["k"], x["v"], x.get("beta"), x.get("g"), x.get("S0"), scale=p.scale,
        normalize=p.normalize, use_qk_l2norm=p.l2norm, cu_seqlens=bounds, a=x.get("a"),
        b=x.get("b"),
    )  # fmt: skip


def rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt()) if x.numel() else 0.0


def assert_agrees(
    name: str,
    x: torch.Tensor | None,
    ref: torch.Tensor,
    magnitude: float,
    compute: torch.dtype | None = None,
) -> None:
    """x equals ref to the rounding of x's dtype and of the compute dtype (float32 unless x is
    float64): RMS error <= TOLERANCE x RMS(ref), or, where ref is tiny, ABSOLUTE x magnitude."""
    assert x is not None, f"{name}: no result (None)"
    assert tuple(x.shape) == tuple(ref.shape), f"{name}: shape {tuple(x.shape)} != {ref.shape}"
    assert bool(torch.isfinite(x).all()), f"{name}: NaN or Inf where the reference is finite"
    compute = compute or (torch.float64 if x.dtype == torch.float64 else torch.float32)
    error, size = rms(x.double() - ref), rms(ref)
    tolerance = max(TOLERANCE[x.dtype], TOLERANCE[compute])
    bound = max(tolerance * size, ABSOLUTE[compute] * magnitude)
    assert error <= bound, (
        f"{name} ({x.dtype}): RMS error {error:.3g} > {bound:.3g} (relative "
        f"{error / size if size else math.inf:.3g}, problem magnitude {magnitude:.3g})"
    )
    if x.dtype == compute == torch.float64:  # the suite's float64 bound: every entry within 1e-10
        worst = float((x.double() - ref).abs().max()) if x.numel() else 0.0
        assert worst <= 1e-10 * max(1.0, size), f"{name}: max error {worst:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tiny_reference_is_still_bounded_in_absolute_terms(dtype):
    """Where the reference is ~0 (it cancels, or a reset zeroes a gradient), the comparison is
    |error| <= ABSOLUTE x magnitude, never a pass by default: an error of 1.5 floors fails, one of
    half a floor passes, and with nothing of size in the problem only exact zeros pass."""
    ref = torch.full((3, 4), 1e-17, dtype=torch.float64)  # about zero: relative error means nothing
    floor = ABSOLUTE[dtype] * 2.0  # magnitude 2: the largest RMS among the tensors compared
    assert_agrees("x", (ref + 0.5 * floor).to(dtype), ref, magnitude=2.0)
    with pytest.raises(AssertionError, match="RMS error"):
        assert_agrees("x", (ref + 1.5 * floor).to(dtype), ref, magnitude=2.0)
    zero = torch.zeros(3, 4, dtype=torch.float64)
    assert_agrees("x", zero.to(dtype), zero, magnitude=0.0)
    with pytest.raises(AssertionError, match="RMS error"):
        assert_agrees("x", torch.full((3, 4), 1e-30, dtype=dtype), zero, magnitude=0.0)


def weights(like: torch.Tensor, seed: int) -> torch.Tensor:
    """Fixed random output weights (multiples of 1/8 in [-2, 2], exact in every dtype, so that
    the op and the reference weigh alike): the loss sum(o * W) reaches every gradient path."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(-16, 17, like.shape, generator=gen).double() / 8


def gradients(outputs, inputs: dict[str, torch.Tensor], seed: int, create_graph=False):
    """d(sum_i sum(outputs_i * W_i)) / d input for every input. As in PyTorch, an input that the
    outputs do not depend on (an output without a graph, an unused input) has a zero gradient."""
    pairs = [(o, weights(o, seed + i).to(o.dtype)) for i, o in enumerate(outputs)]
    pairs = [(o, w) for o, w in pairs if o.requires_grad]
    if not pairs:
        return {n: torch.zeros_like(x) for n, x in inputs.items()}
    found = torch.autograd.grad(
        [o for o, _ in pairs], list(inputs.values()), [w for _, w in pairs],
        allow_unused=True, materialize_grads=True, create_graph=create_graph,
    )  # fmt: skip
    return dict(zip(inputs, found, strict=True))


def assert_no_work(fn, error: type[Exception], name: str) -> None:
    """fn raises ``error`` naming ``name`` and never reaches the engine."""
    with mock.patch.object(_engine, "run", side_effect=AssertionError("work before validation")):
        with pytest.raises(error, match=rf"\b{name}\b"):
            fn()


# ---------------------------------------------------------------------------------------------
# The properties of the sequence ops
# ---------------------------------------------------------------------------------------------


def forward_agrees(p: Problem, form: str) -> None:
    """o and the final state equal the float64 recurrence to the dtype's rounding."""
    x = build(p, None)
    with loop(form):
        o, S = call(p, form, x.views)
    o_ref, S_ref = reference(p, {n: t.double() for n, t in x.views.items()})
    assert o.dtype == p.dtype
    assert S.dtype == (torch.float64 if p.dtype == torch.float64 else torch.float32)
    magnitude = max(rms(o_ref), rms(S_ref))
    assert_agrees("o", o, o_ref, magnitude)
    assert_agrees("final_state", S, S_ref, magnitude)


def gradients_agree(p: Problem, form: str) -> None:
    """The gradients of q, k, v, beta, g and the initial state equal the float64 recurrence's."""
    # The gradients of the views the op reads: a gradient summed over an expanded dimension
    # would add autograd's own rounding in the input dtype.
    derivatives_agree(p, form, gradients, "d")


def derivatives_agree(p: Problem, form: str, derive, prefix: str) -> None:
    """``derive(outputs, inputs, seed)`` through the op equals it through the float64 recurrence,
    input by input (named ``prefix`` + the input's name)."""
    x = build(p, None, grad=True)
    with loop(form):
        found = derive(call(p, form, x.views), x.views, p.seed)
    x64 = build(p, torch.float64, grad=True)
    expected = derive(reference(p, x64.views), x64.views, p.seed)
    magnitude = max((rms(e) for e in expected.values()), default=0.0)
    for n, e in expected.items():
        assert_agrees(f"{prefix}{n}", found[n], e, magnitude)


@pytest.mark.parametrize(("form", "gates", "profile"), regions("forward-gates", FORMS, GATES))
def test_forward_with_any_gates(form, gates, profile):
    holds(profile, problems(gates=gates), lambda p: forward_agrees(p, form))


@pytest.mark.parametrize(("form", "gates", "profile"), regions("gradients-gates", FORMS, GATES))
def test_gradients_with_any_gates(form, gates, profile):
    holds(profile, problems(gates=gates), lambda p: gradients_agree(p, form))


@pytest.mark.parametrize(("form", "layout", "profile"), regions("forward-layout", FORMS, LAYOUTS))
def test_forward_in_any_layout(form, layout, profile):
    holds(profile, problems(layout=layout), lambda p: forward_agrees(p, form))


@pytest.mark.parametrize(("form", "layout", "profile"), regions("gradients-layout", FORMS, LAYOUTS))
def test_gradients_in_any_layout(form, layout, profile):
    holds(profile, problems(layout=layout), lambda p: gradients_agree(p, form))


@pytest.mark.parametrize(("form", "profile"), regions("forward-empty", FORMS))
def test_forward_of_empty_inputs(form, profile):
    holds(profile, problems(layout="strided", empty=True), lambda p: forward_agrees(p, form))


@pytest.mark.parametrize(("form", "profile"), regions("gradients-empty", FORMS))
def test_gradients_of_empty_inputs(form, profile):
    holds(profile, problems(layout="strided", empty=True), lambda p: gradients_agree(p, form))


@st.composite
def packed_problems(draw, rules: tuple[str, ...] = RULES):
    """float64 problems with packed sequences (cu_seqlens), any layout."""
    p = draw(problems(layout="strided", rules=rules))
    lengths = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=4)))
    p = _replace(p, B=1, T=sum(lengths), lengths=lengths, dtype=torch.float64)
    return _replace(p, layouts=draw(layouts_of(p, "strided")))


def packed_sequences_run_alone(p: Problem, form: str) -> None:
    """With cu_seqlens every sequence is the op on its own tokens from its own initial state."""
    x = build(p, None).views
    with loop(form):
        o, S = call(p, form, x)
        bounds = cu_seqlens(p).tolist()
        for n, (a, b) in enumerate(itertools.pairwise(bounds)):
            part = {m: t if m == "S0" else t[:, a:b] for m, t in x.items()}
            if "S0" in part:
                part["S0"] = part["S0"][n : n + 1]
            o_n, S_n = call(_replace(p, T=b - a, lengths=None), form, part)
            torch.testing.assert_close(o[:, a:b], o_n, rtol=0, atol=1e-12)
            torch.testing.assert_close(S[n : n + 1], S_n, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("form", "profile"), regions("packed", FORMS))
def test_packed_sequences_run_alone(form, profile):
    holds(profile, packed_problems(), lambda p: packed_sequences_run_alone(p, form))


def second_derivatives(outputs, inputs: dict[str, torch.Tensor], seed: int):
    """d/dx of sum_n <dL/dn, W_n> (L = sum_i <outputs_i, W_i>): double backward, create_graph."""
    first = gradients(outputs, inputs, seed, create_graph=True)
    total = sum(
        (f.double() * weights(f, seed + 10 + i)).sum() for i, f in enumerate(first.values())
    )
    return gradients([total], inputs, seed + 20)


def double_backward_agrees(p: Problem, form: str) -> None:
    """Second derivatives through the op equal those through the float64 recurrence."""
    derivatives_agree(p, form, second_derivatives, "d2/d")


@pytest.mark.parametrize(("form", "profile"), regions("double-backward", FORMS))
def test_double_backward(form, profile):
    holds(profile, problems(layout="strided"), lambda p: double_backward_agrees(p, form))


# The generalized delta rule in regions of its own: drawn among the three rules above,
# a region of a few examples may draw it not at all.
DPLR = ("dplr",)


@pytest.mark.parametrize(("form", "gates", "profile"), regions("dplr-forward-gates", FORMS, GATES))
def test_dplr_forward_with_any_gates(form, gates, profile):
    holds(profile, problems(gates=gates, rules=DPLR), lambda p: forward_agrees(p, form))


@pytest.mark.parametrize(
    ("form", "gates", "profile"), regions("dplr-gradients-gates", FORMS, GATES)
)
def test_dplr_gradients_with_any_gates(form, gates, profile):
    holds(profile, problems(gates=gates, rules=DPLR), lambda p: gradients_agree(p, form))


@pytest.mark.parametrize(
    ("form", "layout", "profile"), regions("dplr-forward-layout", FORMS, LAYOUTS)
)
def test_dplr_forward_in_any_layout(form, layout, profile):
    holds(profile, problems(layout=layout, rules=DPLR), lambda p: forward_agrees(p, form))


@pytest.mark.parametrize(
    ("form", "layout", "profile"), regions("dplr-gradients-layout", FORMS, LAYOUTS)
)
def test_dplr_gradients_in_any_layout(form, layout, profile):
    holds(profile, problems(layout=layout, rules=DPLR), lambda p: gradients_agree(p, form))


@pytest.mark.parametrize(("form", "profile"), regions("dplr-empty", FORMS))
def test_dplr_gradients_of_empty_inputs(form, profile):
    empty = problems(layout="strided", empty=True, rules=DPLR)
    holds(profile, empty, lambda p: gradients_agree(p, form))


@pytest.mark.parametrize(("form", "profile"), regions("dplr-packed", FORMS))
def test_dplr_packed_sequences_run_alone(form, profile):
    holds(profile, packed_problems(DPLR), lambda p: packed_sequences_run_alone(p, form))


@pytest.mark.parametrize(("form", "profile"), regions("dplr-double-backward", FORMS))
def test_dplr_double_backward(form, profile):
    strided = problems(layout="strided", rules=DPLR)
    holds(profile, strided, lambda p: double_backward_agrees(p, form))


# ---------------------------------------------------------------------------------------------
# The properties of the generation step
# ---------------------------------------------------------------------------------------------


def step_inputs(x: dict[str, torch.Tensor], t: int) -> dict[str, torch.Tensor]:
    """Token t of [B, T, H, D] inputs: the step's [B, H, D] arguments (strided views)."""
    return {n: x[n][:, t] for n in ("q", "k", "v", "beta", "g", "a", "b") if n in x}


def new_state(p: Problem, x: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The step's state: S0's values in the state dtype, in S0's layout, a tensor of its own."""
    storage, view = place(x["S0"].detach().to(dtype, copy=True), dict(p.layouts)["S0"])
    return view(storage)


def step_forward_agrees(p: Problem, state_dtype: torch.dtype) -> None:
    """Every o_t and the state after T steps equal the float64 recurrence (in the state dtype)."""
    x = build(p, None)
    state = new_state(p, x.views, state_dtype)
    outputs = [recurrent_step(state, **step_inputs(x.views, t), scale=p.scale) for t in range(p.T)]
    o_ref, S_ref = reference(p, {n: t.double() for n, t in x.views.items()})
    assert all(o.dtype == p.dtype for o in outputs) and state.dtype == state_dtype
    magnitude = max(rms(o_ref), rms(S_ref))
    o = torch.stack(outputs, dim=1) if outputs else o_ref
    assert_agrees("o", o, o_ref, magnitude, compute=state_dtype)
    assert_agrees("state", state, S_ref, magnitude, compute=state_dtype)


def step_gradients_agree(p: Problem, state_dtype: torch.dtype) -> None:
    """T steps: every o_t and the state after them are differentiable in every token's q, k, v,
    beta and g (the in-place update recorded), as the float64 recurrence."""
    x = build(p, None, grad=True)
    state = new_state(p, x.views, state_dtype)
    try:
        outputs = [recurrent_step(state, **step_inputs(x.views, t), scale=p.scale)
                   for t in range(p.T)]  # fmt: skip
    except (ValueError, TypeError) as refusal:  # the contract allows refusing inputs that need grad
        assert "grad" in str(refusal), refusal
        return
    names = [n for n in ("q", "k", "v", "beta", "g", "a", "b") if n in x.views]
    found = gradients([torch.stack(outputs, 1), state], {n: x.views[n] for n in names}, p.seed)
    x64 = build(p, torch.float64, grad=True)
    expected = gradients(reference(p, x64.views), {n: x64.views[n] for n in names}, p.seed)
    magnitude = max((rms(e) for e in expected.values()), default=0.0)
    for n, e in expected.items():
        assert_agrees(f"d{n}", found[n], e, magnitude, compute=state_dtype)


@pytest.mark.parametrize(
    ("precision", "gates", "profile"), regions("step-forward", PRECISIONS, GATES)
)
def test_step_forward_with_any_gates(precision, gates, profile):
    holds(profile, step_problems(gates, precision), lambda case: step_forward_agrees(*case))


@pytest.mark.parametrize(
    ("precision", "rule", "gates", "profile"), regions("step-gradients", PRECISIONS, RULES, GATES)
)
def test_step_gradients_with_any_gates(precision, rule, gates, profile):
    cases = step_problems(gates, precision, rules=(rule,))
    holds(profile, cases, lambda case: step_gradients_agree(*case))


@pytest.mark.parametrize(("precision", "profile"), regions("step-empty", PRECISIONS))
def test_step_of_empty_inputs(precision, profile):
    cases = step_problems(precision=precision, empty=True)
    holds(profile, cases, lambda case: step_forward_agrees(*case))


@pytest.mark.parametrize(
    ("precision", "gates", "profile"), regions("dplr-step-forward", PRECISIONS, GATES)
)
def test_dplr_step_forward_with_any_gates(precision, gates, profile):
    cases = step_problems(gates, precision, rules=DPLR)
    holds(profile, cases, lambda case: step_forward_agrees(*case))


# ---------------------------------------------------------------------------------------------
# Refused inputs: our named error, before any work
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """A way to break a valid call: ``make(p, x)`` gives the overriding keyword arguments; the
    call must raise ``error`` with ``name`` in its message. ``rules``: the ops it applies to."""

    label: str
    name: str
    error: type[Exception]
    make: object
    rules: tuple[str, ...] = RULES


def poison(x: torch.Tensor, value: float, seed: int) -> torch.Tensor:
    """A copy of x with one entry (chosen by the seed) set to ``value``."""
    x = x.detach().clone().contiguous()
    x.view(-1)[seed % x.numel()] = value
    return x


def above_two(x: torch.Tensor) -> float:
    """The smallest value of x's dtype above 2."""
    two = torch.tensor(2.0, dtype=x.dtype)
    return float(torch.nextafter(two, torch.tensor(math.inf, dtype=x.dtype)))


def wider(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x with one more entry along ``dim`` (a wrong size)."""
    return torch.cat([x, x.narrow(dim, 0, 1)], dim=dim)


def bounds(p: Problem, *inner: int) -> torch.Tensor:
    return torch.tensor([0, *inner, p.T])


TINY_POSITIVE = {d: float(torch.finfo(d).smallest_normal) for d in DTYPES}
# One bad input per line.
# fmt: off
BAD_INPUTS = [
    Bad("q-list", "q", TypeError, lambda p, x: {"q": x["q"].tolist()}),
    Bad("q-int", "q", TypeError, lambda p, x: {"q": x["q"].to(torch.int32)}),
    Bad(
        "v-dtype",
        "v",
        TypeError,
        lambda p, x: {"v": x["v"].to(torch.float32 if p.dtype == torch.float64 else torch.float64)},
    ),
    Bad("q-ndim", "q", ValueError, lambda p, x: {"q": x["q"][0]}),
    Bad("k-shape", "k", ValueError, lambda p, x: {"k": wider(x["k"], 3)}),
    Bad("v-shape", "v", ValueError, lambda p, x: {"v": wider(x["v"], 1)}),
    Bad("q-nan", "q", ValueError, lambda p, x: {"q": poison(x["q"], math.nan, p.seed)}),
    Bad("k-inf", "k", ValueError, lambda p, x: {"k": poison(x["k"], math.inf, p.seed)}),
    Bad("v-neg-inf", "v", ValueError, lambda p, x: {"v": poison(x["v"], -math.inf, p.seed)}),
    Bad(
        "g-positive",
        "g",
        ValueError,
        lambda p, x: {"g": poison(x["g"], TINY_POSITIVE[p.dtype], p.seed)},
    ),
    Bad("g-inf", "g", ValueError, lambda p, x: {"g": poison(x["g"], math.inf, p.seed)}),
    Bad("g-nan", "g", ValueError, lambda p, x: {"g": poison(x["g"], math.nan, p.seed)}),
    Bad("g-shape", "g", ValueError, lambda p, x: {"g": wider(x["g"], x["g"].dim() - 1)}),
    Bad("g-int", "g", TypeError, lambda p, x: {"g": x["g"].to(torch.int64)}),
    Bad(
        "beta-negative",
        "beta",
        ValueError,
        lambda p, x: {"beta": poison(x["beta"], -TINY_POSITIVE[p.dtype], p.seed)},
        ("delta",),
    ),
    Bad(
        "beta-above-two",
        "beta",
        ValueError,
        lambda p, x: {"beta": poison(x["beta"], above_two(x["beta"]), p.seed)},
        ("delta",),
    ),
    Bad(
        "beta-nan",
        "beta",
        ValueError,
        lambda p, x: {"beta": poison(x["beta"], math.nan, p.seed)},
        ("delta",),
    ),
    Bad("beta-shape", "beta", ValueError, lambda p, x: {"beta": wider(x["beta"], 2)}, ("delta",)),
    Bad("beta-none", "beta", TypeError, lambda p, x: {"beta": None}, ("delta",)),
    Bad("a-shape", "a", ValueError, lambda p, x: {"a": wider(x["a"], 3)}, ("dplr",)),
    Bad("b-shape", "b", ValueError, lambda p, x: {"b": wider(x["b"], 2)}, ("dplr",)),
    Bad("a-nan", "a", ValueError, lambda p, x: {"a": poison(x["a"], math.nan, p.seed)}, ("dplr",)),
    Bad("b-inf", "b", ValueError, lambda p, x: {"b": poison(x["b"], math.inf, p.seed)}, ("dplr",)),
    Bad("b-none", "b", TypeError, lambda p, x: {"b": None}, ("dplr",)),
    Bad("cu-float", "cu_seqlens", TypeError, lambda p, x: {"cu_seqlens": bounds(p).double()}),
    Bad(
        "cu-start",
        "cu_seqlens",
        ValueError,
        lambda p, x: {"cu_seqlens": torch.tensor([1, p.T + 1])},
    ),
    Bad(
        "cu-end", "cu_seqlens", ValueError, lambda p, x: {"cu_seqlens": torch.tensor([0, p.T + 1])}
    ),
    Bad("cu-decrease", "cu_seqlens", ValueError, lambda p, x: {"cu_seqlens": bounds(p, p.T + 1)}),
    Bad("cu-2d", "cu_seqlens", ValueError, lambda p, x: {"cu_seqlens": bounds(p)[None]}),
    Bad("cu-list", "cu_seqlens", TypeError, lambda p, x: {"cu_seqlens": [0, p.T]}),
    Bad("chunk-zero", "chunk_size", ValueError, lambda p, x: {"chunk_size": 0}),
    Bad("chunk-negative", "chunk_size", ValueError, lambda p, x: {"chunk_size": -p.chunk_size}),
    Bad("chunk-bool", "chunk_size", TypeError, lambda p, x: {"chunk_size": True}),
    Bad("chunk-float", "chunk_size", TypeError, lambda p, x: {"chunk_size": float(p.chunk_size)}),
    Bad("chunk-str", "chunk_size", TypeError, lambda p, x: {"chunk_size": str(p.chunk_size)}),
    Bad("k-no-features", "k", ValueError,
        lambda p, x: {"q": x["q"][..., :0], "k": x["k"][..., :0], "g": None}),
    Bad("v-no-features", "v", ValueError, lambda p, x: {"v": x["v"][..., :0]}),
    Bad("mode", "mode", ValueError, lambda p, x: {"mode": "fused"}),
    Bad("scale-nan", "scale", ValueError, lambda p, x: {"scale": math.nan}),
    Bad("scale-inf", "scale", ValueError, lambda p, x: {"scale": math.inf}),
    Bad("scale-bool", "scale", TypeError, lambda p, x: {"scale": True}),
    Bad(
        "state-shape",
        "initial_state",
        ValueError,
        lambda p, x: {"initial_state": torch.zeros(p.N, p.H, p.K + 1, p.V, dtype=p.dtype)},
    ),
    Bad(
        "state-nan",
        "initial_state",
        ValueError,
        lambda p, x: {
            "initial_state": torch.full(
                _replace(p, state=True).shapes()["S0"], math.nan, dtype=p.dtype
            )
        },
    ),
    Bad(
        "state-int",
        "initial_state",
        TypeError,
        lambda p, x: {"initial_state": torch.zeros(p.N, p.H, p.K, p.V, dtype=torch.int64)},
    ),
    Bad("normalize-str", "normalize", TypeError, lambda p, x: {"normalize": "no"}, ("additive",)),
    Bad(
        "l2norm-str", "use_qk_l2norm", TypeError, lambda p, x: {"use_qk_l2norm": "yes"}, ("delta",)
    ),
    Bad(
        "final-state-str",
        "output_final_state",
        TypeError,
        lambda p, x: {"output_final_state": "no"},
    ),
]
# fmt: on


@st.composite
def bad_calls(draw, bad: Bad):
    """A valid problem of the ops the bad input applies to (with a gate where it is a gate)."""
    p = draw(problems(rules=bad.rules, gated=bad.name == "g"))
    return p, draw(st.sampled_from(FORMS))


def refused(bad: Bad, p: Problem, form: str) -> None:
    x = build(p, None).views
    overrides = bad.make(p, x)
    with loop(form):
        assert_no_work(lambda: call(p, form, x, **overrides), bad.error, bad.name)


@pytest.mark.parametrize(("bad", "profile"), regions("refused", BAD_INPUTS))
def test_bad_input_is_refused_by_name(bad, profile):
    holds(profile, bad_calls(bad), lambda case: refused(bad, *case))


# One bad input per line: the step's own, then those of the ops that apply to a step's inputs.
# fmt: off
STEP_BAD_INPUTS = [
    Bad("state-bf16", "state", TypeError, lambda p, x: {"state": x["state"].bfloat16()}),
    Bad("state-grad", "state", ValueError,
        lambda p, x: {"state": x["state"].clone().requires_grad_()}),
    Bad("state-ndim", "state", ValueError, lambda p, x: {"state": x["state"][0]}),
    Bad("state-inf", "state", ValueError,
        lambda p, x: {"state": poison(x["state"], math.inf, p.seed)}),
    Bad("q-shape", "q", ValueError, lambda p, x: {"q": wider(x["q"], 2)}),
    Bad("v-shape", "v", ValueError, lambda p, x: {"v": wider(x["v"], 1)}),
    Bad("beta-shape", "beta", ValueError, lambda p, x: {"beta": wider(x["beta"], 1)}, ("delta",)),
    *(b for b in BAD_INPUTS if b.label in (
        "q-list", "q-int", "q-nan", "k-inf", "v-neg-inf", "g-positive", "g-inf", "g-nan",
        "g-shape", "g-int", "beta-negative", "beta-above-two", "beta-nan", "scale-nan",
        "scale-inf", "scale-bool",
    )),
]
# fmt: on


@st.composite
def bad_steps(draw, bad: Bad):
    p = draw(problems(rules=bad.rules, gated=bad.name == "g", layout="strided"))
    p = _replace(p, T=1, lengths=None, normalize=False, l2norm=False, state=True)
    return _replace(p, layouts=draw(layouts_of(p, "strided"))), draw(st.sampled_from(STATE_DTYPES))


def step_refused(bad: Bad, p: Problem, state_dtype: str) -> None:
    """The bad step raises our named error and leaves the state exactly as it was."""
    x = build(p, None).views
    state = new_state(p, x, getattr(torch, state_dtype))
    args = {"state": state, **step_inputs(x, 0), "scale": p.scale}
    args.update(bad.make(p, {**x, **args}))
    before = args["state"].detach().clone() if torch.is_tensor(args["state"]) else None
    with pytest.raises(bad.error, match=rf"\b{bad.name}\b"):
        recurrent_step(**args)
    if before is not None and before.dim() == 4:
        assert torch.equal(args["state"].detach(), before) or not bool(before.isfinite().all())


@pytest.mark.parametrize(("bad", "profile"), regions("step-refused", STEP_BAD_INPUTS))
def test_bad_step_is_refused_by_name(bad, profile):
    holds(profile, bad_steps(bad), lambda case: step_refused(bad, *case))


# ---------------------------------------------------------------------------------------------
# Accepted options
# ---------------------------------------------------------------------------------------------


def integer_chunk_sizes_agree(p: Problem) -> None:
    """Any integer type is a chunk size (NumPy's too), with the result of the same int."""
    x = build(p, None).views
    o, S = call(p, "chunk", x)
    for size in (np.int64(p.chunk_size), np.int32(p.chunk_size)):
        o_n, S_n = call(p, "chunk", x, chunk_size=size)
        assert torch.equal(o_n, o) and torch.equal(S_n, S)


@pytest.mark.parametrize(("kind", "profile"), regions("accepted", ("numpy-chunk-size",)))
def test_integer_chunk_sizes_are_accepted(kind, profile):
    holds(profile, problems(), integer_chunk_sizes_agree)
