"""GatedDeltaProduct: ``from_fla`` equals fla 0.6.0's ``GatedDeltaProduct`` layer with
the same weights (forward, input and weight gradients, to 1e-5 relative in float32), our
token-by-token decoding equals fla's forward, and n_h = 1 is our GatedDeltaNet.

fla's layer runs on the CPU under Triton's interpreter (its short convolutions, gated RMSNorm and
l2norm are Triton kernels). Its ``chunk_gated_delta_product`` asserts that q is not float32 (its
GPU kernels want bfloat16, and the interpreter's bfloat16 is wrong: ``tests/fla_interpreter``),
so the layer's module-level name is pointed at the same kernels through the autograd function
that wrapper calls, ``ChunkGatedDeltaProductFunction``, in float32.
"""

from __future__ import annotations

import pytest
import torch

fla_interpreter = pytest.importorskip("tests.fla_interpreter")  # before fla
fla_layers = pytest.importorskip("fla.layers")
fla_layer_module = pytest.importorskip("fla.layers.gated_deltaproduct")
fla_chunk = pytest.importorskip("fla.ops.gated_delta_product.chunk")

from linattn.layers import GatedDeltaNet, GatedDeltaProduct  # noqa: E402
from tests.layers.reference_layers import check_from_fla, perturb, relative_error  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
B, T, D = 1, 6, 32


def fla_float32_kernel(q, k, v, g, beta, initial_state=None, output_final_state=False,
                       cu_seqlens=None, num_householder=2, use_qk_l2norm_in_kernel=False,
                       scale=None, **_):  # fmt: skip
    """fla's chunk kernels as its wrapper calls them, without its float32 assert."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return fla_chunk.ChunkGatedDeltaProductFunction.apply(
        q, k, v, g, beta, scale, num_householder, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, None, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        dict(num_householder=2, num_v_heads=4),
        dict(
            num_householder=3, use_forget_gate=False, use_output_gate=False, allow_neg_eigval=False
        ),
    ],  # fmt: skip
    ids=["n2-grouped", "n3-no-gates"],
)
def test_forward_gradients_and_decoding_equal_fla(options, monkeypatch):
    monkeypatch.setattr(fla_layer_module, "chunk_gated_delta_product", fla_float32_kernel)
    torch.manual_seed(0)
    module = fla_layers.GatedDeltaProduct(D, expand_v=2, head_dim=8, num_heads=2, **options)
    perturb(module)
    ours64, x, y_fla = check_from_fla(module, GatedDeltaProduct, (B, T, D))
    with torch.no_grad():
        state = ours64.new_state(B, torch.float64)
        y, state = ours64(x[:, :2].double(), state)  # a prefill, then token steps
        steps = [y]
        for t in range(2, T):
            y, state = ours64(x[:, t : t + 1].double(), state)
            steps.append(y)
    assert relative_error(torch.cat(steps, dim=1), y_fla.double()) < 1e-5


def test_one_write_is_gated_deltanet():
    torch.manual_seed(0)
    ours = GatedDeltaProduct(D, 2, 8, num_householder=1, allow_neg_eigval=False).double()
    gdn = GatedDeltaNet(D, 2, 8).double()
    gdn.load_state_dict(ours.state_dict())
    x = torch.randn(2, 9, D, dtype=torch.float64)
    torch.testing.assert_close(ours(x)[0], gdn(x)[0], rtol=1e-12, atol=1e-12)


def test_options_are_checked():
    with pytest.raises(ValueError, match="num_householder must be an int >= 1"):
        GatedDeltaProduct(D, 2, num_householder=0)
    with pytest.raises(TypeError, match="use_forget_gate must be a bool"):
        GatedDeltaProduct(D, 2, use_forget_gate="yes")
    with pytest.raises(TypeError, match="fla's GatedDeltaProduct"):
        GatedDeltaProduct.from_fla(GatedDeltaProduct(16, 2))
