"""GatedLinearAttention, DeltaNet and Mamba2 against fla 0.6.0's layers with the same weights.

fla's layers run their Triton kernels on the CPU under Triton's interpreter
(``tests.fla_interpreter``, which must be imported before triton; without it, or without fla,
these tests skip). fla's kernels compute in float32 whatever the input (float64 inputs fail in
the interpreter's casts or come back at float32 accuracy), so the comparison is float32 at 1e-5
relative; the float64 comparisons at 1e-12 are against transformers' pure-PyTorch Mamba-2
(test_mamba2.py) and the literal recurrences (test_linear.py, test_delta.py).

fla's Mamba2 is compared with n_groups = 1 only: with more groups its pure-PyTorch prefill
(``torch_forward``) gives head h the B/C of group ``h % n_groups`` (``repeat``), while its own
decoding step, mamba_ssm and transformers give it group ``h // (H / n_groups)``, as we do.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tests.fla_interpreter")
pytest.importorskip("fla")

from fla.layers.delta_net import DeltaNet as FlaDeltaNet  # noqa: E402
from fla.layers.gla import GatedLinearAttention as FlaGLA  # noqa: E402
from fla.layers.mamba2 import Mamba2 as FlaMamba2  # noqa: E402

from linattn.layers import DeltaNet, GatedLinearAttention, Mamba2  # noqa: E402

D = 32

CASES = {
    "gla": (lambda: FlaGLA(hidden_size=D, num_heads=2), GatedLinearAttention),
    "gla-conv": (
        lambda: FlaGLA(hidden_size=D, num_heads=2, use_short_conv=True),
        GatedLinearAttention,
    ),
    "gla-no-gate": (
        lambda: FlaGLA(hidden_size=D, num_heads=2, use_output_gate=False),
        GatedLinearAttention,
    ),
    "deltanet": (lambda: FlaDeltaNet(hidden_size=D, num_heads=2), DeltaNet),
    "deltanet-gate": (lambda: FlaDeltaNet(hidden_size=D, num_heads=2, use_gate=True), DeltaNet),
    "deltanet-neg": (
        lambda: FlaDeltaNet(hidden_size=D, num_heads=2, allow_neg_eigval=True),
        DeltaNet,
    ),
    "mamba2": (
        lambda: FlaMamba2(hidden_size=D, state_size=8, head_dim=8, chunk_size=8, backend="triton"),
        Mamba2,
    ),
}


def pair(name: str):
    """fla's layer (random weights everywhere, norms included) and ours built from it."""
    make, cls = CASES[name]
    torch.manual_seed(0)
    ref = make()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return ref, cls.from_fla(ref)


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def grads_by_name(ours, ref) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, our gradient, fla's) for every parameter; fla's three convolutions are our one."""
    theirs = {n: p.grad for n, p in ref.named_parameters()}
    out = []
    for name, p in ours.named_parameters():
        if name == "conv.weight" and "q_conv1d.weight" in theirs:
            want = torch.cat([theirs[f"{c}_conv1d.weight"] for c in "qkv"])
        else:
            want = theirs[fla_name(ref, name)]
        out.append((name, p.grad, want.view_as(p.grad)))
    return out


def fla_name(ref, name: str) -> str:
    """fla's name of our parameter ``name`` (the convolution of q, k, v excepted)."""
    if name.startswith("decay.a_proj"):  # GLA's low-rank gate
        return name.replace("decay.a_proj", "gk_proj")
    if name == "o_norm.weight" and isinstance(ref, FlaGLA):
        return "g_norm_swish_gate.weight" if ref.use_output_gate else "g_norm.weight"
    return {"conv.weight": "conv1d.weight", "conv_bias": "conv1d.bias"}.get(name, name)


# The option variants' gradients take 4-11 s each under the interpreter: slow.
GRADIENT_CASES = [pytest.param(n, marks=pytest.mark.slow) if "-" in n else n for n in CASES]


@pytest.mark.parametrize("name", GRADIENT_CASES)
def test_forward_and_gradients_equal_fla(name):
    ref, ours = pair(name)
    x = torch.randn(2, 19, D)
    w = torch.randn(2, 19, D)
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref = ref(x_ref)[0]
    (y_ref * w).sum().backward()
    y_ours, _ = ours(x_ours)
    (y_ours * w).sum().backward()
    assert relative(y_ours, y_ref) < 1e-5
    assert relative(x_ours.grad, x_ref.grad) < 1e-5
    for param, got, want in grads_by_name(ours, ref):
        assert relative(got, want) < 1e-5, param


@pytest.mark.parametrize("name", CASES)
def test_decoding_with_our_cache_equals_flas_forward(name):
    ref, ours = pair(name)
    x = torch.randn(2, 11, D)
    with torch.no_grad():
        y_ref = ref(x)[0]
        state = ours.new_state(2, torch.float32)
        y, state = ours(x[:, :5], state)
        steps = [y]
        for t in range(5, 11):
            y, state = ours(x[:, t : t + 1], state)
            steps.append(y)
    assert relative(torch.cat(steps, 1), y_ref) < 1e-5


def test_unsupported_fla_options_are_refused():
    with pytest.raises(ValueError, match="num_kv_groups"):
        GatedLinearAttention.from_fla(FlaGLA(hidden_size=D, num_heads=2, num_kv_heads=1))
    with pytest.raises(ValueError, match="qk_activation"):
        DeltaNet.from_fla(FlaDeltaNet(hidden_size=D, num_heads=2, qk_activation="relu"))
    with pytest.raises(TypeError, match="GatedLinearAttention"):
        GatedLinearAttention.from_fla(FlaDeltaNet(hidden_size=D, num_heads=2))
