"""CAT's FlexAttention on the CPU (``linattn.integrations._fla_attention.flex_attention``, bound
by ``linattn.integrations.fla.enable()`` in place of ``fla.models.cat``'s
``flex_attention_compiled``): against torch's own FlexAttention forward on the CPU (which has
no backward there), its gradients against SDPA with the dense mask, and CAT's model forward with
and without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

interp = pytest.importorskip("tests.fla_interpreter")  # before fla
pytest.importorskip("fla")

import fla.models  # noqa: E402
from fla.models.cat import modeling_cat  # noqa: E402
from torch.nn.attention.flex_attention import (  # noqa: E402
    create_block_mask,
    create_mask,
)
from torch.nn.attention.flex_attention import flex_attention as torch_flex  # noqa: E402

from linattn.integrations import _fla_attention as attention  # noqa: E402
from linattn.integrations import fla as linattn_fla  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _head_dependent(b, h, q_idx, kv_idx):
    """A mask with no key for query 0 of head 1 (FlexAttention outputs 0 there)."""
    return (q_idx >= kv_idx) & ~((h == 1) & (q_idx == 0))


@pytest.mark.parametrize(
    "mask_mod",
    [modeling_cat.get_cat_mask_mod(6), modeling_cat.get_block_diagonal_mask_mod(5), None],
    ids=["cat", "block-diagonal", "none"],
)
def test_flex_attention_equals_torch_s_forward(mask_mod):
    q, k, v = _randn(2, 2, 20, 16), _randn(2, 2, 20, 16, seed=1), _randn(2, 2, 20, 8, seed=2)
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, None, None, 20, 20,
                                                                 device="cpu")  # fmt: skip
    o = attention.flex_attention(q, k, v, block_mask=block_mask)
    torch.testing.assert_close(o, torch_flex(q, k, v, block_mask=block_mask),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_flex_attention_heads_gqa_and_a_query_without_keys():
    q, k, v = _randn(1, 4, 9, 16), _randn(1, 2, 9, 16, seed=1), _randn(1, 2, 9, 16, seed=2)
    block_mask = create_block_mask(_head_dependent, 1, 4, 9, 9, device="cpu")
    o = attention.flex_attention(q, k, v, block_mask=block_mask, scale=0.3, enable_gqa=True)
    want = torch_flex(q, k, v, block_mask=block_mask, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(o[0, 1, 0], torch.zeros(16)) and o[0, 1, 1:].abs().sum() > 0
    with pytest.raises(ValueError, match="enable_gqa"):
        attention.flex_attention(q, k, v)
    with pytest.raises(ValueError, match="built for"):
        attention.flex_attention(q[:, :, :5], k, v, block_mask=block_mask, enable_gqa=True)


def test_flex_attention_gradients_equal_sdpa_with_the_dense_mask():
    mask_mod = modeling_cat.get_cat_mask_mod(4)
    block_mask = create_block_mask(mask_mod, None, None, 14, 14, device="cpu")
    dense = create_mask(mask_mod, None, None, 14, 14, device="cpu")
    q, k, v = (_randn(2, 2, 14, 8, seed=s, dtype=torch.float64).requires_grad_() for s in range(3))
    w = _randn(2, 2, 14, 8, seed=3, dtype=torch.float64)
    got = torch.autograd.grad((attention.flex_attention(q, k, v, block_mask) * w).sum(), (q, k, v))
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    want = torch.autograd.grad((sdpa * w).sum(), (q, k, v))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_cat_model_forward_equals_torch_s_flex_and_trains_on_the_cpu():
    """CAT's logits with torch's FlexAttention (no gradient; fla's other kernels interpreted)
    equal those with linattn's, and with linattn's a training step runs."""
    config = fla.models.CATConfig(hidden_size=32, num_hidden_layers=1, num_heads=2,
                                  max_chunk_size=4, pad_to_multiple_of=8, vocab_size=64,
                                  max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    model = fla.models.CATForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    fla_s = modeling_cat.flex_attention_compiled
    linattn_fla.enable()
    try:
        assert modeling_cat.flex_attention_compiled is not fla_s
        with torch.no_grad():
            got = model(input_ids=ids).logits
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    finally:
        linattn_fla.disable()
    assert modeling_cat.flex_attention_compiled is fla_s
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(loss) and model.lm_head.weight.grad is not None
