"""fla's softmax-attention layers on the CPU (``linattn.integrations._fla_attention``, part of
``linattn.integrations.fla.enable()``): flash-attn's functions against torch's SDPA and fla's
naive attention, the decoding step against fla's naive one, the Forgetting Transformer's layer
against fla's Triton kernels (interpreted), the stick-breaking layer against fla's naive op, and
the ForgettingTransformer / StickBreakingAttention models without Triton (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

interp = pytest.importorskip("tests.fla_interpreter")  # before fla
pytest.importorskip("fla")

import fla.layers  # noqa: E402
from fla.ops.attn.naive import naive_attn_decoding, naive_parallel_attn  # noqa: E402
from fla.ops.stickbreaking_attn.naive import naive_stickbreaking_attn  # noqa: E402

from linattn.integrations import _fla_attention as attention  # noqa: E402
from linattn.integrations import fla as linattn_fla  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
SRC = Path(__file__).resolve().parents[2] / "src"


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _sdpa(q, k, v, mask, scale):
    """torch's SDPA with an explicit boolean mask, key/value heads repeated for GQA."""
    G = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(G, dim=2).transpose(1, 2) for x in (k, v))
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=scale)
    return o.transpose(1, 2)


@pytest.mark.parametrize("window", [(-1, -1), (3, 0), (2, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_func_equals_sdpa(window, causal):
    q, k, v = _randn(2, 9, 4, 8), _randn(2, 13, 2, 8, seed=1), _randn(2, 13, 2, 5, seed=2)
    # flash-attn aligns the 9 queries with the last 9 keys: query i is at key position i + 4
    i, j = torch.arange(9)[:, None] + 4, torch.arange(13)[None, :]
    left, right = window
    mask = torch.ones(9, 13, dtype=torch.bool)
    mask &= j <= i + (0 if causal else (right if right >= 0 else 13))
    mask &= j >= i - (left if left >= 0 else 13)
    o = attention.flash_attn_func(q, k, v, softmax_scale=0.4, causal=causal, window_size=window)
    torch.testing.assert_close(o, _sdpa(q, k, v, mask, 0.4), rtol=0, atol=1e-12)


def test_flash_attn_window_is_fla_s_window_and_varlen_is_per_sequence():
    q, k, v = _randn(1, 20, 4, 8), _randn(1, 20, 2, 8, seed=1), _randn(1, 20, 2, 8, seed=2)
    o = attention.flash_attn_func(q, k, v, causal=True, window_size=(5, 0))
    torch.testing.assert_close(
        o, naive_parallel_attn(q, k, v, window_size=6)[0], rtol=0, atol=1e-12
    )
    cu = torch.tensor([0, 1, 12, 20], dtype=torch.int32)
    packed = attention.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 11, 11, causal=True)
    for a, b in ((0, 1), (1, 12), (12, 20)):
        want = attention.flash_attn_func(q[:, a:b], k[:, a:b], v[:, a:b], causal=True)[0]
        torch.testing.assert_close(packed[a:b], want, rtol=0, atol=0)


def test_flash_attn_query_without_keys_outputs_zero_and_refusals():
    q, k, v = _randn(1, 5, 2, 4), _randn(1, 3, 2, 4), _randn(1, 3, 2, 4)
    # causal, 5 queries aligned to 3 keys: the first two queries see no key
    o = attention.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(o[:, :2], torch.zeros_like(o[:, :2])) and o[:, 2:].abs().sum() > 0
    with pytest.raises(ValueError, match="query heads"):
        attention.flash_attn_func(q[:, :, :1], k, v)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        attention.flash_attn_func(q, k, v, alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match="dropout_p"):
        attention.flash_attn_func(q, k, v, dropout_p=1.0)


@pytest.mark.parametrize("do_gate_scale", [False, True])
@pytest.mark.parametrize(("window_size", "sink"), [(None, False), (4, True), (0, False)])
def test_attn_decoding_one_step_equals_fla_s_naive(do_gate_scale, window_size, sink):
    cu = torch.tensor([0, 1, 9, 9, 16])
    q, k, v = _randn(1, 4, 4, 8), _randn(1, 16, 2, 8, seed=1), _randn(1, 16, 2, 5, seed=2)
    g = F.logsigmoid(_randn(1, 16, 4, seed=3))
    s = _randn(4, seed=4) if sink else None
    kw = dict(g=g, cu_seqlens=cu, do_gate_scale=do_gate_scale, window_size=window_size)
    o = attention.attn_decoding_one_step(q, k, v, sink_bias=s, **kw)
    want = naive_attn_decoding(q, k, v, sink_bias=s, **kw)
    # fla's naive sums the gates in float32
    torch.testing.assert_close(o, want.to(o.dtype), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("extra", [{}, {"window_size": 4, "sink": True}], ids=["plain", "window"])
def test_attn_decoding_one_step_equals_fla_s_kernel(extra):
    from fla.ops.attn.decoding import attn_decoding_one_step as fla_decoding

    cu = torch.tensor([0, 1, 9, 16])
    q, k = (
        _randn(1, 3, 4, 16, dtype=torch.float32),
        _randn(1, 16, 2, 16, seed=1, dtype=torch.float32),
    )
    v = _randn(1, 16, 2, 16, seed=2, dtype=torch.float32)
    g = F.logsigmoid(_randn(1, 16, 4, seed=3, dtype=torch.float32))
    kw = {"window_size": extra.get("window_size")}
    if extra.get("sink"):
        kw["sink_bias"] = _randn(4, seed=4, dtype=torch.float32)
    o = attention.attn_decoding_one_step(q, k, v, g, cu_seqlens=cu, do_gate_scale=True, **kw)
    want = fla_decoding(q, k, v, g, cu_seqlens=cu, do_gate_scale=True, **kw)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-6)


def _forward_and_grads(layer, x, w):
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    y = layer(x)[0]
    (y * w).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}


def test_forgetting_attention_layer_equals_fla_s_kernel():
    torch.manual_seed(0)
    layer = fla.layers.ForgettingAttention(
        hidden_size=32, num_heads=4, num_kv_heads=2, use_output_gate=True, layer_idx=0
    )
    x, w = torch.randn(2, 19, 32), torch.randn(2, 19, 32)
    want = _forward_and_grads(layer, x, w)  # fla's Triton kernel, interpreted
    linattn_fla.enable()
    try:
        got = _forward_and_grads(layer, x, w)
    finally:
        linattn_fla.disable()
    for a, b in zip(got[:2], want[:2], strict=True):
        assert interp.relative(a, b) < 1e-5
    for name, grad in want[2].items():
        assert interp.relative(got[2][name], grad) < 1e-5, name


def test_stickbreaking_layer_runs_on_the_cpu_with_fla_s_formula():
    torch.manual_seed(0)
    layer = fla.layers.StickBreakingAttention(hidden_size=32, num_heads=4, qk_norm=False)
    x = torch.randn(2, 11, 32)
    with pytest.raises(NotImplementedError, match="GPU"):
        layer(x)  # fla's own forward refuses the CPU
    linattn_fla.enable()
    try:
        y = layer(x)[0]
        y.sum().backward()
    finally:
        linattn_fla.disable()
    q, k, v = (p(x).unflatten(-1, (4, 8)) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    o, _ = naive_stickbreaking_attn(q, k, v, attend_current=layer.attend_current)
    torch.testing.assert_close(y, layer.o_proj(o.flatten(-2)), rtol=1e-5, atol=1e-6)
    assert layer.q_proj.weight.grad is not None


def test_enable_and_disable_bind_and_restore_flash_attn():
    module = sys.modules["fla.layers.attn"]
    before = vars(module).get("flash_attn_func")
    linattn_fla.enable()
    try:
        assert vars(module)["flash_attn_func"] is not None
    finally:
        linattn_fla.disable()
    assert vars(module).get("flash_attn_func") is before
    assert "flash_attn_varlen_func" not in vars(module) or before is not None


@pytest.mark.slow
def test_models_run_on_the_cpu_without_triton():
    """ForgettingTransformer and StickBreakingAttention: a training step and (FoX) greedy
    generation; FoX with attention residuals; WallTransformer's cached generation; in a fresh
    interpreter without Triton's interpreter (a Triton launch fails)."""
    code = """
        import torch, warnings
        warnings.filterwarnings("ignore")
        import linattn.integrations.fla as linattn_fla
        linattn_fla.enable()
        import fla.models as M
        for name in ("ForgettingTransformer", "StickBreakingAttention"):
            config = getattr(M, name + "Config")(hidden_size=32, num_hidden_layers=2,
                                                 num_heads=4, vocab_size=64)
            torch.manual_seed(0)
            model = getattr(M, name + "ForCausalLM")(config)
            ids = torch.randint(0, 64, (2, 20))
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            print(name, "trained", bool(torch.isfinite(loss)))
            if name == "ForgettingTransformer":
                # fla's layer decodes only with a padding mask (attn_decoding_one_step);
                # the first row is left-padded by one token
                prompt = ids[:, :5]
                mask = torch.ones_like(prompt)
                mask[0, 0] = 0
                out = model.generate(prompt, attention_mask=mask, max_new_tokens=4,
                                     do_sample=False)
                print(name, "generated", tuple(out.shape))
        # attention residuals (fused_attnres) between the blocks
        config = M.ForgettingTransformerConfig(hidden_size=32, num_hidden_layers=2, num_heads=4,
                                               vocab_size=64, attnres_block_size=1)
        model = M.ForgettingTransformerForCausalLM(config)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        print("attnres trained", bool(torch.isfinite(loss)))
        # Wall attention decodes from its rescaled key cache (parallel_wall_attn_decode):
        # greedy generation equals recomputing the whole sequence at each step
        config = M.WallTransformerConfig(hidden_size=32, num_hidden_layers=2, num_heads=4,
                                         vocab_size=64)
        model = M.WallTransformerForCausalLM(config).eval()
        out = model.generate(ids[:, :9], max_new_tokens=4, do_sample=False)
        seq = ids[:, :9]
        for _ in range(4):
            seq = torch.cat([seq, model(input_ids=seq).logits[:, -1:].argmax(-1)], 1)
        print("wall generated", bool(torch.equal(out, seq)))
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, env=env, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "ForgettingTransformer trained True" in lines
    assert "StickBreakingAttention trained True" in lines
    assert "ForgettingTransformer generated (2, 9)" in lines
    assert "attnres trained True" in lines
    assert "wall generated True" in lines
