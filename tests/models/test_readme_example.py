"""The README's "build a model" example runs as printed (the text below is the README's)."""

from __future__ import annotations

import os

import torch

README_EXAMPLE = """
import torch
from linattn.layers import GatedDeltaNet
from linattn.models import Cache, CausalLM, LMConfig

# A Kimi-Linear-style hybrid: three KDA blocks, then one softmax block.
config = LMConfig(vocab_size=256, d_model=64, n_heads=2, mixers=("kda", "kda", "kda", "softmax"))
model = CausalLM(config)
ids = torch.randint(0, 256, (1, 32))
logits = model(ids)  # [1, 32, 256], chunk mode
out = model.generate(ids, max_new_tokens=16, temperature=0.8, top_k=50, seed=0)  # [1, 48]

cache = model.new_cache(batch_size=1)
model(ids, cache=cache)  # prefill: the cache now holds 32 tokens
step = model(out[:, 32:33], cache=cache)  # one decoding step (recurrent mode)
print(cache.position, cache.nbytes(), cache.numbers_per_block())
cache.save("cache.pt")
cache = Cache.load("cache.pt")

# One layer on its own: [B, T, d_model] -> [B, T, d_model], with a state for generation.
layer = GatedDeltaNet(d_model=64, n_heads=2)
x = torch.randn(2, 10, 64)
y, _ = layer(x)
state = layer.new_state(batch_size=2, dtype=torch.float32)
y_prefill, state = layer(x[:, :9], state)
y_step, state = layer(x[:, 9:], state)  # y_step matches y[:, 9:]
"""


def test_readme_example_runs(tmp_path, capsys):
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the example writes cache.pt
    try:
        scope: dict = {}
        exec(compile(README_EXAMPLE, "README", "exec"), scope)
    finally:
        os.chdir(cwd)
    assert scope["logits"].shape == (1, 32, 256) and scope["out"].shape == (1, 48)
    assert scope["cache"].position == 33
    assert capsys.readouterr().out.startswith("33 ")
    torch.testing.assert_close(scope["y_step"], scope["y"][:, 9:], rtol=1e-4, atol=1e-5)
