"""linattn's ops dispatched to fla's Triton kernels (``linattn.ops.backend("fla")``), run on the
CPU by triton's interpreter (tests/fla_interpreter.py, imported first by this folder's conftest).

Every registered mechanism fla has, from its registry case's inputs in float32: the output, the
final states of two packed sequences (``cu_seqlens``) from their initial states, and the gradients
of every input and initial state, against the same op in float64 (linattn's exact loop: float64
never goes to fla), to the float32 tolerance of tests/compat/test_vs_fla.py. Where fla's kernel
takes less (``linattn.dispatch``'s facts about it), the check takes what it takes, and the
refusal of the rest is pinned in tests/ops/test_backends.py:

- fla's chunk kernels of the delta rule and Gated DeltaProduct refuse float32: the delta rule
  then takes fla's recurrent kernel, and DeltaProduct is run in float16 (to float16's rounding,
  as there); so is Parallax, whose kernel takes half precision only;
- fla's IPLR chunk kernel has no backward: inference only;
- TTT's kernels have no backward for packed sequences: those without gradients, and the
  gradients of one sequence;
- ABC's kernel takes no packed sequences and its final state is wrong unless 64 divides T; the
  log-linear kernel's state is not the op's: both without states;
- log-linear attention needs K a multiple of 64, NSA 16 query heads per key head.
"""

from __future__ import annotations

import copy

import pytest
import torch

fla_interpreter = pytest.importorskip("tests.fla_interpreter")
pytest.importorskip("fla.ops")

from linattn import dispatch, ops, registry  # noqa: E402
from linattn.ops import backends  # noqa: E402
from linattn.registry.cases import cyfa_case  # noqa: E402

from .helpers import assert_same, flatten, outputs_and_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
TOL = 5e-5  # test_vs_fla's float32 tolerance
FLOAT16_TOL = 4e-3  # and its float16 one

# The route each mechanism takes in float32 (float16 for DeltaProduct and Parallax).
EXPECTED = {
    "linear": "chunk_linear_attn",
    "scalar_decay": "chunk_simple_gla",
    "gla": "chunk_gla",
    "delta": "fused_recurrent_delta_rule",
    "gated_delta": "chunk_gated_delta_rule",
    "kda": "chunk_kda",
    "delta_product": "chunk_gated_delta_product",
    "iplr": "chunk_iplr_delta_rule",
    "dplr": "chunk_dplr_delta_rule",
    "comba": "chunk_comba",
    "rwkv7": "chunk_rwkv7",
    "gdn2": "chunk_gdn2",
    "rwkv6": "chunk_rwkv6",
    "cyfa": "chunk_cyfa",
    "ttt_linear": "chunk_ttt_linear",
    "gsa": "chunk_gsa",
    "abc": "chunk_abc",
    "log_linear_mamba2": "chunk_log_linear_attn",
    "deltaformer": "deltaformer_attn",
    "path": "parallel_path_attn",
    "precond_gated_delta": "chunk_precond_gated_delta_rule",
    "precond_kda": "chunk_precond_kda",
    "gated_oja": "chunk_gated_oja_rule",
    "forgetting": "parallel_attn",
    "stickbreaking": "parallel_stickbreaking_attn",
    "parallax": "parallel_parallax",
    "wall": "parallel_wall_attn",
    "nsa": "parallel_nsa",
}
HALF = {"delta_product", "parallax"}  # fla's kernel refuses float32
NO_BACKWARD = {"iplr"}  # fla's IPLR chunk kernel has none
NO_PACKED_BACKWARD = {"ttt_linear"}  # fla's TTT kernels have none for packed sequences
UNPACKED = {"abc"}  # fla's ABC kernel takes no cu_seqlens
STATELESS = {"abc", "log_linear_mamba2"}  # (the module docstring)
K_OF = {"log_linear_mamba2": 64}  # fla's log-linear kernel: K a multiple of 64
OPTIONS = {  # the case's own: NSA's sliding window, TTT's mini-batch (dividing T: its backward)
    "nsa": dict(block_counts=3, block_size=16, window_size=6),
    "ttt_linear": dict(mini_batch_size=4),
}
CASES = {"cyfa": cyfa_case(num_slots=8)}  # fla's chunk kernel: a power of two of slots
CASE_NAMES = {"gs": "g_scalar"}  # a case's input -> the op's argument (Wall's scalar gate)


@pytest.fixture(autouse=True)
def _kernels_on_cpu(monkeypatch):
    """What fla's CyFA, log-linear, DeltaFormer and NSA kernels need under the interpreter
    (tests/fla_interpreter.py)."""
    fla_interpreter.cyfa_on_cpu(monkeypatch)
    fla_interpreter.boolean_masks(monkeypatch)
    fla_interpreter.flash_attn_on_cpu(monkeypatch)


def test_every_mechanism_fla_has_is_dispatched_here():
    assert set(EXPECTED) == set(dispatch.table())
    # log-linear attention: fla has it over Mamba-2 only
    assert dispatch.gaps() == ("softmax", "log_linear_gated_delta")


def _leaves(entry, dtype, packed):
    """The case's tensors (B = 1, T = 20, K = V = 16 unless ``K_OF`` says, fla's query groups),
    rounded to ``dtype`` (the float64 run reads the same values), with None for the op's
    arguments the case leaves out; ``packed``: two sequences (7 + 13 tokens), an initial state
    per sequence. A state of parts (CyFA's, TTT's, GSA's pair) is one leaf per part, "S0_<i>"."""
    groups = dispatch.query_groups(entry)
    K = K_OF.get(entry.name, 16)
    case = CASES.get(entry.name, entry.case)
    x = case.inputs(1, 20, 2 if groups == 1 else groups, K, 16, 0, torch.float32)
    if groups > 1:  # k and v on one head: fla's grouped-query layout
        x = {n: t[:, :, :1] if n in ("k", "v") else t for n, t in x.items()}
    x = {CASE_NAMES.get(n, n): t for n, t in x.items()}
    if isinstance(x.get("S0"), tuple):
        x.update({f"S0_{i}": t for i, t in enumerate(x.pop("S0"))})
    if packed:
        if "S0" in x:
            x["S0"] = torch.cat([x["S0"], -x["S0"]])
        for n in [n for n in x if n.startswith("S0_") or n == "initial_A_state"]:
            x[n] = torch.cat([x[n], x[n].flip(-1)])  # the preconditioner's A, a clock: >= 0
    if "a" in x and "b" in x and entry.name in ("iplr", "dplr"):
        # The registry's a = -beta b makes a b^T symmetric (a swap of a and b computes the
        # same); a_t along b_{t-1} tells them apart, and keeps the transition bounded.
        x["a"] = x["a"].roll(1, dims=1)
    if entry.name in STATELESS:
        x = {n: t for n, t in x.items() if not n.startswith("S0")}
    leaves = {n: t.to(dtype) for n, t in x.items() if t is not None}
    return leaves, {n: None for n, t in x.items() if t is None}


def _op(entry, nones, **extra):
    """The op on leaves by name (``dispatch.arguments``: the states assembled from theirs)."""
    if entry.name in STATELESS:
        extra.update(initial_state=None, output_final_state=False)
    extra.update(OPTIONS.get(entry.name, {}))

    def run(**leaves):
        return dispatch.call(entry, dispatch.arguments(entry, {**nones, **leaves}, **extra))

    return run


def _check(name, monkeypatch):
    entry = registry.get(name)
    dtype = torch.float16 if name in HALF else torch.float32
    tol = FLOAT16_TOL if dtype == torch.float16 else TOL
    packed = name not in UNPACKED
    leaves, nones = _leaves(entry, dtype, packed)
    op = _op(entry, nones, **({"cu_seqlens": torch.tensor([0, 7, 20])} if packed else {}))
    called = _recorded(monkeypatch)
    exact = {n: t.double() for n, t in leaves.items()}
    if name in NO_BACKWARD | NO_PACKED_BACKWARD:
        with torch.inference_mode():
            with ops.backend("fla"):
                got = flatten(op(**leaves))
            want = flatten(op(**exact))
        assert_same(got, want, tol, name)
    if name in NO_PACKED_BACKWARD:  # the gradients of one sequence
        leaves, nones = _leaves(entry, dtype, packed=False)
        op, exact = _op(entry, nones), {n: t.double() for n, t in leaves.items()}
    if name not in NO_BACKWARD:
        with ops.backend("fla"):
            got, dgot = outputs_and_grads(op, leaves)
        want, dwant = outputs_and_grads(op, exact)
        assert_same(got, want, tol, name)
        for n in leaves:
            assert_same([dgot[n]], [dwant[n]], tol, f"{name} d{n}")
    assert set(called) == {EXPECTED[name]} and len(called) == 1 + (name in NO_PACKED_BACKWARD)
    assert got[0].dtype == dtype  # o in the op's dtype, as linattn's own path returns it


@pytest.mark.parametrize("name", sorted(EXPECTED))  # about 1-12 s each: all in the default run
def test_dispatched_to_fla_agrees_with_float64(name, monkeypatch):
    _check(name, monkeypatch)


def test_auto_on_a_gpu_runs_flas_kernel(monkeypatch):
    """ "auto" with the device check standing in for a GPU: fla's kernel, the same bits as fla's
    function called directly with compat's argument names."""
    import fla.ops

    monkeypatch.setattr(backends, "on_gpu", lambda q: True)
    x = registry.get("gated_delta").case.inputs(1, 20, 2, 16, 16, 0, torch.float32)
    o, S = ops.delta_rule(
        x["q"], x["k"], x["v"], x["beta"], x["g"], initial_state=x["S0"], output_final_state=True
    )
    o_fla, S_fla = fla.ops.chunk_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["S0"], output_final_state=True
    )
    assert torch.equal(o, o_fla) and torch.equal(S, S_fla)


@pytest.mark.parametrize(
    "layer",
    [
        "GatedDeltaNet",
        pytest.param("KimiDeltaAttention", marks=pytest.mark.slow),  # about 10 s each
        pytest.param("Comba", marks=pytest.mark.slow),
    ],
)
def test_a_layer_trains_through_flas_kernels_unchanged(layer, monkeypatch):
    """One model, every device: linattn's layer, unchanged, run on fla's kernels (forward, the
    input's and every weight's gradient) agrees with the same layer run in float64."""
    import linattn.layers

    called = _recorded(monkeypatch)
    torch.manual_seed(0)
    model = getattr(linattn.layers, layer)(32, 2, 16)
    x = torch.randn(1, 20, 32)
    exact = copy.deepcopy(model).double()  # before any gradient lands on the weights

    def run(module, inputs):
        inputs = inputs.clone().requires_grad_()
        out = module(inputs)[0]
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        (out * weights.to(out.dtype)).sum().backward()
        grads = [inputs.grad] + [p.grad for p in module.parameters()]
        return [out.detach()] + grads

    with ops.backend("fla"):
        got = run(model, x)
    want = run(exact, x.double())
    assert called, "the layer never reached fla's kernels"
    assert_same(got, want, TOL, layer)


def _recorded(monkeypatch):
    """The fla entry points the dispatch resolves, recorded (still fla's own kernels)."""
    called = []
    original = dispatch.fla_function
    monkeypatch.setattr(dispatch, "fla_function", lambda n: called.append(n) or original(n))
    return called


def _grouped(entry):
    """The case's inputs with two value heads per query head (Qwen3-Next's layout)."""
    x = entry.case.inputs(1, 20, 1, 16, 16, 0, torch.float32)  # q, k (and Comba's p): H = 1
    leaves = entry.case.inputs(1, 20, 2, 16, 16, 1, torch.float32)  # the rest: HV = 2
    return {n: x[n] if n in ("q", "k", "p") else t for n, t in leaves.items() if t is not None}


@pytest.mark.parametrize("name", ["gated_delta", "kda", "comba"])
def test_grouped_value_heads_go_to_flas_kernel(name, monkeypatch):
    """Grouped value heads where fla's chunk kernel takes them (``dispatch.FLA_GROUPED``):
    forward and gradients as the float64 op."""
    called = _recorded(monkeypatch)
    entry = registry.get(name)
    leaves = _grouped(entry)
    op = _op(entry, {})
    with ops.backend("fla"):
        got, dgot = outputs_and_grads(op, leaves)
    want, dwant = outputs_and_grads(op, {n: t.double() for n, t in leaves.items()})
    assert called == [EXPECTED[name]]
    assert_same(got, want, TOL, "grouped")
    for n in leaves:
        assert_same([dgot[n]], [dwant[n]], TOL, f"grouped d{n}")


@pytest.mark.parametrize("name", ["comba", "gdn2"])
def test_grouped_value_heads_go_to_flas_recurrent_kernel(name, monkeypatch):
    """Grouped value heads, no gradient, through fla's recurrent kernels that take them."""
    called = _recorded(monkeypatch)
    entry = registry.get(name)
    leaves = _grouped(entry)
    op = _op(entry, {}, mode="recurrent")
    with torch.no_grad():
        with ops.backend("fla"):
            got = op(**leaves)
        want = op(**{n: t.double() for n, t in leaves.items()})
    assert called == [f"fused_recurrent_{name}"]
    assert_same(list(got), list(want), TOL, "grouped recurrent")


def test_grouped_value_heads_stay_off_flas_kernels_that_refuse_them():
    """fla's chunk GLA refuses grouped heads and its chunk DPLR kernel aborts on them: with a
    gradient to record (their recurrent kernels then have none or take no groups) fla is refused
    before any kernel runs."""
    for name in ("gla", "dplr"):
        leaves = {n: t.requires_grad_() for n, t in _grouped(registry.get(name)).items()}
        with ops.backend("fla"), pytest.raises(ValueError, match="as many value heads"):
            _op(registry.get(name), {})(**leaves)


def test_a_decoding_step_runs_flas_recurrent_kernel(monkeypatch):
    """One token from a state, no gradient (a generation step): fla's recurrent kernel."""
    called = _recorded(monkeypatch)
    entry = registry.get("kda")
    x = entry.case.inputs(1, 1, 2, 16, 16, 0, torch.float32)
    op = _op(entry, {}, mode="recurrent")
    with torch.no_grad():
        with ops.backend("fla"):
            got = op(**x)
        want = op(**{n: t.double() for n, t in x.items()})
    assert called == ["fused_recurrent_kda"]
    assert_same(list(got), list(want), TOL, "decoding step")
