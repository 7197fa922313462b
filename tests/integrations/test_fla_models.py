"""fla 0.6.0's model families that run on the CPU under ``enable()`` thanks to
``linattn.integrations._fla_modules``: Mamba-2 (``RMSNormGated``), RetNet (the
rotary embedding), HGRN2 (``rms_norm_linear``) and LightNet (GSA's additive gate and
``rms_norm_swish_gate_linear``).

Each causal LM, on the tiny configuration of ``benchmarks/fla_models.py``, is compared with the
same model (same weights, same ids) run by fla's own kernels under Triton's interpreter
(``tests.fla_interpreter``, imported before fla): the loss, the logits and every parameter's
gradient of a training step, float32 within 1e-5 relative; and under ``enable()`` the prefill of
7 tokens then one token at a time with fla's cache gives the full forward's logits (1e-5). A call
counter shows that linattn's module functions ran. fla's reference loss is torch's cross entropy
(``fuse_cross_entropy=False``: fla's fused one refuses CPU tensors even under the interpreter).
LightNet's reference runs fla's kernels except its GSA gate, which the interpreter cannot run
(its ``logaddexp`` calls libdevice's ``log1p``, None under triton 3.9's interpreter): there the
gate is fla's naive GSA formula (``fla/ops/gsa/naive.py``: ``z = logcumsumexp(s)``,
``g = z_{t-1} - z_t``, ``s = exp(s - z)``), valid for the training forward (no initial state, no
packed sequences).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

interp = pytest.importorskip("tests.fla_interpreter")  # before fla
pytest.importorskip("fla")

import fla.ops.lightnet.chunk  # noqa: E402
import fla.ops.lightnet.fused_recurrent  # noqa: E402

from tests.integrations.test_fla import assert_ran, enabled, randomised  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
relative = interp.relative
TOL = 1e-5
ROOT = Path(__file__).resolve().parents[2]


def census():
    spec = importlib.util.spec_from_file_location(
        "fla_models", ROOT / "benchmarks" / "fla_models.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CENSUS = census()
# family -> the linattn module functions its training step must be seen to run
USES = {
    "mamba2": {"rmsnorm_fn", "rms_norm"},
    "retnet": {"rotary_embedding_fwdbwd", "rms_norm_gated"},
    "hgrn2": {"layer_norm_linear"},
    # LightNet: linattn serves its whole op (compat.lightnet), gate included
    "lightnet": {"fused_recurrent_lightnet", "rms_norm_swish_gate_linear"},
}
# the default run keeps the cheapest references (HGRN2 and Mamba-2, 3 to 7 s each under the
# interpreter); RetNet and LightNet take 8 to 17 s each on the loaded 2-core machine
FAST = ("hgrn2", "mamba2")
CASES = [f if f in FAST else pytest.param(f, marks=pytest.mark.slow) for f in USES]


def causal_lm(family: str, **options) -> torch.nn.Module:
    config_class, model_class = CENSUS.families()[family]
    config = config_class(**CENSUS.options(config_class, family), **options)
    torch.manual_seed(0)
    return randomised(model_class(config))


def training_step(model, ids):
    model.train().zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits
    return out.loss.detach(), logits, grads


def naive_additive_gate(x, initial_state=None, cu_seqlens=None, output_dtype=None, gate_dtype=None):
    """fla's naive GSA gate formula (fla/ops/gsa/naive.py), for the training forward only."""
    assert initial_state is None and cu_seqlens is None
    z = x.float().logcumsumexp(1)
    g = torch.cat((z[:, :1], z[:, :-1]), 1) - z
    s = torch.exp(x.float() - z)
    return s.to(output_dtype or x.dtype), g.to(gate_dtype or x.dtype), z[:, -1:]


@pytest.mark.parametrize("family", CASES)
def test_training_step_equals_fla(family):
    ids = torch.randint(0, CENSUS.VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    ref = causal_lm(family, fuse_cross_entropy=False)
    model = causal_lm(family)
    with pytest.MonkeyPatch.context() as patch:
        if family == "lightnet":
            for module in (fla.ops.lightnet.chunk, fla.ops.lightnet.fused_recurrent):
                patch.setattr(module, "fused_additive_gate", naive_additive_gate)
        loss_ref, logits_ref, grads_ref = training_step(ref, ids)
    with enabled() as counts:
        loss, logits, grads = training_step(model, ids)
        assert_ran(counts, USES[family])
    assert relative(loss, loss_ref) < TOL
    assert relative(logits, logits_ref) < TOL
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        assert relative(grads[name], grads_ref[name]) < TOL, name


@pytest.mark.parametrize("family", list(USES))
def test_prefill_and_decoding_equal_the_full_forward(family):
    model = causal_lm(family).eval()
    ids = torch.randint(0, CENSUS.VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    with enabled():
        error = CENSUS.decode_error(model, ids, prefill=7)
    assert error < TOL
