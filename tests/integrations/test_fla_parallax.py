"""fla's Parallax decoding on the CPU (``linattn.integrations._fla_parallax``, part of
``linattn.integrations.fla.enable()``): ``parallax_decode`` and ``parallax_decode_one_step``
against fla's Triton kernels (interpreted) and against fla's naive Parallax, and the Parallax
model's cached decoding (with left padding and a window) against its whole forward."""

from __future__ import annotations

import pytest
import torch

interp = pytest.importorskip("tests.fla_interpreter")  # before fla
pytest.importorskip("fla")

import fla.models  # noqa: E402
from fla.ops.parallax import decode as fla_decode  # noqa: E402
from fla.ops.parallax.naive import naive_parallax  # noqa: E402

from linattn.integrations import _fla_parallax as parallax  # noqa: E402
from linattn.integrations import fla as linattn_fla  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _inputs(B, Sq, Skv, HQ, H, K, dtype=torch.float32):
    q, r = _randn(B, Sq, HQ, K, dtype=dtype), 0.3 * _randn(B, Sq, HQ, K, seed=1, dtype=dtype)
    k, v = _randn(B, Skv, H, K, seed=2, dtype=dtype), _randn(B, Skv, H, K, seed=3, dtype=dtype)
    return q, r, k, v


@pytest.mark.parametrize(
    ("Sq", "window_size", "cache_start"),
    [(13, None, None), (5, None, [0, 3]), (5, 4, None), (13, 6, [2, 0])],
    ids=["prefill", "chunk-padded", "chunk-window", "prefill-window-padded"],
)
def test_parallax_decode_equals_fla_s_kernel(Sq, window_size, cache_start):
    q, r, k, v = _inputs(2, Sq, 13, 4, 2, 16)
    start = None if cache_start is None else torch.tensor(cache_start)
    kw = dict(scale=0.3, window_size=window_size, cache_start=start)
    o = parallax.parallax_decode(q, r, k, v, **kw)
    want = fla_decode.parallax_decode(q, r, k, v, **kw)  # fla's Triton kernel, interpreted
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)
    if cache_start is None:  # padding-free rows also equal fla's naive Parallax
        Skv = k.shape[1]
        naive = naive_parallax(torch.cat([q.new_zeros(2, Skv - Sq, 4, 16), q], 1),
                               torch.cat([r.new_zeros(2, Skv - Sq, 4, 16), r], 1), k, v,
                               scale=0.3, window_size=window_size)[:, Skv - Sq:]  # fmt: skip
        torch.testing.assert_close(o, naive, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("window_size", "cache_start"), [(None, None), (5, [4, 0]), (None, [9, 1])]
)
def test_parallax_decode_one_step_equals_fla_s_kernel(window_size, cache_start):
    q, r, k, v = _inputs(2, 1, 11, 4, 2, 16)
    start = None if cache_start is None else torch.tensor(cache_start)
    kw = dict(window_size=window_size, cache_start=start)
    o = parallax.parallax_decode_one_step(q, r, k, v, **kw)
    want = fla_decode.parallax_decode_one_step(q, r, k, v, **kw)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o, parallax.parallax_decode(q, r, k, v, **kw), rtol=0, atol=0)


def test_a_query_without_keys_outputs_zero_and_refusals():
    q, r, k, v = _inputs(1, 2, 4, 2, 2, 8, dtype=torch.float64)
    o = parallax.parallax_decode(q, r, k, v, cache_start=torch.tensor([4]))
    assert torch.equal(o, torch.zeros_like(o)) and o.dtype == torch.float64
    with pytest.raises(ValueError, match="cover the queries"):
        parallax.parallax_decode(q, r, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="query heads"):
        parallax.parallax_decode(q[:, :, :1], r[:, :, :1], k, v)
    with pytest.raises(ValueError, match="window_size"):
        parallax.parallax_decode(q, r, k, v, window_size=0)
    with pytest.raises(ValueError, match="one query"):
        parallax.parallax_decode_one_step(q, r, k, v)
    with pytest.raises(ValueError, match="cache_start"):
        parallax.parallax_decode(q, r, k, v, cache_start=torch.tensor([0, 1]))


@pytest.mark.parametrize("window_size", [None, 5])
def test_parallax_model_decodes_as_its_forward(window_size):
    """Prefill with a cache, then one token at a time (the second row left-padded by 3 with the
    attention mask): the logits of each row's real tokens equal the forward of that row alone."""
    config = fla.models.ParallaxConfig(hidden_size=64, num_hidden_layers=2, num_heads=4,
                                       vocab_size=64, window_size=window_size)  # fmt: skip
    torch.manual_seed(0)
    model = fla.models.ParallaxForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    linattn_fla.enable()
    try:
        with torch.no_grad():
            want = [model(input_ids=ids[b : b + 1, 3 * b :], use_cache=False).logits
                    for b in range(2)]  # fmt: skip
            out = model(input_ids=ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
            steps, cache = [out.logits], out.past_key_values
            for t in range(6, 12):
                out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1],
                            past_key_values=cache, use_cache=True)  # fmt: skip
                steps.append(out.logits)
                cache = out.past_key_values
    finally:
        linattn_fla.disable()
    got = torch.cat(steps, 1)
    for b in range(2):
        torch.testing.assert_close(got[b : b + 1, 3 * b :], want[b], rtol=1e-5, atol=1e-5)
