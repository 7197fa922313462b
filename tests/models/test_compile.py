"""CausalLM under torch.compile(dynamic=True): training steps at three sequence
lengths and generation (prefill, then decoding steps through the cache) at three prompt lengths,
as eager, without a new graph for the third length. Slow: every mixer's graph is captured."""

from __future__ import annotations

import pytest
import torch

from linattn.models import CausalLM, LMConfig
from linattn.models.config import AUXILIARY_MIXERS, MIXERS


def _counter():
    """A compile counter with the aot_eager backend. torch._dynamo.testing is imported here, not
    at collection: it imports triton, which must come after tests.fla_interpreter (the fla tests
    collected earlier in a session would then fail)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    return CompileCounterWithBackend("aot_eager")


def _model() -> CausalLM:
    torch.manual_seed(0)
    # log-linear Mamba-2 is left out: its op branches in Python on the positions (the Fenwick
    # levels of each chunk), which fullgraph tracing refuses (not traceable yet).
    mixers = tuple(m for m in MIXERS + AUXILIARY_MIXERS if m != "log_linear_mamba2")
    config = LMConfig(vocab_size=32, d_model=16, n_heads=2, mixers=mixers, chunk_size=4)
    return CausalLM(config)


@pytest.mark.slow  # about two minutes here
def test_training_steps_compile_once_for_three_lengths(monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    model = _model()

    def loss(ids: torch.Tensor) -> torch.Tensor:
        return model(ids).logsumexp(-1).mean()

    torch._dynamo.reset()
    counter = _counter()
    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend=counter)
    frames = []
    for T in (5, 7, 11):
        ids = torch.randint(0, 32, (2, T), generator=torch.Generator().manual_seed(T))
        results = []
        for fn in (compiled, loss):
            model.zero_grad()
            value = fn(ids)
            value.backward()
            results.append([value.detach(), *(p.grad.clone() for p in model.parameters())])
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        frames.append(counter.frame_count)
    assert frames[1] == frames[2]


@pytest.mark.slow  # about three minutes here
def test_prefill_and_decoding_compile_once_for_three_prompt_lengths(monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    model = _model()
    torch._dynamo.reset()
    counter = _counter()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    frames = []
    with torch.no_grad():
        for T in (5, 7, 11):
            gen = torch.Generator().manual_seed(T)
            cache, eager_cache = model.new_cache(2), model.new_cache(2)
            ids = torch.randint(0, 32, (2, T), generator=gen)
            torch.testing.assert_close(compiled(ids, cache), model(ids, eager_cache))
            for _ in range(3):
                token = torch.randint(0, 32, (2, 1), generator=gen)
                torch.testing.assert_close(compiled(token, cache), model(token, eager_cache))
            frames.append(counter.frame_count)
    assert frames[1] == frames[2]
