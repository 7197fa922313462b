"""How each registered mechanism is exercised: its inputs, its op's call and its float64 oracle.

A ``Case`` is what the tools need to run a mechanism without knowing it: ``linattn accuracy``,
``linattn bench`` and the registry's property tests call ``inputs``, then ``call`` in a form, and
compare with ``oracle``. Every tensor is in the public layout [B, T, H, D]; the inputs are drawn
as a model would feed them (unit keys, write strengths in [0, 2], log-decays near 0 from a
sigmoid), so that the transitions stay bounded at any T.

    inputs(B, T, H, K, V, seed, dtype) -> dict      the op's tensors, "S0" an initial state
    call(x, mode, chunk_size, scale) -> (o, S)      the public op in that form
    oracle(x, scale) -> (o, S)                      float64, head by head, from the reference
    cost, rows_per_token                            the section-9 cost family of ``linattn bench``
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

Inputs = dict[str, Tensor]


@dataclass(frozen=True)
class Case:
    """The inputs, call and oracle of one mechanism (the module docstring)."""

    inputs: Callable[..., Inputs]
    call: Callable[[Inputs, str, int, float], tuple[Tensor, Tensor | None]]
    oracle: Callable[[Inputs, float], tuple[Tensor, Tensor]]
    cost: str  # "softmax", "linear", "delta" or "dplr"
    rows_per_token: int = 1  # write rows per token (DeltaProduct's n_h)


def _draw(gen: torch.Generator, dtype: torch.dtype):
    def normal(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    def uniform(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=gen, dtype=torch.float64).to(dtype)

    def unit(*shape: int) -> Tensor:
        return F.normalize(normal(*shape).double(), dim=-1).to(dtype)

    def log_decay(*shape: int) -> Tensor:  # alpha = sigmoid(N(2, 1)): about 0.6 to 0.99
        return F.logsigmoid(normal(*shape).double() + 2.0).to(dtype)

    return normal, uniform, unit, log_decay


def _gate(log_decay, gate: str, B: int, T: int, H: int, K: int) -> Tensor | None:
    return {"none": None, "head": log_decay(B, T, H), "channel": log_decay(B, T, H, K)}[gate]


def _qkv(gen, dtype, B, T, H, K, V) -> Inputs:
    normal, _, unit, _ = _draw(gen, dtype)
    return {"q": normal(B, T, H, K), "k": unit(B, T, H, K), "v": normal(B, T, H, V),
            "S0": normal(B, H, K, V)}  # fmt: skip


def _heads(x: Tensor | None, h: int, n: int | None = None) -> np.ndarray | None:
    """Head h of batch row n (default 0) of a [B, T, H, ...] tensor as float64 NumPy."""
    return None if x is None else x[n or 0, :, h].double().numpy()


def _per_head(oracle_of_head, x: Inputs, B: int, H: int) -> tuple[Tensor, Tensor]:
    """Stack ``oracle_of_head(n, h) -> (O [T, V], S [K, V])`` into [B, T, H, V], [B, H, K, V]."""
    outs, states = [], []
    for n in range(B):
        pairs = [oracle_of_head(n, h) for h in range(H)]
        outs.append(np.stack([o for o, _ in pairs], axis=1))
        states.append(np.stack([S for _, S in pairs]))
    return torch.from_numpy(np.stack(outs)), torch.from_numpy(np.stack(states))


def _state(x: Inputs, n: int, h: int) -> np.ndarray:
    return x["S0"][n, h].double().numpy()


def _common(mode: str, chunk_size: int, scale: float, x: Inputs) -> dict:
    return dict(mode=mode, chunk_size=chunk_size, scale=scale, initial_state=x.get("S0"),
                output_final_state=True)  # fmt: skip


# --- the additive and delta rules: linattn.reference.gated.recurrence ----------------------------


def additive_case(gate: str) -> Case:
    from linattn.ops import linear_attention
    from linattn.reference.gated import recurrence

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        x["g"] = _gate(_draw(gen, dtype)[3], gate, B, T, H, K)
        return x

    def call(x, mode, chunk_size, scale):
        return linear_attention(
            x["q"], x["k"], x["v"], x["g"], **_common(mode, chunk_size, scale, x)
        )

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        return _per_head(
            lambda n, h: recurrence(
                _heads(x["q"], h, n), _heads(x["k"], h, n), _heads(x["v"], h, n),
                g=_heads(x["g"], h, n), rule="additive", scale=scale,
                initial_state=_state(x, n, h),
            ),
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "linear")


def delta_case(gate: str) -> Case:
    from linattn.ops import delta_rule
    from linattn.reference.gated import recurrence

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        _, uniform, _, log_decay = _draw(gen, dtype)
        x["beta"] = 2 * uniform(B, T, H)
        x["g"] = _gate(log_decay, gate, B, T, H, K)
        return x

    def call(x, mode, chunk_size, scale):
        kw = _common(mode, chunk_size, scale, x)
        return delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], **kw)

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        return _per_head(
            lambda n, h: recurrence(
                _heads(x["q"], h, n), _heads(x["k"], h, n), _heads(x["v"], h, n),
                _heads(x["beta"], h, n), _heads(x["g"], h, n), rule="delta", scale=scale,
                initial_state=_state(x, n, h),
            ),
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "delta")


def delta_product_case(num_householder: int = 2) -> Case:
    from linattn.ops import gated_delta_product
    from linattn.reference.gated import delta_product

    n_h = num_householder

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, uniform, unit, log_decay = _draw(gen, dtype)
        return {"q": normal(B, T, H, K), "k": unit(B, T * n_h, H, K),
                "v": normal(B, T * n_h, H, V), "beta": 2 * uniform(B, T * n_h, H),
                "g": log_decay(B, T, H), "S0": normal(B, H, K, V)}  # fmt: skip

    def call(x, mode, chunk_size, scale):
        kw = _common(mode, chunk_size, scale, x)
        return gated_delta_product(
            x["q"], x["k"], x["v"], x["beta"], x["g"], num_householder=n_h, **kw
        )

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        return _per_head(
            lambda n, h: delta_product(
                _heads(x["q"], h, n), _heads(x["k"], h, n), _heads(x["v"], h, n),
                _heads(x["beta"], h, n), _heads(x["g"], h, n), num_householder=n_h,
                scale=scale, initial_state=_state(x, n, h),
            ),
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "delta", rows_per_token=n_h)


# --- the generalized delta rule: linattn.reference.dplr.recurrence -----------------------------


def _dplr_oracle(x: Inputs, scale: float, parts) -> tuple[Tensor, Tensor]:
    """The dplr recurrence of every head, ``parts(n, h) -> (q, k, v, a, b, g)`` in its names."""
    from linattn.reference.dplr import recurrence

    B, H = x["S0"].shape[:2]
    return _per_head(
        lambda n, h: recurrence(*parts(n, h), scale=scale, initial_state=_state(x, n, h)),
        x, B, H,
    )  # fmt: skip


def dplr_case(gate: str) -> Case:
    from linattn.ops import generalized_delta_rule

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        _, uniform, unit, log_decay = _draw(gen, dtype)
        b = unit(B, T, H, K)
        # a = -beta b, beta in [0, 1]: I + a b^T contracts (the delta rule's transition, beta
        # there), so the state stays bounded at any T.
        x["a"] = (-uniform(B, T, H, 1) * b.double()).to(dtype)
        x["b"], x["g"] = b, _gate(log_decay, gate, B, T, H, K)
        return x

    def call(x, mode, chunk_size, scale):
        kw = _common(mode, chunk_size, scale, x)
        return generalized_delta_rule(x["q"], x["k"], x["v"], x["a"], x["b"], x["g"], **kw)

    def oracle(x, scale):
        return _dplr_oracle(x, scale, lambda n, h: tuple(
            _heads(x[name], h, n) for name in ("q", "k", "v", "a", "b", "g")
        ))  # fmt: skip

    return Case(inputs, call, oracle, "dplr")


def comba_case() -> Case:
    from linattn.ops import comba

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        _, uniform, unit, log_decay = _draw(gen, dtype)
        x["p"], x["beta"], x["g"] = unit(B, T, H, K), uniform(B, T, H), log_decay(B, T, H)
        return x

    def call(x, mode, chunk_size, scale):
        kw = _common(mode, chunk_size, scale, x)
        return comba(x["q"], x["k"], x["v"], x["p"], x["beta"], x["g"], **kw)

    def oracle(x, scale):
        def parts(n, h):  # a = -beta k, b = p, the write beta v (``linattn.ops.comba``)
            beta = _heads(x["beta"], h, n)[:, None]
            k = _heads(x["k"], h, n)
            v, p, g = (_heads(x[name], h, n) for name in ("v", "p", "g"))
            return _heads(x["q"], h, n), k, beta * v, -beta * k, p, g

        return _dplr_oracle(x, scale, parts)

    return Case(inputs, call, oracle, "dplr")


def rwkv7_case() -> Case:
    from linattn.ops import rwkv7

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        _, uniform, unit, log_decay = _draw(gen, dtype)
        kappa = unit(B, T, H, K).double()  # RWKV-7: a = -kappa, b = kappa * (a gate in [0, 1])
        x["r"] = x.pop("q")
        x["w"] = log_decay(B, T, H, K)
        x["a"], x["b"] = (-kappa).to(dtype), (kappa * uniform(B, T, H, K).double()).to(dtype)
        return x

    def call(x, mode, chunk_size, scale):
        kw = _common(mode, chunk_size, scale, x)
        return rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"], **kw)

    def oracle(x, scale):  # RWKV-7's a reads, its b is written along: dplr's b and a
        return _dplr_oracle(x, scale, lambda n, h: tuple(
            _heads(x[name], h, n) for name in ("r", "k", "v", "b", "a", "w")
        ))  # fmt: skip

    return Case(inputs, call, oracle, "dplr")


def gdn2_case() -> Case:
    from linattn.ops import gated_deltanet2

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        _, uniform, _, log_decay = _draw(gen, dtype)
        x["g"], x["b"], x["w"] = log_decay(B, T, H, K), uniform(B, T, H, K), uniform(B, T, H, V)
        return x

    def call(x, mode, chunk_size, scale):
        kw = _common(mode, chunk_size, scale, x)
        return gated_deltanet2(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"], **kw)

    def oracle(x, scale):
        def parts(n, h):  # a = -k, b = exp(g) * b * k, the write w * v (``gated_deltanet2``)
            q, k, v, g, b, w = (_heads(x[name], h, n) for name in ("q", "k", "v", "g", "b", "w"))
            return q, k, w * v, -k, np.exp(g) * b * k, g

        return _dplr_oracle(x, scale, parts)

    return Case(inputs, call, oracle, "dplr")


# --- RWKV-6 and softmax attention ------------------------------------------------------------


def rwkv6_case() -> Case:
    from linattn.ops import rwkv6
    from linattn.reference.rwkv6 import recurrence

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        normal, _, _, log_decay = _draw(gen, dtype)
        x["g"], x["u"] = log_decay(B, T, H, K), normal(H, K)
        return x

    def call(x, mode, chunk_size, scale):
        kw = _common(mode, chunk_size, scale, x)
        return rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], **kw)

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        return _per_head(
            lambda n, h: recurrence(
                *(_heads(x[name], h, n) for name in ("q", "k", "v", "g")),
                x["u"][h].double().numpy(), scale=scale, initial_state=_state(x, n, h),
            ),
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "linear")


def softmax_case() -> Case:
    from linattn.ops import softmax_attention

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal = _draw(gen, dtype)[0]
        return {"q": normal(B, T, H, K), "k": normal(B, T, H, K), "v": normal(B, T, H, V)}

    def call(x, mode, chunk_size, scale):
        return softmax_attention(x["q"], x["k"], x["v"], scale=scale), None

    def oracle(x, scale):
        # The reference scales by 1 / sqrt(d): q is rescaled so that its product is scale q.k.
        from linattn.reference.softmax import softmax_attention as reference

        B, _, H, K = x["q"].shape
        factor = scale * K**0.5
        outs = [
            np.stack([reference(factor * _heads(x["q"], h, n), _heads(x["k"], h, n),
                                _heads(x["v"], h, n), causal=True)[0] for h in range(H)], axis=1)
            for n in range(B)
        ]  # fmt: skip
        return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)

    return Case(inputs, call, oracle, "softmax")


# --- any registered rule: linattn.testing's inputs and oracle ----------------------------------


def rule_case(rule: str, gate: str = "none") -> Case:
    """The case of a registered rule (a user's, say) with the gate ``gate``: inputs drawn in the
    ranges it declares (``linattn.testing.make_inputs``), ``rule_attention``, and the rule's own
    step in float64 as the oracle (``linattn.testing.oracle``)."""
    from linattn import testing
    from linattn.ops import rule_attention, rules

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        x = testing.make_inputs(rules.named(rule), B, T, H, K, V, gate, seed)
        return {n: (None if t is None else t.to(dtype)) for n, t in x.items()}

    def call(x, mode, chunk_size, scale):
        own = {spec.name: x[spec.name] for spec in rules.named(rule).INPUTS}
        return rule_attention(rule, x["q"], x["k"], x["v"], x["g"], **own,
                              **_common(mode, chunk_size, scale, x))  # fmt: skip

    def oracle(x, scale):
        found = rules.named(rule)
        x64 = {n: (None if t is None else t.double()) for n, t in x.items()}
        return testing.oracle(found, x64, scale)

    return Case(inputs, call, oracle, "delta" if rules.named(rule).READS_STATE else "linear")


# --- issue 52: forgetting attention (FoX) and stick-breaking attention -------------------------


def forgetting_case() -> Case:
    """FoX: q, k, v normal, g the log forget gates logsigmoid(N(2, 1)) per head; the oracle is
    ``linattn.reference.forgetting``'s query-by-query loop."""
    from linattn.ops.softmax_variants import forgetting_attention
    from linattn.reference.forgetting import forgetting_attention as reference

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, _, _, log_decay = _draw(gen, dtype)
        return {"q": normal(B, T, H, K), "k": normal(B, T, H, K), "v": normal(B, T, H, V),
                "g": log_decay(B, T, H)}  # fmt: skip

    def call(x, mode, chunk_size, scale):
        o = forgetting_attention(x["q"], x["k"], x["v"], x["g"], scale=scale, mode=mode,
                                 chunk_size=chunk_size)  # fmt: skip
        return o, None

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        outs = [
            np.stack([reference(*(_heads(x[n], h, b) for n in ("q", "k", "v", "g")), scale=scale)
                      for h in range(H)], axis=1)
            for b in range(B)
        ]  # fmt: skip
        return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)

    return Case(inputs, call, oracle, "softmax")


def stickbreaking_case() -> Case:
    """Stick-breaking attention: q, k, v normal; the oracle is
    ``linattn.reference.stickbreaking``'s walk back from each query (o only: the case's state
    slot stays empty; rem is pinned by tests/ops/test_softmax_variants.py)."""
    from linattn.ops.softmax_variants import stickbreaking_attention
    from linattn.reference.stickbreaking import stickbreaking_attention as reference

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal = _draw(gen, dtype)[0]
        return {"q": normal(B, T, H, K), "k": normal(B, T, H, K), "v": normal(B, T, H, V)}

    def call(x, mode, chunk_size, scale):
        o, _ = stickbreaking_attention(x["q"], x["k"], x["v"], scale=scale, mode=mode,
                                       chunk_size=chunk_size)  # fmt: skip
        return o, None

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        outs = [
            np.stack([reference(*(_heads(x[n], h, b) for n in ("q", "k", "v")), scale=scale)[0]
                      for h in range(H)], axis=1)
            for b in range(B)
        ]  # fmt: skip
        return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)

    return Case(inputs, call, oracle, "softmax")


def parallax_case() -> Case:
    """Parallax: q, r, k, v normal; the oracle is ``linattn.reference.parallax``'s loop."""
    from linattn.ops.softmax_variants import parallax_attention
    from linattn.reference.parallax import parallax

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal = _draw(gen, dtype)[0]
        return {"q": normal(B, T, H, K), "r": normal(B, T, H, K), "k": normal(B, T, H, K),
                "v": normal(B, T, H, V)}  # fmt: skip

    def call(x, mode, chunk_size, scale):
        return parallax_attention(x["q"], x["r"], x["k"], x["v"], scale=scale), None

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        outs = [
            np.stack([parallax(*(_heads(x[n], h, b) for n in ("q", "r", "k", "v")), scale=scale)
                      for h in range(H)], axis=1)
            for b in range(B)
        ]  # fmt: skip
        return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)

    return Case(inputs, call, oracle, "softmax")


def wall_case() -> Case:
    """Wall attention: q, k, v normal, g per-channel log-decays logsigmoid(N(2, 1)), a scalar
    gate likewise; the oracle is ``linattn.reference.wall``'s loop."""
    from linattn.ops.softmax_variants import wall_attention
    from linattn.reference.wall import wall_attention as reference

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, _, _, log_decay = _draw(gen, dtype)
        return {"q": normal(B, T, H, K), "k": normal(B, T, H, K), "v": normal(B, T, H, V),
                "g": log_decay(B, T, H, K), "gs": log_decay(B, T, H)}  # fmt: skip

    def call(x, mode, chunk_size, scale):
        return wall_attention(x["q"], x["k"], x["v"], x["g"], g_scalar=x["gs"], scale=scale), None

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        outs = [
            np.stack([reference(*(_heads(x[n], h, b) for n in ("q", "k", "v", "g", "gs")),
                                scale=scale) for h in range(H)], axis=1)
            for b in range(B)
        ]  # fmt: skip
        return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)

    return Case(inputs, call, oracle, "softmax")


def nsa_case() -> Case:
    """Native sparse attention with one query head per key head, blocks of 4 tokens, 3 blocks
    kept, a window of 5 and gates in (0, 1); the oracle is ``linattn.reference.nsa``'s loop."""
    from linattn.ops.nsa import native_sparse_attention
    from linattn.reference.nsa import native_sparse_attention as reference

    options = {"block_counts": 3, "block_size": 4, "window_size": 5}
    gates = ("g_cmp", "g_slc", "g_swa")

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, uniform, _, _ = _draw(gen, dtype)
        x = {"q": normal(B, T, H, K), "k": normal(B, T, H, K), "v": normal(B, T, H, V)}
        return {**x, **{g: uniform(B, T, H) for g in gates}}

    def call(x, mode, chunk_size, scale):
        o = native_sparse_attention(x["q"], x["k"], x["v"], *(x[g] for g in gates), scale=scale,
                                    **options)  # fmt: skip
        return o, None

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape

        def head(b, h):
            q = _heads(x["q"], h, b)[:, None]
            g = [_heads(x[name], h, b)[:, None] for name in gates]
            return reference(q, _heads(x["k"], h, b), _heads(x["v"], h, b), *g, scale=scale,
                             **options)[:, 0]  # fmt: skip

        outs = [np.stack([head(b, h) for h in range(H)], axis=1) for b in range(B)]
        return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)

    return Case(inputs, call, oracle, "softmax")


def moba_case() -> Case:
    """MoBA with blocks of 4 tokens and 3 blocks a query (its own and 2 earlier ones); the
    oracle is ``linattn.reference.moba``'s loop. Its scale is always 1 / sqrt(K) (fla's)."""
    from linattn.ops.moba import mixture_of_block_attention
    from linattn.reference.moba import mixture_of_block_attention as reference

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal = _draw(gen, dtype)[0]
        return {"q": normal(B, T, H, K), "k": normal(B, T, H, K), "v": normal(B, T, H, V)}

    def call(x, mode, chunk_size, scale):
        o = mixture_of_block_attention(x["q"], x["k"], x["v"], chunk_size=4, topk=3)
        return o, None

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        outs = [
            np.stack([reference(*(_heads(x[n], h, b) for n in ("q", "k", "v")), 4, 3)
                      for h in range(H)], axis=1)
            for b in range(B)
        ]  # fmt: skip
        return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)

    return Case(inputs, call, oracle, "softmax")
