"""The RWKV7, Comba and GatedDeltaNet2 layers on their own: what fla does not check for us (the
equality with fla's layers is test_from_fla_dplr.py; the modes, states and models are the
per-mixer tests of test_recurrent.py and tests/models)."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import RWKV7, Comba, GatedDeltaNet2
from linattn.layers.modules import LoRA, token_shift


def test_token_shift_in_pieces_equals_one_call():
    x = torch.randn(2, 9, 5, dtype=torch.float64)
    whole, last = token_shift(x)
    assert torch.equal(whole[:, 0], -x[:, 0]) and torch.equal(whole[:, 1:], x[:, :-1] - x[:, 1:])
    first, carry = token_shift(x[:, :4])
    rest, last_rest = token_shift(x[:, 4:], carry)
    assert torch.equal(torch.cat([first, rest], 1), whole) and torch.equal(last_rest, last)


def test_token_shift_of_packed_sequences_equals_each_on_its_own():
    # cu_seqlens: each sequence from its own row of last; an empty one keeps its row.
    x = torch.randn(1, 9, 5, dtype=torch.float64)
    last = torch.randn(4, 5, dtype=torch.float64)
    cu = torch.tensor([0, 3, 3, 8, 9])
    delta, new_last = token_shift(x, last, cu)
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        if e > s:
            want, want_last = token_shift(x[:, s:e], last[n : n + 1])
            assert torch.equal(delta[:, s:e], want) and torch.equal(new_last[n], want_last[0])
        else:
            assert torch.equal(new_last[n], last[n])
    empty, kept = token_shift(x[:, :0], last[:1])
    assert empty.shape == (1, 0, 5) and torch.equal(kept, last[:1])
    with pytest.raises(ValueError, match="batch size 1 with cu_seqlens"):
        token_shift(torch.randn(2, 9, 5), None, cu)


def test_lora_keeps_its_bias_apart():
    lora = LoRA(6, 3, 4, "tanh")
    x = torch.randn(2, 6)
    want = torch.tanh(x @ lora.down.weight.T) @ lora.up.weight.T + lora.bias
    torch.testing.assert_close(lora(x), want)
    assert LoRA(6, 3, 4, bias=False).bias is None


def test_rwkv7_decay_stays_in_its_range_and_comba_p_is_scaled_k():
    torch.manual_seed(0)
    layer = RWKV7(16, 2)
    w = -0.6065306597126334 * torch.sigmoid(layer.w_lora(torch.randn(3, 16) * 100))
    assert (w <= 0).all() and (w >= -0.6065306597126334).all()
    comba = Comba(16, 2, inner_decay=False, output_correction=False)
    assert comba.inner_decay is None and comba.D is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: RWKV7(16, 3), "divisible by n_heads"),
        (lambda: RWKV7(16, 2, decay_rank=0), "decay_rank"),
        (lambda: RWKV7(16, 2, gate_rank=1.5), "gate_rank"),
        (lambda: RWKV7(16, 2, head_dim=0), "head_dim"),
        (lambda: RWKV7(16, 2, first_layer=1), "first_layer must be a bool"),
        (lambda: Comba(16, 2, correction_factor=float("nan")), "correction_factor"),
        (lambda: Comba(16, 2, inner_decay="yes"), "inner_decay must be a bool"),
        (lambda: GatedDeltaNet2(16, 2, num_v_heads=3), "num_v_heads"),
        (lambda: LoRA(4, 2, 4, "relu"), "activation"),
    ],
)
def test_bad_arguments_are_named(make, message):
    with pytest.raises((ValueError, TypeError), match=message):  # a flag's type: TypeError
        make()


def test_rwkv7_later_layer_needs_the_first_layers_values():
    layer = RWKV7(16, 2, first_layer=False)
    with pytest.raises(ValueError, match="v_first"):
        layer(torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match=r"shared\['v_first'\] of shape \(1, 3, 16\)"):
        layer(torch.randn(1, 3, 16), None, {"v_first": torch.randn(1, 4, 16)})


@pytest.mark.parametrize("cls", [Comba, GatedDeltaNet2])
def test_no_transformers_counterpart(cls):
    with pytest.raises(TypeError, match="from_fla"):
        cls.from_transformers(torch.nn.Linear(2, 2))
