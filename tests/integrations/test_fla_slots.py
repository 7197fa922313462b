"""fla 0.6.0's GSA and ABC models (``GSAForCausalLM``, ``ABCForCausalLM``) on linattn with
``linattn.integrations.fla.enable()``: the same model run by fla's own Triton kernels under
Triton's interpreter, float32 within 1e-5 relative (logits of a forward pass, greedy
``generate`` with fla's cache: for ABC the cache restarts the normaliser at every call and
carries the kernel's final state, which ``compat.chunk_abc`` follows). Both models also run on a
CPU without the interpreter: ``enable()`` replaces fla's ``layer_norm_linear`` (behind
``rms_norm_linear``) and its rotary embedding.
"""

from __future__ import annotations

import pytest
import torch

interp = pytest.importorskip("tests.fla_interpreter")  # before fla
pytest.importorskip("fla")

import fla.models  # noqa: E402

from tests.integrations.test_fla import assert_ran, enabled, run_python  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
MODELS = {
    "gsa": ("GSAConfig", "GSAForCausalLM", {"chunk_gsa", "layer_norm_linear"},
            {"fused_recurrent_gsa", "layer_norm_linear"}),
    "abc": ("ABCConfig", "ABCForCausalLM", {"chunk_abc", "rms_norm_gated"}, {"chunk_abc"}),
}  # fmt: skip


def causal_lm(name):
    config, model, *_ = MODELS[name]
    torch.manual_seed(0)
    cfg = getattr(fla.models, config)(
        hidden_size=32, num_hidden_layers=2, num_heads=2, vocab_size=64, fuse_cross_entropy=False
    )
    return getattr(fla.models, model)(cfg).eval()


@pytest.mark.slow  # about 20 s (GSA) and 70 s (ABC) under the interpreter
@pytest.mark.parametrize("name", ["gsa", "abc"])
def test_causal_lm_forward_and_generate_equal_fla(name):
    """A forward of 70 tokens (GSA's layer: chunk mode beyond 64) and greedy generation."""
    model = causal_lm(name)
    ids = torch.randint(0, 64, (1, 70), generator=torch.Generator().manual_seed(1))
    settings = {"max_new_tokens": 4, "do_sample": False, "output_logits": True,
                "return_dict_in_generate": True}  # fmt: skip
    with torch.no_grad():
        want = model(ids).logits
        want_gen = model.generate(ids[:, :9], **settings)
        with enabled() as counts:
            got = model(ids).logits
            assert_ran(counts, MODELS[name][2])
            got_gen = model.generate(ids[:, :9], **settings)
            assert_ran(counts, MODELS[name][3])
    assert interp.relative(got, want) < 1e-5
    assert torch.equal(got_gen.sequences, want_gen.sequences)
    assert interp.relative(torch.stack(got_gen.logits), torch.stack(want_gen.logits)) < 1e-5


@pytest.mark.slow  # about 40 s (a fresh interpreter importing fla and transformers)
def test_gsa_model_runs_on_the_cpu_with_enable():
    result = run_python(
        """
        import torch
        import fla.models
        import linattn.integrations.fla as linattn_fla

        cfg = fla.models.GSAConfig(hidden_size=32, num_hidden_layers=2, num_heads=2,
                                   vocab_size=64)
        model = fla.models.GSAForCausalLM(cfg)
        ids = torch.randint(0, 64, (1, 12))
        try:
            model(ids)
        except Exception as error:
            print("without enable:", type(error).__name__, error)
        linattn_fla.enable()
        loss = model(ids, labels=ids).loss
        loss.backward()
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
        print("with enable:", bool(loss.isfinite()), tuple(out.shape))
        linattn_fla.disable()
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("without enable:") and "0 active drivers" in line for line in lines)
    assert "with enable: True (1, 15)" in lines
