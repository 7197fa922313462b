"""``linattn.layers.LogLinearMamba2``: fla's ``LogLinearMamba2`` layer with the same
weights (run on the CPU by ``enable()``, whose op is pinned against fla's kernels), prefill then
decoding against the whole sequence, its state, and ``CausalLM`` with the mixer;
``LogLinearGatedDeltaNet``: Gated DeltaNet's layer when the levels weigh alike, and prefill then
decoding."""

from __future__ import annotations

import math

import pytest
import torch

from linattn.layers import GatedDeltaNet, LogLinearGatedDeltaNet, LogLinearMamba2
from linattn.models.config import LMConfig
from linattn.models.lm import CausalLM


def _ours(**kw):
    torch.manual_seed(0)
    layer = LogLinearMamba2(32, d_state=16, head_dim=16, expand=2, n_groups=2, **kw)
    with torch.no_grad():  # away from the constant initialisations (L = 1, D = 1, ...)
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def test_the_layer_equals_fla_s_with_the_same_weights():
    pytest.importorskip("tests.fla_interpreter")  # before fla
    fla_layers = pytest.importorskip("fla.layers")
    from linattn.integrations import fla as linattn_fla

    ours = _ours(bias=True, conv_bias=False).eval()
    linattn_fla.enable()
    try:
        theirs = fla_layers.LogLinearMamba2(num_heads=4, head_dim=16, hidden_size=32,
                                            state_size=16, expand=2, n_groups=2).eval()  # fmt: skip
        names = {"in_proj.weight": "in_proj.weight", "in_proj.bias": "in_proj.bias",
                 "conv1d.weight": "conv.weight", "dt_bias": "dt_bias", "A_log": "A_log",
                 "L": "L", "D": "D", "norm.weight": "norm.weight",
                 "out_proj.weight": "out_proj.weight",
                 "out_proj.bias": "out_proj.bias"}  # fmt: skip
        mine = dict(ours.named_parameters())
        assert set(dict(theirs.named_parameters())) == set(names)
        assert set(mine) == set(names.values())
        with torch.no_grad():
            for t, o in names.items():
                theirs.get_parameter(t).copy_(mine[o])
        x = torch.randn(2, 70, 32, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want, _, _ = theirs(x)
            got, _ = ours(x)
    finally:
        linattn_fla.disable()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_prefill_then_decoding_equals_the_whole_sequence():
    layer = _ours(num_levels=4).double()  # levels 4 .. 6 of 70 tokens are dropped exactly
    x = torch.randn(2, 70, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    whole, _ = layer(x)
    state = layer.new_state(2, torch.float64)
    assert state["S"].shape == (2, 3, 4, 16, 16) and state["offset"].dtype == torch.int64
    y, state = layer(x[:, :37], state)
    outs = [y]
    for t in range(37, 70):
        y, state = layer(x[:, t : t + 1], state)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=0, atol=1e-12)
    assert state["offset"].tolist() == [70, 70] and state["S"].shape == (2, 3, 4, 16, 16)


def test_a_causal_lm_of_log_linear_mamba2_trains_and_generates():
    config = LMConfig(vocab_size=11, d_model=32, n_heads=2, mixers=("log_linear_mamba2",),
                      state_size=8, chunk_size=8)  # fmt: skip
    model = CausalLM(config)
    ids = torch.randint(0, 11, (2, 20), generator=torch.Generator().manual_seed(3))
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss) and model.blocks[0].mixer.L.grad.abs().sum() > 0
    out = model.generate(ids[:, :5], max_new_tokens=4, temperature=0)
    assert out.shape == (2, 9)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_levels"):
        LogLinearMamba2(32, num_levels=0)


# -- log-linear Gated DeltaNet ------------------------------------------------------------------


def _gdn(**kw):
    torch.manual_seed(4)
    layer = LogLinearGatedDeltaNet(32, 2, chunk_size=8, **kw).double()
    with torch.no_grad():  # away from the initialisations (L = 1, the 0.02 projections)
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer


def test_log_linear_gated_deltanet_with_equal_level_weights_is_gated_deltanet_scaled():
    # level_proj = 0: every level weighs softplus(0) = log 2, so the read is log 2 times the
    # sum of the levels, which is Gated DeltaNet's memory (the writes read that sum too)
    ours = _gdn()
    with torch.no_grad():
        ours.level_proj.weight.zero_()
    gdn = GatedDeltaNet(32, 2, chunk_size=8).double()
    missing, unexpected = gdn.load_state_dict(ours.state_dict(), strict=False)
    assert not missing and set(unexpected) == {"level_proj.weight", "L"}
    B, T = 2, 21
    x = torch.randn(B, T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    q, k, v = (torch.randn(B, T, 2, n, dtype=torch.float64) for n in (16, 16, 32))
    for mode in ("chunk", "recurrent"):
        got, _ = ours.recurrence(x, q, k, v, mode, None, keep=False)
        want, _ = gdn.recurrence(x, q, k, v, mode, None, keep=False)
        torch.testing.assert_close(got, math.log(2.0) * want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("allow_neg_eigval", [False, True])
def test_log_linear_gated_deltanet_prefill_then_decoding_equals_the_whole_sequence(
    allow_neg_eigval,
):
    layer = _gdn(num_levels=4, allow_neg_eigval=allow_neg_eigval)  # levels 4 .. 6 dropped exactly
    x = torch.randn(2, 45, 32, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    whole, _ = layer(x)
    state = layer.new_state(2, torch.float64)
    assert state["S"].shape == (2, 4, 2, 16, 32) and state["offset"].dtype == torch.int64
    y, state = layer(x[:, :19], state)
    outs = [y]
    for t in range(19, 45):
        y, state = layer(x[:, t : t + 1], state)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=0, atol=1e-12)
    assert state["offset"].tolist() == [45, 45] and state["offset"].dtype == torch.int64
    # pieces in chunk mode across positions 8, 16, 32 (the levels >= 4 and their sum)
    state, outs, start = layer.new_state(2, torch.float64), [], 0
    for n in (9, 14, 1, 21):
        y, state = layer(x[:, start : start + n], state)
        outs.append(y)
        start += n
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=0, atol=1e-12)


def test_log_linear_gated_deltanet_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_levels"):
        LogLinearGatedDeltaNet(32, 2, num_levels=0)
    with pytest.raises(ValueError, match="chunk_size must be a power of two"):
        LogLinearGatedDeltaNet(32, 2, chunk_size=24)
