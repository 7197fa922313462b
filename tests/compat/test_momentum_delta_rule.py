"""compat.chunk_momentum_delta_rule / fused_recurrent_momentum_delta_rule vs fla 0.6.0.
fla computes both with PyTorch reference code (its l2norm a Triton kernel, under the
interpreter here): the recurrent path in float64 (its float32 casts promoted) agrees to 1e-12;
fla's chunk path takes log(beta + 1e-6) where the recurrence has beta, so it is compared at the
1e-5 that eps makes (float64 and float32, gradients included). T = 1, T not a multiple of the
chunk, initial states; fla refuses cu_seqlens, so packed sequences are checked against fla's
recurrent path run sequence by sequence.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tests.fla_interpreter")
naive_module = pytest.importorskip("fla.ops.momentum_delta_rule.naive")
chunk_module = pytest.importorskip("fla.ops.momentum_delta_rule.chunk")
recurrent_module = pytest.importorskip("fla.ops.momentum_delta_rule.fused_recurrent")

from linattn import compat  # noqa: E402

from .helpers import Promoted, assert_same, outputs_and_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def inputs(T=20, H=2, K=16, V=8, N=1, dtype=torch.float64, seed=0):
    """fla's layer's ranges: log_alpha, log_mu = logsigmoid, beta ~ U(0, 1), eta ~ U(0, 2)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(1, T, H, K), "k": randn(1, T, H, K), "v": randn(1, T, H, V),
        "log_alpha": F.logsigmoid(randn(1, T, H) + 2), "log_mu": F.logsigmoid(randn(1, T, H)),
        "p": randn(1, T, H, K), "beta": rand(1, T, H), "eta": 2 * rand(1, T, H),
        "initial_state": randn(2, N, H, K, V),
    }  # fmt: skip
    return {name: t.to(dtype) for name, t in x.items()}


@pytest.fixture
def promoted(monkeypatch):
    monkeypatch.setattr(naive_module, "torch", Promoted())


@pytest.mark.parametrize("T", [1, 23])
@pytest.mark.parametrize("use_p_times_alpha", [True, False])
def test_recurrent_agrees_with_fla_in_float64(promoted, T, use_p_times_alpha):
    """fla's l2norm kernel normalises in float32: q, k, p come normalised, and the in-kernel
    normalisation is compared at float32's 1e-6."""
    x = inputs(T=T)
    for name in ("q", "k", "p"):
        x[name] = F.normalize(x[name], dim=-1)
    for l2norm, tol in ((False, 1e-12), (True, 1e-6)):
        kw = {
            "output_final_state": True, "use_p_times_alpha": use_p_times_alpha,
            "use_qk_l2norm_in_kernel": l2norm,
        }  # fmt: skip
        want = recurrent_module.fused_recurrent_momentum_delta_rule(**x, **kw)
        for entry in (compat.fused_recurrent_momentum_delta_rule, compat.chunk_momentum_delta_rule):
            assert_same(list(entry(**x, **kw)), list(want), tol, entry.__name__)


def test_defaults_p_beta_eta_and_no_l2norm(promoted):
    x = inputs(T=9)
    x = {n: x[n] for n in ("q", "k", "v", "log_alpha", "log_mu")}
    kw = {"use_qk_l2norm_in_kernel": False, "output_final_state": True}
    want = recurrent_module.fused_recurrent_momentum_delta_rule(**x, **kw)
    got = compat.chunk_momentum_delta_rule(**x, **kw, chunk_size=16)
    assert_same(list(got), list(want), 1e-12, "defaults")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunk_agrees_with_fla_chunk_path_with_gradients(promoted, dtype):
    """fla's chunk path asserts q is not float32: it runs in float64 (promoted), ours in dtype."""
    x = inputs(T=23)
    a, da = outputs_and_grads(
        lambda **t: compat.chunk_momentum_delta_rule(
            **{n: u.to(dtype) for n, u in t.items()}, output_final_state=True, chunk_size=16
        ),
        x,
    )
    b, db = outputs_and_grads(
        lambda **t: chunk_module.chunk_momentum_delta_rule(
            **t, output_final_state=True, chunk_size=16
        ),
        x,
    )
    assert_same(a, b, 2e-5, "chunk_momentum_delta_rule")
    for name in x:
        assert_same([da[name]], [db[name]], 2e-5, f"chunk_momentum_delta_rule d{name}")


def test_packed_sequences_equal_the_sequences_run_alone(promoted):
    cu = [0, 1, 9, 23]
    x = inputs(T=23, N=3)
    o, S = compat.chunk_momentum_delta_rule(
        **x, output_final_state=True, cu_seqlens=torch.tensor(cu), chunk_size=16,
        use_qk_l2norm_in_kernel=False,
    )  # fmt: skip
    for n in range(3):
        s, e = cu[n], cu[n + 1]
        part = {name: t[:, s:e] for name, t in x.items() if name != "initial_state"}
        o_n, S_n = recurrent_module.fused_recurrent_momentum_delta_rule(
            **part, initial_state=x["initial_state"][:, n : n + 1], output_final_state=True,
            use_qk_l2norm_in_kernel=False,
        )  # fmt: skip
        assert_same([o[:, s:e], S[:, n : n + 1]], [o_n, S_n], 1e-12, f"sequence {n}")


def test_bad_input_is_named():
    x = inputs(T=5)
    with pytest.raises(ValueError, match="chunk_size. must be 16, 32, or 64"):
        compat.chunk_momentum_delta_rule(**x, chunk_size=8)
    with pytest.raises(ValueError, match="initial_state must have 5 dimensions"):
        compat.chunk_momentum_delta_rule(**{**x, "initial_state": x["initial_state"][0]})
    with pytest.raises(ValueError, match="log_mu is a log-decay"):
        compat.fused_recurrent_momentum_delta_rule(**{**x, "log_mu": -x["log_mu"]})
    with pytest.raises(ValueError, match=r"eta must have shape \[B, T, H\]"):
        compat.fused_recurrent_momentum_delta_rule(**{**x, "eta": x["eta"][..., None]})
