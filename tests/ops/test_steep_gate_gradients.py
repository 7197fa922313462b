"""The gates' gradient in float32 with steep gates, for every rule, in both backends.

Each pair of tokens (i, j) of a chunk holds the gates between them in its decay, and its share of
the gradient belongs to those gates alone. Formed as G_i's share less G_j's and summed over the
chunk, the shares of pairs on both sides of a gate cancel only to float32's rounding, and an
undecayed pair (a run of zero gates: DeltaProduct's writes of one token, or g = 0 tokens) swamps
the dg of a steep gate, which is of the order of exp(g). The float32 recurrent form has no such
sum; every form must reach its accuracy, per gate.
"""

import pytest
import torch
import torch.nn.functional as F

import linattn.ops as L

RULES = [
    "linear_head",
    "linear_channel",
    "delta_head",
    "delta_channel",
    "delta_product_head",
    "delta_product_channel",
    "generalized_head",
    "generalized_channel",
    "comba",
    "rwkv7",
    "gated_deltanet2",
    "rwkv6",
]


def _case(rule: str, scale: float, seed: int, zeros: bool = False, T: int = 6):
    """(inputs in float64, the op as a function of them): gates scale * U(0.5, 1) per token (0
    on every other token with ``zeros``), unit keys, a random initial state."""
    gen = torch.Generator().manual_seed(seed)
    B, H, K, V = 1, 2, 8, 4

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def unif(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    def unit(*shape):
        return F.normalize(rand(*shape), dim=-1)

    def gate(per_channel: bool):
        g = scale * (0.5 + 0.5 * unif(B, T, H, *((K,) if per_channel else ())))
        if zeros:
            g[:, 1::2] = 0.0
        return g

    channel = rule.endswith("channel")
    if rule.startswith("delta_product"):
        n = 2
        x = dict(q=rand(B, T, H, K), k=unit(B, T * n, H, K), v=rand(B, T * n, H, V))
        x.update(beta=2 * unif(B, T * n, H), g=gate(channel))

        def op(a, **kw):
            args = (a["q"], a["k"], a["v"], a["beta"], a["g"])
            return L.gated_delta_product(*args, num_householder=n, initial_state=a["S0"], **kw)

    elif rule.startswith("delta"):
        x = dict(q=rand(B, T, H, K), k=unit(B, T, H, K), v=rand(B, T, H, V))
        x.update(beta=2 * unif(B, T, H), g=gate(channel))

        def op(a, **kw):
            args = (a["q"], a["k"], a["v"], a["beta"], a["g"])
            return L.delta_rule(*args, initial_state=a["S0"], **kw)

    elif rule.startswith("linear"):
        x = dict(q=rand(B, T, H, K), k=rand(B, T, H, K), v=rand(B, T, H, V), g=gate(channel))

        def op(a, **kw):
            args = (a["q"], a["k"], a["v"], a["g"])
            return L.linear_attention(*args, initial_state=a["S0"], **kw)

    elif rule.startswith("generalized"):
        x = dict(q=rand(B, T, H, K), k=unit(B, T, H, K), v=rand(B, T, H, V))
        x.update(a=-unit(B, T, H, K), b=unit(B, T, H, K), g=gate(channel))

        def op(a, **kw):
            args = (a["q"], a["k"], a["v"], a["a"], a["b"], a["g"])
            return L.generalized_delta_rule(*args, initial_state=a["S0"], **kw)

    elif rule == "comba":
        x = dict(q=rand(B, T, H, K), k=unit(B, T, H, K), v=rand(B, T, H, V))
        x.update(p=unit(B, T, H, K), beta=unif(B, T, H), g=gate(False))

        def op(a, **kw):
            args = (a["q"], a["k"], a["v"], a["p"], a["beta"], a["g"])
            return L.comba(*args, initial_state=a["S0"], **kw)

    elif rule == "rwkv7":
        x = dict(r=rand(B, T, H, K), g=gate(True), k=unit(B, T, H, K), v=rand(B, T, H, V))
        x.update(a=-unit(B, T, H, K), b=unit(B, T, H, K) * unif(B, T, H, 1))

        def op(a, **kw):
            args = (a["r"], a["g"], a["k"], a["v"], a["a"], a["b"])
            return L.rwkv7(*args, initial_state=a["S0"], **kw)

    elif rule == "gated_deltanet2":
        x = dict(q=rand(B, T, H, K), k=unit(B, T, H, K), v=rand(B, T, H, V), g=gate(True))
        x.update(b=unif(B, T, H, K), w=unif(B, T, H, V))

        def op(a, **kw):
            args = (a["q"], a["k"], a["v"], a["g"], a["b"], a["w"])
            return L.gated_deltanet2(*args, initial_state=a["S0"], **kw)

    else:
        assert rule == "rwkv6"
        x = dict(q=rand(B, T, H, K), k=rand(B, T, H, K), v=rand(B, T, H, V), g=gate(True))
        x["u"] = rand(H, K)

        def op(a, **kw):
            args = (a["q"], a["k"], a["v"], a["g"], a["u"])
            return L.rwkv6(*args, initial_state=a["S0"], **kw)

    x["S0"] = rand(B, H, K, V)
    return x, op


def _gate_gradient(x, op, dtype, mode: str, chunk_size: int = 4) -> torch.Tensor:
    """dg of a fixed weighting of the outputs, in float64."""
    xs = {name: t.to(dtype).clone().requires_grad_() for name, t in x.items()}
    kw = {"mode": mode} | ({"chunk_size": chunk_size} if mode == "chunk" else {})
    o, _ = op(xs, **kw)
    weights = torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape)
    (o.double() * weights).sum().backward()
    return xs["g"].grad.double()


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


@pytest.fixture(params=["fused", "pytorch"])
def backend(request, monkeypatch):
    """The fused C++ kernels (where they apply) or the PyTorch loop (``LINATTN_NATIVE=0``)."""
    if request.param == "pytorch":
        monkeypatch.setenv("LINATTN_NATIVE", "0")
    return request.param


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("scale", [-1.0, -5.0, -20.0, -30.0])  # -1: one factored block
def test_steep_gate_gradient_matches_float64(rule, scale, backend):
    # Bound: the float32 recurrent form's own error here is 1e-7 to 1.2e-6; before the gates'
    # shares were summed pair by pair, DeltaProduct's chunk and parallel forms and every
    # per-channel parallel form were off by 1e-2 to 1e2.
    for seed in range(2):
        x, op = _case(rule, scale, seed)
        want = _gate_gradient(x, op, torch.float64, "recurrent")
        for mode, chunk_size in (("chunk", 4), ("chunk", 64), ("parallel", 0)):
            got = _gate_gradient(x, op, torch.float32, mode, chunk_size)
            assert _relative(got, want) < 5e-6, (mode, chunk_size, seed)


@pytest.mark.parametrize("rule", RULES)
def test_gate_gradient_with_zero_gates_between_steep_ones(rule, backend):
    # g = 0 on every other token: undecayed pairs beside steep gates in every rule. The steep
    # gates' dg (of order exp(-20)) is compared alone, so that the zero gates' larger dg (the
    # undecayed pairs are theirs) cannot hide its error.
    x, op = _case(rule, -30.0, 0, zeros=True)
    want = _gate_gradient(x, op, torch.float64, "recurrent")[:, ::2]
    for mode, chunk_size in (("chunk", 4), ("parallel", 0)):
        got = _gate_gradient(x, op, torch.float32, mode, chunk_size)[:, ::2]
        assert _relative(got, want) < 5e-6, mode


@pytest.mark.parametrize("mode", ["chunk", "parallel"])
def test_delta_product_steep_gate_gradient_repro(mode, backend):
    # The report's case: B, T, H, K, V, n_h = 1, 4, 2, 32, 4, 2, unit keys, beta in [0, 2),
    # g = -20 (0.5 + 0.5 U) per head, a random initial state, o.sum() backward.
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V, n = 1, 4, 2, 32, 4, 2
    x = {
        "q": torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
        "k": F.normalize(torch.randn(B, T * n, H, K, generator=gen, dtype=torch.float64), dim=-1),
        "v": torch.randn(B, T * n, H, V, generator=gen, dtype=torch.float64),
        "beta": 2 * torch.rand(B, T * n, H, generator=gen, dtype=torch.float64),
        "g": -20 * (0.5 + 0.5 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)),
        "S0": torch.randn(B, H, K, V, generator=gen, dtype=torch.float64),
    }

    def dg(dtype, form):
        xs = {name: t.to(dtype).clone().requires_grad_() for name, t in x.items()}
        args = (xs["q"], xs["k"], xs["v"], xs["beta"], xs["g"])
        o, _ = L.gated_delta_product(*args, num_householder=n, mode=form, initial_state=xs["S0"])
        o.sum().backward()
        return xs["g"].grad.double()

    assert _relative(dg(torch.float32, mode), dg(torch.float64, "recurrent")) < 1e-6


def _two_tokens(scale: float, seed: int):
    """GDN-2 at B, T, H, K, V = 1, 2, 1, 1, 2: gates scale * U(0.5, 1), a random state."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def unif(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    x = dict(q=rand(1, 2, 1, 1), k=F.normalize(rand(1, 2, 1, 1), dim=-1))
    x.update(v=rand(1, 2, 1, 2), g=scale * (0.5 + 0.5 * unif(1, 2, 1, 1)))
    x.update(b=unif(1, 2, 1, 1), w=unif(1, 2, 1, 2), S0=rand(1, 1, 1, 2))

    def op(a, **kw):
        args = (a["q"], a["k"], a["v"], a["g"], a["b"], a["w"])
        return L.gated_deltanet2(*args, initial_state=a["S0"], **kw)

    return x, op


@pytest.mark.parametrize("mode", ["parallel", "chunk"])
def test_gated_deltanet2_two_tokens_one_channel(mode, backend):
    # T = 2, K = 1: one pair per chunk, and its share of dg is all of the first gate's decay
    # inside the chunk. As G_2's share less G_1's it was off by up to 6 (g ~ -20) in the
    # parallel form; summed over the pair alone, every form is at the recurrent form's accuracy
    # (its own float32 error here: up to 1e-5 at g ~ -30).
    for scale in (-1.0, -5.0, -20.0, -30.0):
        for seed in range(20):
            x, op = _two_tokens(scale, seed)
            want = _gate_gradient(x, op, torch.float64, "recurrent")
            got = _gate_gradient(x, op, torch.float32, mode, chunk_size=64)
            assert _relative(got, want) < 3e-5, (scale, seed)


@pytest.mark.parametrize("rule", RULES)
def test_gate_gradient_over_whole_factored_chunks(rule, backend):
    # Gates within the factor budget over 32-token chunks, zero on every other token: each
    # chunk's pairs in one factored block, taken in runs of rows (the fused kernels' products
    # with the rows before and after a run) as well as within them.
    x, op = _case(rule, -2.0, 0, zeros=True, T=40)
    want = _gate_gradient(x, op, torch.float64, "recurrent")
    got = _gate_gradient(x, op, torch.float32, "chunk", chunk_size=32)
    assert _relative(got, want) < 5e-6
