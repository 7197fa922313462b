"""GatedSlotAttention and ABCAttention against fla 0.6.0's layers with the same weights (fla's
Triton kernels under triton's interpreter, float32 within 1e-5 relative), and fla's layers run
on linattn's ops with ``linattn.integrations.fla.enable()``.

fla's ABC kernel has no backward under the interpreter (tests/compat/test_abc.py), so ABC's
gradients are compared with fla's layer run on linattn's ops under ``enable()``.
"""

from __future__ import annotations

import pytest
import torch

interp = pytest.importorskip("tests.fla_interpreter")
pytest.importorskip("fla")

from fla.layers.abc import ABCAttention as FlaABC  # noqa: E402
from fla.layers.gsa import GatedSlotAttention as FlaGSA  # noqa: E402

from linattn.layers import ABCAttention, GatedSlotAttention  # noqa: E402
from tests.integrations.test_fla import enabled  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
D = 32
CASES = {
    "gsa": (lambda: FlaGSA(hidden_size=D, num_heads=2, layer_idx=0), GatedSlotAttention),
    "gsa-gqa-conv-relu": (
        lambda: FlaGSA(
            hidden_size=D,
            num_heads=2,
            num_kv_heads=1,
            use_short_conv=True,
            feature_map="relu",
            layer_idx=0,
        ),
        GatedSlotAttention,
    ),  # fmt: skip
    "abc": (lambda: FlaABC(hidden_size=D, num_heads=2, layer_idx=0), ABCAttention),
    "abc-conv-no-gate": (
        lambda: FlaABC(
            hidden_size=D,
            num_heads=2,
            use_short_conv=True,
            use_output_gate=False,
            use_input_gate=True,
            layer_idx=0,
        ),
        ABCAttention,
    ),  # fmt: skip
}


def pair(name):
    make, cls = CASES[name]
    torch.manual_seed(0)
    ref = make()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return ref, cls.from_fla(ref)


def run(module, x, w):
    module.zero_grad()
    x = x.clone().requires_grad_()
    y = module(x)[0]
    (y * w).sum().backward()
    return y.detach(), x.grad


# fla's ABC layer on its kernels takes about 10 s under the interpreter (its rotary embedding and
# chunk kernels): slow, as the option variants; ABC runs by default under enable() below.
KERNEL_CASES = [n if n == "gsa" else pytest.param(n, marks=pytest.mark.slow) for n in CASES]


@pytest.mark.parametrize("name", KERNEL_CASES)
def test_forward_equals_flas_layer_on_its_kernels(name):
    ref, ours = pair(name)
    x = torch.randn(2, 19, D)
    with torch.no_grad():
        assert interp.relative(ours(x)[0], ref(x)[0]) < 1e-5


def test_gsa_gradients_equal_flas_layer_on_its_kernels():
    ref, ours = pair("gsa")
    x, w = torch.randn(1, 19, D), torch.randn(1, 19, D)
    (y_ref, dx_ref), (y, dx) = run(ref, x, w), run(ours, x, w)
    assert interp.relative(y, y_ref) < 1e-5 and interp.relative(dx, dx_ref) < 1e-5
    theirs = dict(ref.named_parameters())
    for n, p in ours.named_parameters():
        assert interp.relative(p.grad, theirs[n.replace("o_norm", "g_norm")].grad) < 1e-5, n


@pytest.mark.parametrize("name", ["gsa", "abc"])
def test_flas_layer_runs_on_linattn_with_enable(name):
    """fla's layer under enable(): linattn's compat entry points run it, forward and backward,
    and it equals our layer (forward, the input's gradient)."""
    ref, ours = pair(name)
    x, w = torch.randn(1, 70, D), torch.randn(1, 70, D)  # T > 64: fla's GSA layer's chunk mode
    with enabled() as counts:
        y_ref, dx_ref = run(ref, x, w)
    assert {"gsa": "chunk_gsa", "abc": "chunk_abc"}[name] in counts
    y, dx = run(ours, x, w)
    assert interp.relative(y, y_ref) < 1e-5 and interp.relative(dx, dx_ref) < 1e-5


@pytest.mark.parametrize("cls", [GatedSlotAttention, ABCAttention])
def test_decoding_continues_the_prompt_in_float64(cls):
    """A prompt, then one token at a time with the layer's state, equals one call (ABC's
    normaliser and rotary position carried in the state)."""
    torch.manual_seed(1)
    layer = cls(D, 2, short_conv=True).double()
    x = torch.randn(2, 12, D, dtype=torch.float64)
    whole = layer(x)[0]
    state = layer.new_state(2, torch.float64)
    y, state = layer(x[:, :5], state)
    steps = [y]
    for t in range(5, 12):
        y, state = layer(x[:, t : t + 1], state)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), whole, rtol=0, atol=1e-12)


def test_refusals():
    with pytest.raises(ValueError, match="feature_map must be one of"):
        GatedSlotAttention(D, 2, feature_map="t2r")
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        GatedSlotAttention(D, 3, 8, num_kv_heads=2)
    with pytest.raises(TypeError, match="ABCAttention"):
        ABCAttention.from_fla(FlaGSA(hidden_size=D, num_heads=2, layer_idx=0))
    with pytest.raises(ValueError, match="feature map T2RFeatureMap"):
        GatedSlotAttention.from_fla(FlaGSA(hidden_size=D, num_heads=2, feature_map="t2r",
                                           layer_idx=0))  # fmt: skip
