"""fla 0.6.0's CyclicFlowAttention model on the CPU with ``enable()``.

fla's CyFA kernels refuse CPU tensors; with ``enable()`` the layer's ``chunk_cyfa`` /
``fused_recurrent_cyfa`` are linattn's. The run is compared with the same model whose layer
calls fla's own token loop ``naive_recurrent_cyfa`` instead (a training step's loss and
gradients), and greedy ``generate`` (the recurrent form with fla's cache) with the tokens the
naive-loop model generates.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tests.fla_interpreter")  # before fla
pytest.importorskip("fla")

import fla.layers.cyfa as fla_cyfa_layer  # noqa: E402
import fla.models  # noqa: E402
from fla.ops.cyfa.naive import naive_recurrent_cyfa  # noqa: E402

from linattn.integrations import fla as linattn_fla  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def naive(*args, cu_seqlens_cpu=None, checkpoint_level=0, **kwargs):
    return naive_recurrent_cyfa(*args, **kwargs)


def model():
    config = fla.models.CyclicFlowAttentionConfig(
        hidden_size=32, num_hidden_layers=2, num_heads=2, head_dim=16, num_slots=8,
        vocab_size=64, fuse_cross_entropy=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return fla.models.CyclicFlowAttentionForCausalLM(config)


def step(m, ids):
    m.zero_grad()
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def test_training_step_and_generate_equal_flas_naive_loop(monkeypatch):
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))
    m = model().train()
    linattn_fla.enable()
    try:
        with monkeypatch.context() as patch:  # the reference: fla's layer on fla's naive loop
            patch.setattr(fla_cyfa_layer, "chunk_cyfa", naive)
            patch.setattr(fla_cyfa_layer, "fused_recurrent_cyfa", naive)
            loss_ref, grads_ref = step(m, ids)
            with torch.no_grad():
                gen_ref = m.eval().generate(ids[:, :6], max_new_tokens=5, do_sample=False)
        m.train()
        loss, grads = step(m, ids)
        with torch.no_grad():
            gen = m.eval().generate(ids[:, :6], max_new_tokens=5, do_sample=False)
    finally:
        linattn_fla.disable()
    assert torch.isfinite(loss) and abs(float(loss - loss_ref)) < 1e-5 * float(loss_ref)
    assert grads.keys() == grads_ref.keys() and "model.layers.0.attn.readout" in grads
    for name, grad in grads.items():
        error = (grad - grads_ref[name]).norm() / grads_ref[name].norm().clamp_min(1e-12)
        assert error < 1e-4, (name, float(error))
    assert torch.equal(gen, gen_ref)
