"""Our RWKV7, Comba and GatedDeltaNet2 equal fla 0.6.0's layers with the same weights.

As ``test_from_fla.py``: fla's layers run their Triton kernels on the CPU under the interpreter
(``tests/fla_interpreter.py``, imported before fla); fla's float32 forward and gradients and ours
in float32 against ours in float64, to 1e-5 relative; then our token-by-token decoding against
fla's forward. fla's float32 gradients are held to 5e-5 (``tests/compat/test_vs_fla.py``'s TOL
for fla's kernels: its chunk backward in float32 lands 1e-5 to 3e-5 from the float64 truth where
ours in float32 lands within 2e-6), its forward to 1e-5. RWKV-7 runs as two layers
(``layer_idx`` 0 and 1), the second mixing in the first's values (fla's ``v_first``, our
``shared`` dict).
"""

from __future__ import annotations

import pytest
import torch

fla_interpreter = pytest.importorskip("tests.fla_interpreter")  # before fla
fla_layers = pytest.importorskip("fla.layers")

from linattn.layers import RWKV7, Comba, GatedDeltaNet2  # noqa: E402
from tests.layers.reference_layers import (  # noqa: E402
    gradients_as_module,
    perturb,
    relative_error,
)

B, T, D = 1, 6, 32
FLA_GRAD_TOL = 5e-5


def fla_rwkv7(layer_idx: int, fuse_norm: bool = False) -> torch.nn.Module:
    ranks = dict(decay_low_rank_dim=8, gate_low_rank_dim=8, a_low_rank_dim=8, v_low_rank_dim=8)
    return fla_layers.RWKV7Attention(
        hidden_size=D, head_dim=8, layer_idx=layer_idx, num_hidden_layers=2,
        fuse_norm=fuse_norm, **ranks,
    )  # fmt: skip


# name -> (fla's layers, run in sequence, our class)
CASES = {
    "rwkv7": (lambda: [fla_rwkv7(0), fla_rwkv7(1)], RWKV7),
    # fla's RWKV-7 models build their layers with fuse_norm=True: fla's GroupNorm and l2_norm
    "rwkv7_fused_norm": (lambda: [fla_rwkv7(0, True), fla_rwkv7(1, True)], RWKV7),
    "comba": (
        lambda: [fla_layers.Comba(D, expand_v=2, head_dim=8, num_heads=2, num_v_heads=4)],
        Comba,
    ),
    "comba_plain": (
        lambda: [
            fla_layers.Comba(
                D,
                head_dim=8,
                num_heads=2,
                use_output_gate=False,
                use_inner_decay=False,
                use_output_correction=False,
                use_short_conv=False,
            )
        ],
        Comba,
    ),  # fmt: skip
    "gdn2": (
        lambda: [fla_layers.GatedDeltaNet2(D, head_dim=8, num_heads=2, num_v_heads=4)],
        GatedDeltaNet2,
    ),
    "gdn2_neg_eigval": (
        lambda: [fla_layers.GatedDeltaNet2(D, head_dim=8, num_heads=2, allow_neg_eigval=True)],
        GatedDeltaNet2,
    ),
}


def run_fla(modules, xs):
    """fla's layers, each on its input; RWKV-7's v_first from the first to the next."""
    ys, v_first = [], None
    for module, x in zip(modules, xs, strict=True):
        if type(module).__name__ == "RWKV7Attention":
            y, _, _, v_first = module(x, v_first=v_first)
        else:
            y = module(x)[0]
        ys.append(y)
    return ys


def run_ours(layers, xs, states=None):
    """Our layers, each on its input, one ``shared`` dict along them -> (outputs, states)."""
    shared: dict = {}
    states = states or [None] * len(layers)
    out = [layer(x, s, shared) for layer, x, s in zip(layers, xs, states, strict=True)]
    return [y for y, _ in out], [s for _, s in out]


def gradients(run, modules, xs, ws):
    xs = [x.clone().requires_grad_() for x in xs]
    ys = run(modules, xs)
    sum((y * w).sum() for y, w in zip(ys, ws, strict=True)).backward()
    grads = [{n: p.grad for n, p in m.named_parameters()} for m in modules]
    return ys, [x.grad for x in xs], grads


def assert_close(result, truth, grad_tol=1e-5):
    """Outputs to 1e-5, input and weight gradients to ``grad_tol``, relative."""
    for y, t in zip(result[0], truth[0], strict=True):
        assert relative_error(y.double(), t) < 1e-5, "forward"
    for dx, t in zip(result[1], truth[1], strict=True):
        assert relative_error(dx.double(), t) < grad_tol, "input gradient"
    for dw, dw_truth in zip(result[2], truth[2], strict=True):
        for n, g in dw_truth.items():
            assert relative_error(dw[n].double(), g) < grad_tol, n


def decode(layers, xs):
    """Our layers token by token through their states -> one output [B, T, D] per layer."""
    with torch.no_grad():
        states = [layer.new_state(B, torch.float64) for layer in layers]
        steps = []
        for t in range(T):
            ys, states = run_ours(layers, [x[:, t : t + 1].double() for x in xs], states)
            steps.append(ys)
    return [torch.cat(ys, dim=1) for ys in zip(*steps, strict=True)]


SLOW = ("rwkv7_fused_norm",)  # about 40 s each here; rwkv7 itself runs by default


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in CASES]
)
def test_forward_gradients_and_decoding_equal_fla(name):
    torch.manual_seed(0)
    make, cls = CASES[name]
    modules = make()
    for i, m in enumerate(modules):
        perturb(m, seed=i)
    ours32 = [cls.from_fla(m) for m in modules]
    for ours, m in zip(ours32, modules, strict=True):
        assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in m.parameters())
    ours64 = [cls.from_fla(m).double() for m in modules]
    xs, ws = (list(t) for t in torch.randn(2, len(modules), B, T, D))
    truth = gradients(run_ours_outputs, ours64, [x.double() for x in xs], [w.double() for w in ws])
    y_fla, dx_fla, _ = gradients(run_fla, modules, xs, ws)
    grads = [dict(cls.from_fla(gradients_as_module(m)).named_parameters()) for m in modules]
    assert_close((y_fla, dx_fla, grads), truth, FLA_GRAD_TOL)
    assert_close(gradients(run_ours_outputs, ours32, xs, ws), truth)
    for decoded, y in zip(decode(ours64, xs), y_fla, strict=True):
        assert relative_error(decoded, y.double()) < 1e-5


def run_ours_outputs(layers, xs):
    return run_ours(layers, xs)[0]


def test_rwkv7_layers_are_first_or_not():
    assert [RWKV7.from_fla(m).first_layer for m in (fla_rwkv7(0), fla_rwkv7(1))] == [True, False]


@pytest.mark.parametrize("cls", [RWKV7, Comba, GatedDeltaNet2])
def test_from_fla_refuses_our_own_layer(cls):
    with pytest.raises(TypeError, match="fla's"):
        cls.from_fla(cls(16, 2))
