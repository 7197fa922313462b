"""RuleMixer: any registered rule as a layer, and a user's mechanism in CausalLM by its name."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import RuleMixer
from linattn.layers.rule_mixer import into_range
from linattn.models import CausalLM, LMConfig
from linattn.ops import rules


@pytest.mark.parametrize(
    ("rule", "gate"),
    [("additive", "head"), ("delta", "channel"), ("dplr", "none"), ("implicit_delta", "channel")],
)
def test_forms_agree_and_a_prompt_then_steps_equal_one_call(rule, gate, implicit_delta):
    torch.manual_seed(0)
    layer = RuleMixer(16, 2, rule=rule, gate=gate, chunk_size=4).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    outputs = {}
    for mode in ("chunk", "recurrent", "parallel"):
        layer.mode = mode
        outputs[mode], _ = layer(x)
    for mode in ("recurrent", "parallel"):
        torch.testing.assert_close(outputs[mode], outputs["chunk"], rtol=0, atol=1e-12)
    layer.mode = None
    state = layer.new_state(2, torch.float64)
    y, state = layer(x[:, :7], state)
    pieces = [y]
    for t in range(7, 11):
        y_t, state = layer(x[:, t : t + 1], state)
        pieces.append(y_t)
    torch.testing.assert_close(torch.cat(pieces, 1), outputs["chunk"], rtol=0, atol=1e-12)


def test_inputs_are_mapped_into_the_declared_ranges():
    z = torch.linspace(-40, 40, 101, dtype=torch.float64)
    beta = into_range(z, rules.Input("beta", "1", 0.0, 2.0))
    assert beta.min() >= 0 and beta.max() <= 2 and beta.max() > 1.99
    low = into_range(z, rules.Input("x", "1", low=0.5))
    assert low.min() >= 0.5 and low.max() > 30
    high = into_range(z, rules.Input("x", "1", high=-1.0))
    assert high.max() <= -1.0
    assert torch.equal(into_range(z, rules.Input("x", "K")), z)


def test_a_users_mechanism_trains_and_generates_in_causal_lm(implicit_delta):
    torch.manual_seed(0)
    config = LMConfig(vocab_size=20, d_model=16, n_heads=2, mixers=("implicit_delta", "conv"))
    model = CausalLM(config)
    assert isinstance(model.blocks[0].mixer, RuleMixer)
    ids = torch.randint(0, 20, (2, 9))
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 20), ids[:, 1:].flatten())
    loss.backward()
    grad = model.blocks[0].mixer.input_proj["beta"].weight.grad
    assert grad is not None and grad.abs().sum() > 0
    out = model.generate(ids[:, :4], max_new_tokens=3)
    assert out.shape == (2, 7)


def test_unknown_names_are_refused_with_the_registered_ones(implicit_delta):
    with pytest.raises(ValueError, match="implicit_delta"):
        LMConfig(vocab_size=20, d_model=16, n_heads=2, mixers=("no_such_rule",))
    with pytest.raises(ValueError, match="rule must be one of"):
        RuleMixer(16, 2, rule="no_such_rule")
    with pytest.raises(ValueError, match="gate must be one of"):
        RuleMixer(16, 2, rule="delta", gate="scalar")
