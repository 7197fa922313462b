"""linattn behind transformers' linear-attention kernels: equal to transformers' own CPU path.

Tiny models of each family (``hf_models``), random weights: logits, a prefill then token-by-token
decoding with the model's cache, and greedy ``generate``, with ``apply`` against the same model on
transformers' pure-PyTorch kernels: float32 to 1e-4 relative, float64 to 1e-12 with the model's
float32 casts promoted. With fla installed transformers binds fla's Triton kernels (which cannot
run on the CPU); without it (hidden in a subprocess) its fallbacks: ``apply`` replaces either.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from linattn.integrations import _hf_kernels as kernels  # noqa: E402
from linattn.integrations import transformers as hf  # noqa: E402
from tests.integrations import hf_models  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ["qwen3_next", "qwen3_5", "kimi_linear", "mamba2"]
DTYPES = [torch.float32, torch.float64]


def has_family(family: str) -> bool:
    try:
        importlib.import_module(hf.module_name(family))
    except ImportError:
        return False
    return True


def needs(family: str):
    return pytest.mark.skipif(not has_family(family), reason=f"transformers has no {family}")


@pytest.fixture(autouse=True)
def _undo():
    yield
    hf.disable()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_apply_equals_transformers_own_path(family, dtype):
    if not has_family(family):
        pytest.skip(f"transformers has no {family}")
    errors = hf_models.compare(family, dtype)
    assert max(errors.values()) < hf_models.TOLERANCE[dtype], errors


def counting(monkeypatch, overrides: dict) -> dict[str, int]:
    """Count the calls of each of linattn's kernels (patched into `overrides` before apply)."""
    calls = dict.fromkeys(overrides, 0)
    for name, fn in dict(overrides).items():

        def spy(*args, _fn=fn, _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setitem(overrides, name, spy)
    return calls


@pytest.mark.parametrize(
    ("family", "prefill", "step"),
    [
        ("qwen3_next", "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
        ("kimi_linear", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"),
        ("mamba2", "mamba2_chunk_scan", "mamba2_selective_state_update"),
    ],
)
def test_prefill_takes_the_chunk_form_and_decoding_the_step(monkeypatch, family, prefill, step):
    calls = counting(monkeypatch, hf.FAMILIES[family])
    model = hf.apply(hf_models.build(family))
    ids = torch.randint(3, hf_models.VOCAB, (1, 12))
    with torch.no_grad():
        hf_models.decode(model, ids, 9)
    layers = sum(1 for m in model.modules() if "_linattn_saved" in vars(m))
    assert layers >= 1
    assert calls[prefill] == layers and calls[step] == 3 * layers, calls
    assert calls["causal_conv1d_fn"] == layers and calls["causal_conv1d_update"] == 3 * layers


def test_apply_patches_one_model_only():
    ours, theirs = hf_models.build("qwen3_next"), hf_models.build("qwen3_next")
    assert hf.apply(ours) is ours
    patched = [m for m in ours.modules() if "forward" in vars(m)]
    assert [type(m).__name__ for m in patched] == ["Qwen3NextGatedDeltaNet"]
    assert not any("forward" in vars(m) for m in theirs.modules())
    hf.disable()
    assert not any("forward" in vars(m) for m in ours.modules())


def test_apply_refuses_what_it_cannot_serve():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        hf.apply("Qwen/Qwen3-Next")
    with pytest.raises(ValueError, match="no linear-attention layer linattn serves"):
        hf.apply(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("model", [None, "x", 3, torch.nn.Linear])
def test_restore_checks_its_argument_like_apply(model):
    """restore(None) / restore("x") raised AttributeError; now apply's TypeError."""
    for entry in (hf.apply, hf.restore):
        with pytest.raises(TypeError, match="model must be a torch.nn.Module, got "):
            entry(model)


def test_the_family_helpers_check_their_argument():
    with pytest.raises(TypeError, match="family must be a str, got NoneType"):
        hf.module_name(None)
    with pytest.raises(ValueError, match="family must be one of .*mamba2.*; got 'mamba3'"):
        hf.module_name("mamba3")
    with pytest.raises(TypeError, match="cls must be a class, got str"):
        hf.family_of("Mamba2Mixer")
    assert hf.family_of(torch.nn.Linear) is None


def test_enable_then_disable_round_trip():
    module = importlib.import_module(hf.module_name("qwen3_next"))
    bound = {name: getattr(module, name) for name in hf.GATED_DELTA}
    model = hf_models.build("qwen3_next")
    ids = torch.randint(3, hf_models.VOCAB, (2, 19))
    with torch.no_grad(), hf_models.own_path("qwen3_next"):
        ref = model(ids).logits
    hf.enable()
    hf.enable()  # twice is harmless
    assert hf.is_enabled()
    for name, fn in hf.GATED_DELTA.items():
        assert getattr(module, name) is fn
    built_after = hf_models.build("qwen3_next")  # the same weights (seed 0)
    with torch.no_grad():
        assert hf_models.relative(built_after(ids).logits, ref) < 1e-4
    hf.disable()
    assert not hf.is_enabled()
    assert {name: getattr(module, name) for name in hf.GATED_DELTA} == bound


def test_enable_covers_every_family_transformers_has():
    hf.enable()
    for family, overrides in hf.FAMILIES.items():
        if not has_family(family):
            continue
        module = importlib.import_module(hf.module_name(family))
        for name, fn in overrides.items():
            assert getattr(module, name) is fn, (family, name)


FIRST = {"gated_delta": "qwen3_next", "kda": "kimi_linear", "mamba2": "mamba2"}
GROUP = {id(hf.GATED_DELTA): "gated_delta", id(hf.KDA): "kda", id(hf.MAMBA2): "mamba2"}


@pytest.mark.parametrize("family", sorted(hf.FAMILIES))
def test_every_family_shares_the_kernels_linattn_replaces(family):
    """The families of one kernel run the same fallback code, called from one layer class.

    linattn's adapters were checked against the first family's fallbacks (above); a family whose
    fallback differed (a new transformers) would need its own adapter: this test says so.
    """
    if not has_family(family):
        pytest.skip(f"transformers has no {family}")
    module = importlib.import_module(hf.module_name(family))
    first = importlib.import_module(hf.module_name(FIRST[GROUP[id(hf.FAMILIES[family])]]))
    for name in hf.FAMILIES[family]:
        source = inspect.getsource(getattr(module, name).__wrapped__)
        assert source == inspect.getsource(getattr(first, name).__wrapped__), name
    classes = [
        c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__
    ]
    assert any(hf.kernel_methods(c, set(hf.FAMILIES[family])) for c in classes)


SHAPES = [(2, 37, 2, 4, 8, 16), (1, 64, 1, 1, 16, 8), (3, 5, 2, 2, 4, 4)]  # B, T, H, HV, K, V


def gated_delta_inputs(B, T, H, HV, K, V, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen, dtype=dtype)
    g = -torch.rand(B, T, HV, generator=gen, dtype=dtype) * 2
    beta = torch.rand(B, T, HV, generator=gen, dtype=dtype)
    S0 = torch.randn(B, HV, K, V, generator=gen, dtype=dtype)
    return q, k, v, g, beta, S0


def promoted(dtype):
    return hf_models.float32_promoted() if dtype == torch.float64 else torch.no_grad()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_gated_delta_kernels_equal_transformers_fallbacks(form, shape, dtype):
    module = importlib.import_module(hf.module_name("qwen3_next"))
    theirs = getattr(module, f"torch_{form}_gated_delta_rule").__wrapped__
    ours = getattr(kernels, f"{form}_gated_delta_rule")
    q, k, v, g, beta, S0 = gated_delta_inputs(*shape, dtype)
    for state in (None, S0):
        kw = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
        with promoted(dtype):
            o_ref, S_ref = theirs(q, k, v, g, beta, **kw)
            o, S = ours(q, k, v, g, beta, **kw)
        tol = hf_models.TOLERANCE[dtype]
        assert o.dtype == o_ref.dtype and S.shape == S_ref.shape
        assert hf_models.relative(o, o_ref) < tol and hf_models.relative(S, S_ref) < tol


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_kda_kernels_equal_transformers_fallbacks(form, shape, dtype):
    module = importlib.import_module(hf.module_name("kimi_linear"))
    name = "chunk_kimi_delta_attention" if form == "chunk" else "recurrent_kimi_delta_attention"
    theirs = getattr(module, name).__wrapped__
    ours = kernels.chunk_kda if form == "chunk" else kernels.recurrent_kda
    B, T, H, _, K, V = shape
    q, k, v, _, beta, S0 = gated_delta_inputs(B, T, H, H, K, V, dtype)
    g = -torch.rand(B, T, H, K, generator=torch.Generator().manual_seed(1), dtype=dtype)
    for state in (None, S0):
        kw = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
        with promoted(dtype):
            o_ref, S_ref = theirs(q, k, v, g, beta, **kw)
            o, S = ours(q, k, v, g, beta, **kw)
        tol = hf_models.TOLERANCE[dtype]
        assert hf_models.relative(o, o_ref) < tol and hf_models.relative(S, S_ref) < tol


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mamba2_kernels_equal_transformers_fallbacks(dtype):
    module = importlib.import_module(hf.module_name("mamba2"))
    gen = torch.Generator().manual_seed(0)
    B, T, H, P, G, N = 2, 21, 4, 8, 2, 6
    x = torch.randn(B, T, H, P, generator=gen, dtype=dtype)
    dt = torch.randn(B, T, H, generator=gen, dtype=dtype)
    A = -torch.rand(H, generator=gen, dtype=dtype) * 3
    Bm, C = (torch.randn(B, T, G, N, generator=gen, dtype=dtype) for _ in range(2))
    D, dt_bias = (
        torch.randn(H, generator=gen, dtype=dtype),
        torch.randn(H, generator=gen, dtype=dtype),
    )
    S0 = torch.randn(B, H, P, N, generator=gen, dtype=dtype)
    kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=(0.0, 1.5), return_final_states=True)
    tol = hf_models.TOLERANCE[dtype]
    with promoted(dtype):
        y_ref, S_ref = module.mamba2_chunk_scan.__wrapped__(
            x, dt, A, Bm, C, 8, initial_states=S0, **kw
        )
        y, S = kernels.mamba2_chunk_scan(x, dt, A, Bm, C, 8, initial_states=S0, **kw)
        assert hf_models.relative(y, y_ref) < tol and hf_models.relative(S, S_ref) < tol
        # One step, with the arguments expanded as transformers' mixers pass them, z included.
        z = torch.randn(B, H, P, generator=gen, dtype=dtype)
        step = (
            x[:, 0],
            dt[:, 0, :, None].expand(-1, -1, P),
            A[:, None, None].expand(-1, P, N),
            Bm[:, 0],
            C[:, 0],
            D[:, None].expand(-1, P),
        )
        state_ref, state = S_ref.clone(), S.clone()
        kw = dict(z=z, dt_bias=dt_bias[:, None].expand(-1, P), dt_softplus=True)
        y_ref = module.mamba2_selective_state_update.__wrapped__(state_ref, *step, **kw)
        y = kernels.mamba2_selective_state_update(state, *step, **kw)
    assert hf_models.relative(y, y_ref) < tol and hf_models.relative(state, state_ref) < tol


def test_mamba2_step_refuses_a_decay_that_varies_along_the_head_dimension():
    state = torch.zeros(1, 2, 4, 3)
    dt = torch.rand(1, 2, 4)  # one step size per head channel: not one per head
    A, Bm, C = -torch.ones(2, 4, 3), torch.randn(1, 1, 3), torch.randn(1, 1, 3)
    with pytest.raises(ValueError, match="dt must be one value per head"):
        kernels.mamba2_selective_state_update(state, torch.randn(1, 2, 4), dt, A, Bm, C)


def test_conv_kernels_equal_transformers_fallbacks():
    module = importlib.import_module(hf.module_name("qwen3_next"))
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 6, 11, generator=gen), torch.randn(6, 4, generator=gen)
    bias = torch.randn(6, generator=gen)
    ref = module.causal_conv1d_fn.__wrapped__(x, w, bias, activation="silu")
    assert torch.allclose(kernels.causal_conv1d_fn(x, w, bias, activation="silu"), ref, atol=0)
    state_ref = torch.randn(2, 6, 4, generator=gen)
    state = state_ref.clone()
    x1 = torch.randn(2, 6, 1, generator=gen)
    ref = module.causal_conv1d_update.__wrapped__(x1, state_ref, w, bias, "silu")
    assert torch.equal(kernels.causal_conv1d_update(x1, state, w, bias, "silu"), ref)
    assert torch.equal(state, state_ref)
    with pytest.raises(ValueError, match="cu_seqlens"):
        kernels.causal_conv1d_fn(x, w, cu_seqlens=torch.tensor([0, 11]))


CONV_ACTIVATIONS = [None, "silu", "swish", "gelu", "gelu_new", "relu", "tanh", "sigmoid"]


@pytest.mark.parametrize("activation", CONV_ACTIVATIONS)
def test_conv_kernels_apply_every_activation_transformers_knows(activation):
    """transformers' own convolution applies ACT2FN[activation]: so do linattn's (the
    Mamba-2 family's hidden_act, e.g. gelu, was refused)."""
    module = importlib.import_module(hf.module_name("mamba2"))
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 6, 11, generator=gen), torch.randn(6, 4, generator=gen)
    bias = torch.randn(6, generator=gen)
    ref = module.causal_conv1d_fn.__wrapped__(x, w, bias, activation=activation)
    assert torch.allclose(kernels.causal_conv1d_fn(x, w, bias, activation), ref, atol=1e-6)
    state_ref = torch.randn(2, 6, 3, generator=gen)
    state, x1 = state_ref.clone(), torch.randn(2, 6, 1, generator=gen)
    ref = module.causal_conv1d_update.__wrapped__(x1, state_ref, w, bias, activation)
    got = kernels.causal_conv1d_update(x1, state, w, bias, activation)
    assert torch.allclose(got, ref, atol=1e-6) and torch.equal(state, state_ref)


def test_conv_kernels_refuse_an_activation_transformers_does_not_know():
    x, w = torch.randn(1, 2, 5), torch.randn(2, 4)
    with pytest.raises(KeyError, match="no_such_act"):  # ACT2FN's refusal, as transformers' own
        kernels.causal_conv1d_fn(x, w, None, "no_such_act")


@needs("mamba2")
@pytest.mark.parametrize("hidden_act", ["gelu", "relu"])
def test_mamba2_with_any_hidden_act_equals_transformers_own_path(hidden_act):
    """A Mamba-2 model whose hidden_act is not silu runs on linattn, equal to transformers'."""
    errors = hf_models.compare("mamba2", torch.float32, hidden_act=hidden_act)
    assert max(errors.values()) < hf_models.TOLERANCE[torch.float32], errors


WITH_FLA = """
import torch
from linattn.integrations import transformers as hf
from tests.integrations import hf_models
assert hf_models.fla_bound(), "transformers did not bind fla"
model = hf_models.build("qwen3_next")
ids = torch.randint(3, hf_models.VOCAB, (1, 8))
try:
    with torch.no_grad():
        model(ids)
except Exception as e:  # fla's Triton kernel: no GPU driver
    assert "driver" in str(e), e
else:
    raise AssertionError("transformers' Qwen3-Next with fla ran on the CPU")
with torch.no_grad():  # ... and with apply the same model runs on linattn
    assert torch.isfinite(hf.apply(model)(ids).logits).all()
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla is not installed")
def test_with_fla_transformers_binds_its_kernels_and_apply_replaces_them():
    """fla installed: transformers' Qwen3-Next calls fla's Triton kernel (no CPU driver) and
    fails on the CPU; with apply the same model runs. In a fresh process: the test suite's Triton
    interpreter shim (tests/fla_interpreter.py) would otherwise let fla's kernels run."""
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WITH_FLA)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in {**os.environ, **env}.items() if k != "TRITON_INTERPRET"},
        timeout=600,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


WITHOUT_FLA = """
import json, sys
sys.modules["fla"] = None  # fla hidden: importing it fails, as where it is not installed
import torch
from tests.integrations import hf_models
assert not hf_models.fla_bound(), "transformers bound fla"
errors = {f"{family} {dtype}": hf_models.compare(family, dtype)
          for family in ("qwen3_next", "kimi_linear") for dtype in (torch.float32, torch.float64)}
print(json.dumps(errors))
"""


def test_without_fla_apply_equals_transformers_own_path():
    """fla hidden (a fresh process): transformers binds its fallbacks; apply still equals them."""
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WITHOUT_FLA)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, **env},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    for name, error in errors.items():
        tol = hf_models.TOLERANCE[torch.float64 if "float64" in name else torch.float32]
        assert max(error.values()) < tol, (name, error)


def test_import_linattn_imports_neither_transformers_nor_fla():
    code = (
        "import sys, linattn, linattn.ops, linattn.integrations\n"
        "import linattn.integrations.transformers\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'fla')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "[]"


def test_deepcopy_of_an_applied_model_runs_on_linattn_until_restored(monkeypatch):
    calls = counting(monkeypatch, hf.GATED_DELTA)
    model = copy.deepcopy(hf.apply(hf_models.build("qwen3_next")))
    ids = torch.randint(3, hf_models.VOCAB, (1, 5))
    with torch.no_grad():
        model(ids)
        assert calls["torch_chunk_gated_delta_rule"] == 1
        assert hf.restore(model) is model
        with hf_models.own_path("qwen3_next"):
            model(ids)
    assert calls["torch_chunk_gated_delta_rule"] == 1
    assert not any("forward" in vars(m) for m in model.modules())


def test_apply_keeps_accelerate_hooks(monkeypatch):
    """With accelerate's hooks (device_map, offloading) the hook stays and calls linattn."""
    accelerate_hooks = pytest.importorskip("accelerate.hooks")
    calls = counting(monkeypatch, hf.GATED_DELTA)
    model = hf_models.build("qwen3_next")
    seen = []

    class Hook(accelerate_hooks.ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            seen.append(type(module).__name__)
            return args, kwargs

    layer = model.model.layers[0].linear_attn
    accelerate_hooks.add_hook_to_module(layer, Hook())
    hf.apply(model)
    with torch.no_grad():
        model(torch.randint(3, hf_models.VOCAB, (1, 5)))
    assert seen == ["Qwen3NextGatedDeltaNet"] and calls["torch_chunk_gated_delta_rule"] == 1
    hf.restore(model)
    assert layer._old_forward.__func__ is type(layer).forward


@pytest.mark.parametrize("family", ["qwen3_next", "kimi_linear", "mamba2"])
def test_training_gradients_equal_transformers_own_path(family):
    """Training runs through linattn's chunk form: the loss's gradients equal theirs (float64)."""
    model = hf_models.build(family, torch.float64).train()
    ours = hf.apply(copy.deepcopy(model))
    ids = torch.randint(3, hf_models.VOCAB, (2, 19), generator=torch.Generator().manual_seed(0))
    with hf_models.float32_promoted():
        with hf_models.own_path(family):
            model(ids, labels=ids).loss.backward()
        ours(ids, labels=ids).loss.backward()
    theirs = dict(model.named_parameters())
    for name, p in ours.named_parameters():
        if theirs[name].grad is None:
            assert p.grad is None or not p.grad.any(), name
            continue
        assert hf_models.relative(p.grad, theirs[name].grad) < 1e-12, name
