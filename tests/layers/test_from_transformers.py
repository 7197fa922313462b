"""Our layers equal transformers' Qwen3-Next and Kimi-Linear layers with the same weights.

Qwen3-Next's gated delta net and gated attention, Kimi-Linear's KDA and MLA (with and without the
query's low-rank projection):

float64 to 1e-12 (their float32 casts promoted), float32 to 1e-5 relative; the forward pass, the
gradients of the input and of every weight, and our token-by-token decoding with its state against
their one forward pass. Skipped without transformers.
"""

from __future__ import annotations

import pytest
import torch

from linattn.layers import (
    GatedAttention,
    GatedDeltaNet,
    KimiDeltaAttention,
    MultiHeadLatentAttention,
)
from tests.layers.reference_layers import (
    gradients_as_module,
    perturb,
    promoted,
    relative_error,
    torch_fallbacks,
)

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
kimi_linear = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")

B, T, D = 2, 11, 32


def qwen3_next_gdn():
    config = qwen3_next.Qwen3NextConfig(
        hidden_size=D,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=16,
        num_hidden_layers=4,
        rms_norm_eps=1e-6,
    )
    return qwen3_next, qwen3_next.Qwen3NextGatedDeltaNet(config, layer_idx=0), GatedDeltaNet


def kimi_linear_kda():
    config = kimi_linear.KimiLinearConfig(
        hidden_size=D, linear_num_heads=2, linear_head_dim=8, num_hidden_layers=4
    )
    module = kimi_linear.KimiLinearDeltaAttention(config, layer_idx=0)
    with (
        torch.no_grad()
    ):  # their __init__ leaves these empty (the model's _init_weights fills them)
        module.forget_gate.A_log.copy_(
            torch.empty(module.forget_gate.A_log.shape).uniform_(1, 16).log()
        )
        module.forget_gate.dt_bias.normal_()
    return kimi_linear, module, KimiDeltaAttention


def qwen3_next_attention():
    config = qwen3_next.Qwen3NextConfig(
        hidden_size=D,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=4,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1000.0,
            "partial_rotary_factor": 0.25,
        },
    )
    config._attn_implementation = "eager"
    return qwen3_next, qwen3_next.Qwen3NextAttention(config, layer_idx=3), GatedAttention


def kimi_linear_mla(q_lora_rank=None):
    config = kimi_linear.KimiLinearConfig(
        hidden_size=D,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=12,
        q_lora_rank=q_lora_rank,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=6,
        num_hidden_layers=4,
    )
    config._attn_implementation = "eager"
    return (
        kimi_linear,
        kimi_linear.KimiLinearAttention(config, layer_idx=3),
        MultiHeadLatentAttention,
    )


PAIRS = {
    "qwen3_next_gated_deltanet": qwen3_next_gdn,
    "kimi_linear_kda": kimi_linear_kda,
    "qwen3_next_gated_attention": qwen3_next_attention,
    "kimi_linear_mla": kimi_linear_mla,
    "kimi_linear_mla_q_lora": lambda: kimi_linear_mla(q_lora_rank=10),
}


def build(name, dtype, monkeypatch):
    torch.manual_seed(0)
    modeling, module, cls = PAIRS[name]()
    torch_fallbacks(monkeypatch, modeling)
    perturb(module)
    module = module.to(dtype)
    ours = cls.from_transformers(module)
    ours.chunk_size = 4  # several chunks and a partial last one in T = 11
    return modeling, module, ours


def causal_mask(T, dtype):
    """The additive mask [1, 1, T, T] transformers' eager attention takes (0 or -inf)."""
    upper = torch.ones(T, T, dtype=torch.bool).triu(1)
    return torch.zeros(T, T, dtype=dtype).masked_fill(upper, float("-inf"))[None, None]


def rotary_embeddings(module, T, dtype):
    """Qwen3-Next's (cos, sin) [1, T, rotary_dim], computed in float64 (their rotary module casts
    the angles to float32) and cast to the input dtype, as theirs does."""
    rope = module.config.rope_parameters
    dim = int(module.head_dim * rope["partial_rotary_factor"])
    inv_freq = rope["rope_theta"] ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None]
    emb = torch.cat([angle, angle], dim=-1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def call(module, x):
    T = x.shape[1]
    if isinstance(module, qwen3_next.Qwen3NextAttention):
        return module(x, rotary_embeddings(module, T, x.dtype), causal_mask(T, x.dtype))[0]
    if isinstance(module, kimi_linear.KimiLinearAttention):
        return module(x, causal_mask(T, x.dtype))[0]
    return module(x)


def theirs(modeling, module, x):
    if x.dtype == torch.float64:
        with promoted(modeling):
            return call(module, x)
    return call(module, x)


@pytest.mark.parametrize("name", PAIRS)
def test_every_weight_is_copied(name, monkeypatch):
    _, module, ours = build(name, torch.float64, monkeypatch)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in module.parameters())


def forward_backward(modeling, module, ours, x, w):
    """Both layers on x, the cotangent w -> (outputs, input gradients, weight gradients) of
    (ours, theirs), every weight gradient in our layout (the converter run on their gradients)."""
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, _ = ours(x_ours)
    y_theirs = theirs(modeling, module, x_theirs)
    (y_ours * w).sum().backward()
    (y_theirs * w).sum().backward()
    grads = type(ours).from_transformers(gradients_as_module(module))
    weights_ours = {n: p.grad for n, p in ours.named_parameters()}
    weights_theirs = dict(grads.named_parameters())
    return (y_ours, x_ours.grad, weights_ours), (y_theirs, x_theirs.grad, weights_theirs)


def assert_close(got, want, tol):
    y, dx, dw = got
    assert relative_error(y, want[0]) < tol, "forward"
    assert relative_error(dx, want[1]) < tol, "input gradient"
    assert dw.keys() == want[2].keys()
    for name, grad in dw.items():
        assert relative_error(grad, want[2][name].detach()) < tol, name


@pytest.mark.parametrize("name", PAIRS)
def test_float64_forward_and_gradients_equal(name, monkeypatch):
    modeling, module, ours = build(name, torch.float64, monkeypatch)
    x, w = torch.randn(2, B, T, D, dtype=torch.float64)
    ours_result, theirs_result = forward_backward(modeling, module, ours, x, w)
    assert_close(ours_result, theirs_result, 1e-12)


@pytest.mark.parametrize("name", PAIRS)
def test_float32_forward_and_gradients_within_1e5(name, monkeypatch):
    """Ours in float32 against the float64 result of both (equal to 1e-12, above), and our float32
    forward against theirs. Their float32 weight gradients are not the yardstick: KDA's A_log
    gradient, a sum over every token and channel, is 2e-5 from the float64 one in transformers'
    float32 reference (ours 5e-6)."""
    modeling, module, _ = build(name, torch.float64, monkeypatch)
    _, module32, ours32 = build(name, torch.float32, monkeypatch)
    x, w = torch.randn(2, B, T, D, dtype=torch.float64)
    _, truth = forward_backward(modeling, module, ours32.double(), x, w)
    ours32 = type(ours32).from_transformers(module32)
    ours32.chunk_size = 4
    got, theirs32 = forward_backward(modeling, module32, ours32, x.float(), w.float())
    assert relative_error(got[0], theirs32[0]) < 1e-5
    y, dx, dw = got
    assert_close((y.double(), dx.double(), {n: g.double() for n, g in dw.items()}), truth, 1e-5)


@pytest.mark.parametrize("name", PAIRS)
def test_token_by_token_decoding_equals_their_forward(name, monkeypatch):
    modeling, module, ours = build(name, torch.float64, monkeypatch)
    x = torch.randn(B, T, D, dtype=torch.float64)
    with torch.no_grad():
        expected = theirs(modeling, module, x)
        state = ours.new_state(B, torch.float64)
        prefill, state = ours(x[:, :3], state)  # a prompt in chunk mode, then one token at a time
        steps = [prefill]
        for t in range(3, T):
            y, state = ours(x[:, t : t + 1], state)
            steps.append(y)
    assert relative_error(torch.cat(steps, dim=1), expected) < 1e-12


def test_converters_refuse_another_module():
    with pytest.raises(TypeError, match="Qwen3NextGatedDeltaNet"):
        GatedDeltaNet.from_transformers(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="KimiLinearDeltaAttention"):
        KimiDeltaAttention.from_transformers(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="KimiLinearAttention"):
        MultiHeadLatentAttention.from_transformers(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="Qwen3NextAttention"):
        GatedAttention.from_transformers(torch.nn.Linear(2, 2))
