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
    # What ``benchmarks/families.py`` feeds the entry's nearest mechanism. ``nearest_dims(K, V)``:
    # the (K, V) at which the nearest does this case's work at (K, V), where the family's kernel
    # works at another width (a feature map's: Based's 1 + K + K^2); None: the same.
    # ``as_nearest``: the call is the nearest's op on the nearest's own inputs, only the gate's
    # values the family's (a constant decay per head), held to the reparametrisation line.
    nearest_dims: Callable[[int, int], tuple[int, int]] | None = None
    as_nearest: bool = False


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


def _outputs_per_head(x: Inputs, names: tuple[str, ...], head_output) -> tuple[Tensor, Tensor]:
    """An oracle without a state (a softmax variant, whose state is its cache): the float64
    output ``head_output(*(head h of each of x[names]))`` [T, V] of every batch row and head,
    stacked into [B, T, H, V], and an empty state."""
    B, _, H, _ = x["q"].shape
    outs = [
        np.stack([head_output(*(_heads(x[n], h, b) for n in names)) for h in range(H)], axis=1)
        for b in range(B)
    ]
    return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)


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


# --- memories of several parts: CyFA ----------------------------------------------
#
# A mechanism whose memory is several tensors (CyFA's key memory, value memory and clock) names
# its initial state's parts "S0_<part>" (each a tensor, so that every one gets a gradient), and
# its call and oracle return the final state as a tuple of tensors in the same order.


def state_parts(x: Inputs) -> tuple[Tensor, ...] | None:
    """The initial state's parts ``x["S0_<part>"]`` in their order, or None when absent."""
    parts = tuple(t for name, t in x.items() if name.startswith("S0_"))
    return None if not parts or any(t is None for t in parts) else parts


def cyfa_case(num_slots: int = 6) -> Case:
    from linattn.ops.cyfa import cyfa
    from linattn.reference.cyfa import cyfa as reference

    M = num_slots

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        normal, uniform, _, log_decay = _draw(gen, dtype)
        del x["S0"]
        x["g"], x["delta"], x["beta"] = log_decay(B, T, H), uniform(B, T, H), uniform(B, T, H)
        eye = torch.eye(M - 1, dtype=torch.float64).expand(H, M - 1, M - 1)
        x["readout"] = (eye + 0.3 * normal(H, M - 1, M - 1).double()).to(dtype)
        x["q_norm_weight"] = (0.5 + uniform(K).double()).to(dtype)
        x["k_norm_weight"] = (0.5 + uniform(K).double()).to(dtype)
        x["S0_k"], x["S0_v"] = normal(B, H, K, M), normal(B, H, M, V)
        x["S0_lambda"] = (3 * uniform(B, H).double()).to(dtype)
        return x

    def call(x, mode, chunk_size, scale):
        names = ("q", "k", "v", "g", "delta", "beta", "readout", "q_norm_weight", "k_norm_weight")
        return cyfa(*(x[n] for n in names), scale=scale, mode=mode, chunk_size=chunk_size,
                    initial_state=state_parts(x), output_final_state=True)  # fmt: skip

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        S0 = state_parts(x)
        outs, parts = [], [[], [], []]
        for n in range(B):
            heads = []
            for h in range(H):
                o, S = reference(
                    *(_heads(x[name], h, n) for name in ("q", "k", "v", "g", "delta", "beta")),
                    x["readout"][h].double().numpy(), x["q_norm_weight"].double().numpy(),
                    x["k_norm_weight"].double().numpy(), 1e-5, 1e-5, scale,
                    None if S0 is None else tuple(s[n, h].double().numpy() for s in S0),
                )  # fmt: skip
                heads.append(o)
                for i, s in enumerate(S):
                    parts[i].append(np.asarray(s))
            outs.append(np.stack(heads, axis=1))
        state = tuple(torch.from_numpy(np.stack(p).reshape(B, H, *np.shape(p[0]))) for p in parts)
        return torch.from_numpy(np.stack(outs)), state

    return Case(inputs, call, oracle, "linear", rows_per_token=2)


# --- test-time training: TTT-Linear --------------------------------------------------
#
# TTT's mini-batch is part of the method (one gradient step per b tokens), not a tiling: its case
# fixes b and its call ignores the tools' chunk size. Its model maps keys to values of the same
# width (the target v - k), so the case draws V = K whatever V it is asked for.


def ttt_case(mini_batch_size: int = 4) -> Case:
    from linattn.ops.ttt import ttt_linear
    from linattn.reference.ttt import ttt_linear as reference

    size = mini_batch_size

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, uniform, unit, _ = _draw(gen, dtype)
        x = {"q": normal(B, T, H, K), "k": unit(B, T, H, K), "v": normal(B, T, H, K)}
        x["w"] = (1 + 0.3 * normal(H, K).double()).to(dtype)
        x["b"] = (0.1 * normal(H, K).double()).to(dtype)
        x["eta"] = (0.3 * uniform(B, T, H, 1).double()).to(dtype)
        x["S0_W"] = (0.3 * normal(B, H, K, K).double()).to(dtype)
        x["S0_h"] = (0.3 * normal(B, H, 1, K).double()).to(dtype)
        return x

    def call(x, mode, chunk_size, scale):
        names = ("q", "k", "v", "w", "b", "eta")
        return ttt_linear(*(x[n] for n in names), scale=scale, mini_batch_size=size, mode=mode,
                          initial_state=state_parts(x), output_final_state=True)  # fmt: skip

    def oracle(x, scale):
        B, _, H, K = x["q"].shape
        S0 = state_parts(x)
        outs, Ws, hs = [], [], []
        for n in range(B):
            heads = []
            for h in range(H):
                o, (W, bias) = reference(
                    *(_heads(x[name], h, n) for name in ("q", "k", "v")),
                    x["w"][h].double().numpy(), x["b"][h].double().numpy(),
                    _heads(x["eta"], h, n)[:, 0], scale, 1e-6, size,
                    None if S0 is None else (S0[0][n, h].double().numpy(),
                                             S0[1][n, h, 0].double().numpy()),
                )  # fmt: skip
                heads.append(o)
                Ws.append(W)
                hs.append(bias)
            outs.append(np.stack(heads, axis=1))
        W = torch.from_numpy(np.stack(Ws).reshape(B, H, K, K))
        bias = torch.from_numpy(np.stack(hs).reshape(B, H, 1, K))
        return torch.from_numpy(np.stack(outs)), (W, bias)

    return Case(inputs, call, oracle, "delta")


def titans_case(chunk_size: int = 4) -> Case:
    """Titans' linear memory, as TTT-Linear's case: its chunk (the tokens sharing a
    gradient point) fixed, V = K, the state (M, S) in two parts."""
    from linattn.ops.titans import titans_linear
    from linattn.reference.titans import titans_linear as reference

    size = chunk_size

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, uniform, unit, _ = _draw(gen, dtype)
        x = {"q": normal(B, T, H, K), "k": unit(B, T, H, K), "v": normal(B, T, H, K)}
        x["w"] = (1 + 0.3 * normal(H, K).double()).to(dtype)
        x["b"] = (0.1 * normal(H, K).double()).to(dtype)
        # fla's surprise carries a factor D (it is not the layer norm's gradient): learning rates
        # of a few 1e-2 already make the memory sensitive to rounding (float32 1e-5 at T = 70).
        x["theta"] = (0.01 * uniform(B, T, H, 1).double()).to(dtype)
        x["alpha"] = (0.2 * uniform(B, T, H, 1).double()).to(dtype)
        x["eta"] = (0.9 * uniform(B, T, H, 1).double()).to(dtype)
        x["S0_M"] = (0.3 * normal(B, H, K, K).double()).to(dtype)
        x["S0_S"] = (0.1 * normal(B, H, K, K).double()).to(dtype)
        return x

    def call(x, mode, chunk_size, scale):  # Titans' q is not scaled
        names = ("q", "k", "v", "w", "b", "theta", "alpha", "eta")
        return titans_linear(*(x[n] for n in names), chunk_size=size, mode=mode,
                             initial_state=state_parts(x), output_final_state=True)  # fmt: skip

    def oracle(x, scale):
        B, _, H, K = x["q"].shape
        S0 = state_parts(x)
        outs, Ms, Ss = [], [], []
        for n in range(B):
            heads = []
            for h in range(H):
                o, (M, S) = reference(
                    *(_heads(x[name], h, n) for name in ("q", "k", "v")),
                    x["w"][h].double().numpy(), x["b"][h].double().numpy(),
                    *(_heads(x[name], h, n)[:, 0] for name in ("theta", "alpha", "eta")),
                    1e-6, size,
                    None if S0 is None else tuple(s[n, h].double().numpy() for s in S0),
                )  # fmt: skip
                heads.append(o)
                Ms.append(M)
                Ss.append(S)
            outs.append(np.stack(heads, axis=1))
        state = tuple(torch.from_numpy(np.stack(p).reshape(B, H, K, K)) for p in (Ms, Ss))
        return torch.from_numpy(np.stack(outs)), state

    return Case(inputs, call, oracle, "delta")


# --- two passes over memory slots: linattn.reference.gsa / .abc ---------------------
# A family with two memories (S_k, S_v) keeps them as a pair: its "S0" is the pair of initial
# states and its call and oracle return the pair of final states (``cast`` converts a pair).


def cast(x: Tensor | tuple | None, dtype: torch.dtype) -> Tensor | tuple | None:
    """A case's input in ``dtype``: a tensor, None, or a pair of them (a two-state "S0")."""
    if isinstance(x, tuple):
        return tuple(cast(t, dtype) for t in x)
    return None if x is None else x.to(dtype)


def slots_case(gated: bool) -> Case:
    """Gated slot attention (``gated=True``: s = 1 - alpha and a log-decay g per slot, as the
    paper couples them) or ABC (slot logits s, no g), with m = K slots."""
    from linattn.ops.slots import abc_attention, gated_slot_attention
    from linattn.reference.abc import abc
    from linattn.reference.gsa import gated_slot_attention as gsa

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, _, unit, log_decay = _draw(gen, dtype)
        M = K
        x = {"q": normal(B, T, H, K), "k": unit(B, T, H, K), "v": normal(B, T, H, V)}
        if gated:
            x["g"] = log_decay(B, T, H, M)
            x["s"] = (1 - x["g"].double().exp()).to(dtype)
        else:
            x["s"] = normal(B, T, H, M)
        x["S0"] = (normal(B, H, K, M), normal(B, H, M, V))
        return x

    def call(x, mode, chunk_size, scale):
        S0 = x.get("S0")
        kw = dict(scale=scale, mode=mode, chunk_size=chunk_size, initial_state=S0,
                  output_final_state=True)  # fmt: skip
        if gated:
            return gated_slot_attention(x["q"], x["k"], x["v"], x["s"], x["g"], **kw)
        return abc_attention(x["q"], x["k"], x["v"], x["s"], **kw)

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        outs, Sks, Svs = [], [], []
        for n in range(B):
            per_head = []
            for h in range(H):
                args = [_heads(x[name], h, n) for name in ("q", "k", "v", "s")]
                S0 = tuple(S[n, h].double().numpy() for S in x["S0"])
                if gated:
                    per_head.append(gsa(*args, _heads(x["g"], h, n), scale=scale, initial_state=S0))
                else:
                    per_head.append(abc(*args, scale=scale, initial_state=S0))
            outs.append(np.stack([o for o, _ in per_head], axis=1))
            Sks.append(np.stack([S[0] for _, S in per_head]))
            Svs.append(np.stack([S[1] for _, S in per_head]))
        states = (torch.from_numpy(np.stack(Sks)), torch.from_numpy(np.stack(Svs)))
        return torch.from_numpy(np.stack(outs)), states

    return Case(inputs, call, oracle, "linear", rows_per_token=2)  # two passes a token


# --- reparametrisations of existing rules (retention, lightning attention, HGRN,
# HGRN2, LightNet, Based, ReBased) and RWKV-4 ----------------------------------------------------


def constant_decay_case(gamma: Callable[[int], np.ndarray]) -> Case:
    """Linear attention with one constant decay per head, ``gamma(H)`` [H] in (0, 1]
    (retention, lightning attention): ``linear_attention`` with g = log gamma."""
    from linattn.ops import linear_attention
    from linattn.reference.retention import constant_decay

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        return _qkv(torch.Generator().manual_seed(seed), dtype, B, T, H, K, V)

    def call(x, mode, chunk_size, scale):
        B, T, H, _ = x["q"].shape
        g = torch.from_numpy(np.log(gamma(H))).to(x["q"].dtype).expand(B, T, H)
        return linear_attention(x["q"], x["k"], x["v"], g, **_common(mode, chunk_size, scale, x))

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        decays = gamma(H)
        return _per_head(
            lambda n, h: constant_decay(
                _heads(x["q"], h, n), _heads(x["k"], h, n), _heads(x["v"], h, n), decays[h],
                scale=scale, initial_state=_state(x, n, h),
            ),
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "linear", as_nearest=True)


def hgrn_case() -> Case:
    """HGRN, h_t = exp(g_t) h_{t-1} + x_t per channel, on x (named v: the value written), g
    [B, T, H, V] (D = H V channels): ``linattn.compat.hgrn.hgrn`` (one scalar-decay head of
    K = V = 1 per channel)."""
    from linattn.compat.hgrn import hgrn
    from linattn.reference.hgrn import hgrn as reference

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, _, _, log_decay = _draw(gen, dtype)
        return {"v": normal(B, T, H, V), "g": log_decay(B, T, H, V), "S0": normal(B, H, V)}

    def call(x, mode, chunk_size, scale):
        B, T, H, V = x["v"].shape
        S0 = x.get("S0")
        o, S = hgrn(
            x["v"].flatten(2), x["g"].flatten(2), None if S0 is None else S0.flatten(1),
            output_final_state=True, mode=mode, chunk_size=chunk_size,
        )  # fmt: skip
        return o.view(B, T, H, V), S.view(B, H, V)

    def oracle(x, scale):
        B, T, H, V = x["v"].shape
        pairs = [
            reference(x["v"][n].flatten(1).double().numpy(), x["g"][n].flatten(1).double().numpy(),
                      initial_state=x["S0"][n].flatten().double().numpy())
            for n in range(B)
        ]  # fmt: skip
        o = torch.from_numpy(np.stack([o for o, _ in pairs])).view(B, T, H, V)
        return o, torch.from_numpy(np.stack([S for _, S in pairs])).view(B, H, V)

    return Case(inputs, call, oracle, "linear")


def hgrn2_case() -> Case:
    """HGRN2: GLA with keys 1 - f_t and log-decays log f_t (f the forget gate), on q, f, v."""
    from linattn.compat.hgrn import hgrn2_gate
    from linattn.ops import linear_attention
    from linattn.reference.hgrn import hgrn2

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, _, _, log_decay = _draw(gen, dtype)
        return {"q": normal(B, T, H, K), "f": log_decay(B, T, H, K).double().exp().to(dtype),
                "v": normal(B, T, H, V), "S0": normal(B, H, K, V)}  # fmt: skip

    def call(x, mode, chunk_size, scale):
        k, g = hgrn2_gate(x["f"])  # 1 - f and log f, in one pass each
        return linear_attention(x["q"], k, x["v"], g, **_common(mode, chunk_size, scale, x))

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        return _per_head(
            lambda n, h: hgrn2(
                _heads(x["q"], h, n), _heads(x["f"], h, n), _heads(x["v"], h, n), scale=scale,
                initial_state=_state(x, n, h),
            ),
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "linear")


def lightnet_case() -> Case:
    """LightNet: GLA with keys exp(k_t - z_t) and log-decays z_{t-1} - z_t, z_t the running
    log-sum-exp of the key logits k (``linattn.compat.lightnet.lightnet_gate``)."""
    from linattn.compat.lightnet import lightnet_gate
    from linattn.ops import linear_attention
    from linattn.reference.lightnet import lightnet

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        x = _qkv(torch.Generator().manual_seed(seed), dtype, B, T, H, K, V)
        x["k"] = (x["k"].double() * K**0.5).to(dtype)  # logits of a unit spread
        return x

    def call(x, mode, chunk_size, scale):
        key, g, _ = lightnet_gate(x["k"])
        return linear_attention(x["q"], key, x["v"], g, **_common(mode, chunk_size, scale, x))

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        return _per_head(
            lambda n, h: lightnet(
                _heads(x["q"], h, n), _heads(x["k"], h, n), _heads(x["v"], h, n), scale=scale,
                initial_state=_state(x, n, h),
            )[:2],
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "linear")


def kernel_case(name: str) -> Case:
    """Based (``name`` "based") or ReBased ("rebased"): normalised causal attention with a
    polynomial kernel of scale q^T k, as linear attention on its feature map (no state)."""
    from linattn import features
    from linattn.compat import based as based_module
    from linattn.compat import rebased as rebased_module
    from linattn.reference import based as reference

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        x = _qkv(torch.Generator().manual_seed(seed), dtype, B, T, H, K, V)
        del x["S0"]
        return x

    def call(x, mode, chunk_size, scale):
        q, k = x["q"], x["k"]
        eps = based_module.EPS if name == "based" else 1e-5
        if mode == "chunk":  # the kernel from the K-wide scores, the features only in the state
            coefficients = based_module.TAYLOR if name == "based" else rebased_module.SQUARE
            o, _ = based_module.polynomial_attention(q, k, x["v"], coefficients, scale, eps,
                                                     True, chunk_size)  # fmt: skip
            return o, None
        if name == "based":
            phi_q, phi_k = features.taylor_exp(q, scale), features.taylor_exp(k, scale)
        else:
            phi_q = rebased_module.squared_features(q, scale)
            phi_k = rebased_module.squared_features(k, scale)
        o, _ = based_module.kernel_attention(phi_q, phi_k, x["v"], eps, True, mode, chunk_size)
        return o, None

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        fn = getattr(reference, name)
        outs = [
            np.stack([fn(_heads(x["q"], h, n), _heads(x["k"], h, n), _heads(x["v"], h, n),
                         scale=scale) for h in range(H)], axis=1)
            for n in range(B)
        ]  # fmt: skip
        return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)

    # the chunk form's state is [D', V + 1] on the D' = (1 + K +) K^2 features
    def nearest_dims(K: int, V: int) -> tuple[int, int]:
        return (1 + K if name == "based" else 0) + K * K, V

    return Case(inputs, call, oracle, "linear", nearest_dims=nearest_dims)


def rwkv4_case() -> Case:
    """RWKV-4's WKV on k, v [B, T, H, V] (C = H V channels), w, u [H, V], the state S0
    [B, 3, 1, C] (alpha, beta > 0, eps): ``linattn.compat.rwkv4.wkv``."""
    from linattn.compat.rwkv4 import wkv
    from linattn.reference.rwkv4 import wkv as reference

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, uniform, _, _ = _draw(gen, dtype)
        C = H * V
        S0 = torch.stack([normal(B, C), 0.5 + uniform(B, C), normal(B, C)], 1)
        return {"w": normal(H, V) - 1.0, "u": normal(H, V), "k": normal(B, T, H, V),
                "v": normal(B, T, H, V), "S0": S0.unsqueeze(2)}  # fmt: skip

    def _state0(x, B, C):
        S0 = x.get("S0")
        if S0 is not None:
            return S0
        zeros = torch.zeros(B, C, dtype=x["k"].dtype)
        return torch.stack([zeros, zeros, torch.full_like(zeros, -1e38)], 1).unsqueeze(2)

    def call(x, mode, chunk_size, scale):
        B, T, H, V = x["k"].shape
        o, S = wkv(
            x["w"].flatten(), x["u"].flatten(), x["k"].flatten(2), x["v"].flatten(2),
            _state0(x, B, H * V), mode=mode, chunk_size=chunk_size,
        )  # fmt: skip
        return o.view(B, T, H, V), S

    def oracle(x, scale):
        B, T, H, V = x["k"].shape
        pairs = [
            reference(x["w"].flatten().double().numpy(), x["u"].flatten().double().numpy(),
                      x["k"][n].flatten(1).double().numpy(), x["v"][n].flatten(1).double().numpy(),
                      initial_state=x["S0"][n, :, 0].double().numpy())
            for n in range(B)
        ]  # fmt: skip
        o = torch.from_numpy(np.stack([o for o, _ in pairs])).view(B, T, H, V)
        return o, torch.from_numpy(np.stack([S for _, S in pairs])).unsqueeze(2)

    return Case(inputs, call, oracle, "linear")


def retention_case() -> Case:
    """Retention: RetNet's decays gamma_h = 1 - 2^(-5 - h)."""
    from linattn.reference.retention import retention_decays

    return constant_decay_case(retention_decays)


def lightning_case(layer_idx: int = 1, num_layers: int = 4) -> Case:
    """Lightning attention: gamma_h = exp(-(8 / H) (1 - layer_idx / num_layers) h)."""
    from linattn.reference.retention import lightning_decays

    return constant_decay_case(lambda H: lightning_decays(H, layer_idx, num_layers))


# --- log-linear attention: the level states are the state -----------------------------


LOG_LINEAR_OFFSET = 7  # the position the case's sequences continue from: levels 1, 2, 3 occupied
LOG_LINEAR_LEVELS = 8  # L: the weights lambda_t^(0 .. 7) per token and head


def log_linear_case(delta: bool = False) -> Case:
    """Log-linear Mamba-2 (``linattn.ops.log_linear``; ``delta``: log-linear Gated DeltaNet, with
    write strengths beta in [0, 2]). Its state is O(log T) level states, not
    one [K, V] memory: "S0" is the level states [B, 3, H, K, V] of a sequence continued from
    position ``LOG_LINEAR_OFFSET`` = 7 (levels 1 .. 3 occupied), the S of (o, S) the final level
    states [B, n, H, K, V] (n = max(3, L - 1, bit_length(7 + T))); the oracle is
    ``linattn.reference.log_linear.recurrence``, head by head."""
    from linattn.ops.log_linear import LogLinearState, log_linear_attention
    from linattn.reference.log_linear import recurrence

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        normal, uniform, _, log_decay = _draw(gen, dtype)
        x["g"], x["level_scales"] = log_decay(B, T, H), uniform(B, T, H, LOG_LINEAR_LEVELS)
        x["S0"] = normal(B, 3, H, K, V)
        if delta:
            x["beta"] = 2 * uniform(B, T, H)
        return x

    def call(x, mode, chunk_size, scale):
        B = x["q"].shape[0]
        state = None
        if x.get("S0") is not None:
            state = LogLinearState(x["S0"], torch.full((B,), LOG_LINEAR_OFFSET))
        o, final = log_linear_attention(
            x["q"], x["k"], x["v"], x["g"], x["level_scales"], scale=scale, mode=mode,
            chunk_size=chunk_size, initial_state=state, output_final_state=True,
            beta=x.get("beta"),
        )  # fmt: skip
        return o, final.S

    def oracle(x, scale):
        B, T, H, _ = x["q"].shape
        outs, states = [], []
        for n in range(B):
            pairs = [
                recurrence(
                    *(_heads(x[name], h, n) for name in ("q", "k", "v", "g", "level_scales")),
                    scale=scale, initial_state=x["S0"][n, :, h].double().numpy(),
                    offset=LOG_LINEAR_OFFSET, beta=_heads(x.get("beta"), h, n),
                )
                for h in range(H)
            ]  # fmt: skip
            outs.append(np.stack([o for o, _ in pairs], axis=1))
            states.append(np.stack([np.stack(S) for _, S in pairs], axis=1))
        return torch.from_numpy(np.stack(outs)), torch.from_numpy(np.stack(states))

    return Case(inputs, call, oracle, "linear")


# --- MesaNet (two states, a solve per token) ------------------------------------------


def mesa_case(iterations_per_key: int = 2) -> Case:
    """MesaNet (``linattn.ops.mesa``): inputs q, k (unit), v, g (per head), beta in [0, 1], lamb
    [H, K] in [0.25, 1.25], and its two initial states, S0 = h_kk (symmetric, positive
    semidefinite) and S0_kv = h_kv. The call solves by textbook conjugate gradients
    (``cg_eps=0``, ``iterations_per_key * K`` steps: converged to rounding) and returns the two
    final states side by side as one [B, H, K, K + V] tensor, so that the Case contract's single
    state S holds both (the oracle returns the same)."""
    from linattn.ops.mesa import mesa_net

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, uniform, unit, log_decay = _draw(gen, dtype)
        x = {"q": normal(B, T, H, K), "k": unit(B, T, H, K), "v": normal(B, T, H, V)}
        x["g"], x["beta"] = log_decay(B, T, H), uniform(B, T, H)
        x["lamb"] = uniform(H, K) + 0.25
        root = normal(B, H, K, K).double() / K
        x["S0"] = (root @ root.transpose(-1, -2)).to(dtype)
        x["S0_kv"] = normal(B, H, K, V)
        return x

    def call(x, mode, chunk_size, scale):
        K = x["q"].shape[-1]
        o, h_kk, h_kv = mesa_net(
            x["q"] * scale, x["k"], x["v"], x["g"], x["beta"], x["lamb"], mode=mode,
            chunk_size=chunk_size, h_kk_init=x.get("S0"), h_kv_init=x.get("S0_kv"),
            output_final_state=True, max_cg_iterations=iterations_per_key * K, cg_eps=0.0,
        )  # fmt: skip
        return o, torch.cat([h_kk, h_kv], dim=-1)

    def oracle(x, scale):
        from linattn.reference.mesa import mesa_net as reference

        B, _, H, _ = x["q"].shape

        def head(n, h):
            s_kk, s_kv = x.get("S0"), x.get("S0_kv")
            o, h_kk, h_kv = reference(
                scale * _heads(x["q"], h, n), _heads(x["k"], h, n), _heads(x["v"], h, n),
                _heads(x["g"], h, n), _heads(x["beta"], h, n), x["lamb"][h].double().numpy(),
                None if s_kk is None else s_kk[n, h].double().numpy(),
                None if s_kv is None else s_kv[n, h].double().numpy(),
            )  # fmt: skip
            return o, np.concatenate([h_kk, h_kv], axis=-1)

        return _per_head(head, x, B, H)

    return Case(inputs, call, oracle, "linear")


# --- DeltaFormer (the delta rule's pseudo-values with a softmax kernel) ----------------


def deltaformer_case() -> Case:
    """DeltaFormer (``linattn.ops.deltaformer``): q, k, v normal, beta in [0, 1]; no state (the
    pseudo-values are a cache, as softmax attention's keys): S is empty, as softmax's case."""
    from linattn.ops.deltaformer import deltaformer

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, uniform, _, _ = _draw(gen, dtype)
        return {"q": normal(B, T, H, K), "k": normal(B, T, H, K), "v": normal(B, T, H, V),
                "beta": uniform(B, T, H)}  # fmt: skip

    def call(x, mode, chunk_size, scale):
        o = deltaformer(x["q"], x["k"], x["v"], x.get("beta"), scale=scale, mode=mode,
                        chunk_size=chunk_size)  # fmt: skip
        return o, None

    def oracle(x, scale):
        from linattn.reference.deltaformer import deltaformer as reference

        B, _, H, _ = x["q"].shape
        return _per_head(
            lambda n, h: (reference(_heads(x["q"], h, n), _heads(x["k"], h, n),
                                    _heads(x["v"], h, n), _heads(x.get("beta"), h, n),
                                    scale=scale)[0], np.zeros(0)),
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "softmax")


# --- PaTH attention (Householder transitions inside softmax scores) --------------------


def path_case() -> Case:
    """PaTH attention (``linattn.ops.path``): q, k, v normal, w unit, beta in [0, 2], a forget
    gate per head g; no fixed state (S empty, as softmax's case)."""
    from linattn.ops.path import path_attention

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal, uniform, unit, log_decay = _draw(gen, dtype)
        x = {"q": normal(B, T, H, K), "k": normal(B, T, H, K), "v": normal(B, T, H, V)}
        x.update(w=unit(B, T, H, K), beta=2 * uniform(B, T, H), g=log_decay(B, T, H))
        return x

    def call(x, mode, chunk_size, scale):
        o = path_attention(x["q"], x["k"], x["v"], x["w"], x["beta"], x.get("g"), scale=scale,
                           mode=mode, chunk_size=chunk_size)  # fmt: skip
        return o, None

    def oracle(x, scale):
        from linattn.reference.path import path_attention as reference

        B, _, H, _ = x["q"].shape
        names = ("q", "k", "v", "w", "beta", "g")
        return _per_head(
            lambda n, h: (reference(*(_heads(x.get(m), h, n) for m in names), scale=scale)[0],
                          np.zeros(0)),
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "softmax")


# --- the delta rule's descendants with a second state ---------------------------------


def _with_second_state(S: Tensor | None, second: Tensor | None) -> Tensor | None:
    """The memory [B, HV, K, V] and a second state [B, H, ...] as one tensor [B, HV, K V + ...]
    (H = HV in the cases), so that the property tests compare and differentiate both."""
    if S is None:
        return None
    return torch.cat([S.flatten(2), second.flatten(2)], dim=-1)


def precond_case(gate: str) -> Case:
    """Preconditioned DeltaNet (``linattn.ops.precond_delta_rule``): gate "head" (Preconditioned
    Gated DeltaNet) or "channel" (Preconditioned KDA); the ATK state A [B, H, K] rides along S."""
    from linattn.ops.precond_delta_rule import precond_delta_rule
    from linattn.reference.precond_delta import recurrence

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        normal, uniform, _, log_decay = _draw(gen, dtype)
        x["g_atk"], x["beta_atk"] = log_decay(B, T, H), uniform(B, T, H)
        x["beta"] = uniform(B, T, H)
        x["g"] = _gate(log_decay, gate, B, T, H, K)
        x["initial_A_state"], x["log_atk_scale"] = uniform(B, H, K), normal(H) * 0.5
        return x

    def call(x, mode, chunk_size, scale):
        o, S, A = precond_delta_rule(
            x["q"], x["k"], x["v"], x["g_atk"], x["beta_atk"], x["beta"], x["g"],
            log_atk_scale=x["log_atk_scale"], initial_A_state=x["initial_A_state"],
            use_qk_l2norm=False,
            **_common(mode, chunk_size, scale, x),
        )  # fmt: skip
        return o, _with_second_state(S, A)

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        outs, states = [], []
        for n in range(B):
            runs = [
                recurrence(
                    *(_heads(x[name], h, n) for name in
                      ("q", "k", "v", "g_atk", "beta_atk", "beta", "g")),
                    center=float(x["log_atk_scale"][h]), scale=scale,
                    initial_state=_state(x, n, h),
                    initial_A_state=x["initial_A_state"][n, h].double().numpy(),
                )
                for h in range(H)
            ]  # fmt: skip
            outs.append(np.stack([o for o, _, _ in runs], axis=1))
            states.append(np.stack([np.concatenate([S.ravel(), A]) for _, S, A in runs]))
        return torch.from_numpy(np.stack(outs)), torch.from_numpy(np.stack(states))

    return Case(inputs, call, oracle, "dplr")


def momentum_case() -> Case:
    """The momentum delta rule (``linattn.ops.momentum_delta_rule``): unit k and p, decays from
    a sigmoid, beta in [0, 1], eta in [0, 2]; its state is the pair [S; M], [2, B, H, K, V]."""
    from linattn.ops.momentum_delta_rule import momentum_delta_rule
    from linattn.reference.momentum_delta import recurrence

    names = ("q", "k", "v", "p", "log_alpha", "log_mu", "beta", "eta")

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        normal, uniform, unit, log_decay = _draw(gen, dtype)
        x["p"], x["log_alpha"], x["log_mu"] = (
            unit(B, T, H, K),
            log_decay(B, T, H),
            log_decay(B, T, H),
        )
        x["beta"], x["eta"] = uniform(B, T, H), 2 * uniform(B, T, H)
        x["S0"] = torch.stack([x["S0"], normal(B, H, K, V)])
        return x

    def call(x, mode, chunk_size, scale):
        return momentum_delta_rule(
            *(x[name] for name in names), use_qk_l2norm=False, use_p_times_alpha=False,
            **_common(mode, chunk_size, scale, x),
        )  # fmt: skip

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        outs, states = [], []
        S0 = x["S0"].double().numpy()
        for n in range(B):
            runs = [
                recurrence(
                    *(_heads(x[name], h, n) for name in names), scale=scale,
                    initial_state=S0[0, n, h], initial_momentum=S0[1, n, h],
                )
                for h in range(H)
            ]  # fmt: skip
            outs.append(np.stack([o for o, _, _ in runs], axis=1))
            states.append(np.stack([np.stack([S for _, S, _ in runs]),
                                    np.stack([M for _, _, M in runs])]))  # fmt: skip
        return torch.from_numpy(np.stack(outs)), torch.from_numpy(np.stack(states, axis=1))

    return Case(inputs, call, oracle, "dplr")


def gated_oja_case() -> Case:
    """The gated Oja rule (``linattn.ops.gated_oja_rule``): unit v (its contraction I - beta v
    v^T needs beta |v|^2 <= 2), beta in [0, 1], a log-decay per value channel."""
    from linattn.ops.gated_oja_rule import gated_oja_rule
    from linattn.reference.gated_oja import recurrence

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = _qkv(gen, dtype, B, T, H, K, V)
        normal, uniform, unit, log_decay = _draw(gen, dtype)
        x["k"], x["v"] = normal(B, T, H, K), unit(B, T, H, V)
        x["gv"], x["beta"] = log_decay(B, T, H, V), uniform(B, T, H)
        return x

    def call(x, mode, chunk_size, scale):
        return gated_oja_rule(
            x["q"], x["k"], x["v"], x["gv"], x["beta"], **_common(mode, chunk_size, scale, x)
        )

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        return _per_head(
            lambda n, h: recurrence(
                *(_heads(x[name], h, n) for name in ("q", "k", "v", "gv", "beta")), scale=scale,
                initial_state=_state(x, n, h),
            ),
            x, B, H,
        )  # fmt: skip

    return Case(inputs, call, oracle, "delta")


# --- forgetting attention (FoX) and stick-breaking attention -------------------------


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
        return _outputs_per_head(x, ("q", "k", "v", "g"), lambda *t: reference(*t, scale=scale))

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
        return _outputs_per_head(x, ("q", "k", "v"), lambda *t: reference(*t, scale=scale)[0])

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
        return _outputs_per_head(x, ("q", "r", "k", "v"), lambda *t: parallax(*t, scale=scale))

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
        names = ("q", "k", "v", "g", "gs")
        return _outputs_per_head(x, names, lambda *t: reference(*t, scale=scale))

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
        return _outputs_per_head(x, ("q", "k", "v"), lambda *t: reference(*t, 4, 3))

    return Case(inputs, call, oracle, "softmax")


def dsa_case() -> Case:
    """DeepSeek sparse attention with 2 index heads of the keys' width, signed head weights and
    5 tokens kept a query; the oracle is ``linattn.reference.dsa``'s loop."""
    from linattn.ops.dsa import deepseek_sparse_attention
    from linattn.reference.dsa import deepseek_sparse_attention as reference

    def inputs(B, T, H, K, V, seed=0, dtype=torch.float64) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        normal = _draw(gen, dtype)[0]
        x = {"q": normal(B, T, H, K), "k": normal(B, T, H, K), "v": normal(B, T, H, V)}
        return {**x, "q_idx": normal(B, T, 2, K), "k_idx": normal(B, T, K),
                "w_idx": normal(B, T, 2)}  # fmt: skip

    def call(x, mode, chunk_size, scale):
        o, _ = deepseek_sparse_attention(x["q"], x["k"], x["v"], x["q_idx"], x["k_idx"],
                                         x["w_idx"], topk=5, scale=scale)  # fmt: skip
        return o, None

    def oracle(x, scale):
        B, _, H, _ = x["q"].shape
        index = [x[n][b].double().numpy() for n in ("q_idx", "k_idx", "w_idx") for b in range(B)]

        def head(b, h):
            q = _heads(x["q"], h, b)[:, None]
            args = (q, _heads(x["k"], h, b), _heads(x["v"], h, b), *index[b::B])
            return reference(*args, 5, scale)[:, 0]

        outs = [np.stack([head(b, h) for h in range(H)], axis=1) for b in range(B)]
        return torch.from_numpy(np.stack(outs)), torch.zeros(0, dtype=torch.float64)

    return Case(inputs, call, oracle, "softmax")
