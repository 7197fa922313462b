"""Property checks for a rule: every form against the rule's own float64 step.

``check_rule(rule)`` is what a rule written outside the package is tested with (and what the
built-in rules pass): on random inputs drawn in the ranges the rule declares, it runs

1. the rule's own step, token by token in float64, written out here from ``Rule.write`` and
   ``Rule.entering_write`` alone (the oracle);
2. ``rule_attention`` in every form (parallel, recurrent, and chunk at chunk sizes that do and
   do not divide T), without a gate and with a gate per head and per key channel, from an
   initial state: outputs and final states against the oracle;
3. the gradients of every input (the rule's included) in the chunk and parallel forms against
   the recurrent form's, and one float64 ``gradcheck`` of the chunk form;
4. packed sequences (``cu_seqlens``) against the sequences run one by one;
5. ``rule_step`` token by token against the recurrent form;
6. context parallelism's algebra in one process: the affine map S -> M S + N of a first slice
   of the tokens (``linattn.distributed.maps.slice_map``, what the ranks exchange) carries the
   initial state to the state after that slice, and the second slice run from it ends where the
   whole sequence does (``linattn.distributed.rule_attention`` runs the same maps across
   processes).

It raises ``AssertionError`` naming the check and the error; it returns the largest error of
each check. Shapes are small: it runs in seconds on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops import rules
from linattn.ops.rule_attention import rule_attention, rule_step

GATES = ("none", "head", "channel")


def _draw_input(spec: rules.Input, shape: tuple[int, ...], gen: torch.Generator) -> Tensor:
    """Values of ``spec`` in its declared range: uniform in [low, high], low + |N(0, 1)| with
    a lower bound alone, high - |N(0, 1)| with an upper bound alone, N(0, 1) / 2 otherwise."""
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    n = torch.randn(shape, generator=gen, dtype=torch.float64)
    low, high = spec.low, spec.high
    if low is not None and high is not None:
        return low + (high - low) * u
    if low is not None:
        return low + n.abs()
    if high is not None:
        return high - n.abs()
    return 0.5 * n


def make_inputs(
    rule: rules.Rule, B: int, T: int, H: int, K: int, V: int, gate: str, seed: int = 0
) -> dict[str, Tensor]:
    """float64 inputs of ``rule_attention``: q, k (unit rows), v, g (log-decays from a sigmoid,
    or None), S0, and the rule's own inputs, [B, T, H, ...]."""
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
        "k": F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen, dtype=torch.float64),
        "S0": torch.randn(B, H, K, V, generator=gen, dtype=torch.float64),
    }
    gate_shape = {"none": None, "head": (B, T, H), "channel": (B, T, H, K)}[gate]
    x["g"] = None
    if gate_shape is not None:
        noise = torch.randn(gate_shape, generator=gen, dtype=torch.float64)
        x["g"] = F.logsigmoid(noise + 2.0)
    for spec in rule.INPUTS:
        width = () if spec.width == "1" else (spec.size(K, V),)
        x[spec.name] = _draw_input(spec, (B, T, H, *width), gen)
    return x


def oracle(rule: rules.Rule, x: dict[str, Tensor], scale: float) -> tuple[Tensor, Tensor]:
    """The rule's step token by token, one batch row and head at a time, in float64:

    (a_t, r_t) = entering_write(S, x_t);   S <- Diag(exp g_t) S;
    u_t = write(S, k_t, v_t, x_t);         S <- S + k_t u_t^T (+ a_t r_t^T);
    o_t = S^T (scale q_t).
    """
    q, k, v, g, S0 = (x[n] for n in ("q", "k", "v", "g", "S0"))
    B, T, H, _ = q.shape
    names = [spec.name for spec in rule.INPUTS]
    O = torch.empty(B, T, H, v.shape[-1], dtype=torch.float64)
    S_out = torch.empty_like(S0)
    for b in range(B):
        for h in range(H):
            S = S0[b, h].clone()
            for t in range(T):
                x_t = rule.pack({n: x[n][b, t, h] for n in names}, torch.float64)
                entering = rule.entering_write(S, x_t)
                if g is not None:
                    alpha = torch.exp(g[b, t, h]).reshape(-1, 1)  # [1 | K, 1]
                    S = alpha * S
                S = S + torch.outer(k[b, t, h], rule.write(S, k[b, t, h], v[b, t, h], x_t))
                if entering is not None:
                    S = S + torch.outer(*entering)
                O[b, t, h] = S.T @ (scale * q[b, t, h])
            S_out[b, h] = S
    return O, S_out


def _call(rule, x, mode: str, chunk_size: int, scale: float, **extra):
    own = {spec.name: x[spec.name] for spec in rule.INPUTS}
    return rule_attention(
        rule.NAME, x["q"], x["k"], x["v"], x["g"], scale=scale, mode=mode,
        chunk_size=chunk_size, initial_state=x["S0"], output_final_state=True, **own, **extra,
    )  # fmt: skip


def _error(got: Tensor, want: Tensor) -> float:
    return float((got - want).abs().max()) if got.numel() else 0.0


def _expect(name: str, error: float, tolerance: float, errors: dict) -> None:
    errors[name] = max(errors.get(name, 0.0), error)
    if not error <= tolerance:
        raise AssertionError(f"{name}: largest error {error:.2e} above {tolerance:.0e}")


def check_rule(
    rule: str | rules.Rule,
    *,
    T: int = 11,
    K: int = 4,
    V: int = 3,
    seeds: tuple[int, ...] = (0, 1),
    tolerance: float = 1e-12,
) -> dict[str, float]:
    """Run every check of the module docstring for a registered rule; {check: largest error}.

    ``tolerance`` bounds every float64 difference (forms, states, steps, packed sequences)
    relative to the values' own size (the inputs are O(1)); gradients get 100 times as much.
    """
    found = rules.resolve(rule)
    errors: dict[str, float] = {}
    scale = K**-0.5
    for seed in seeds:
        for gate in GATES:
            x = make_inputs(found, 2, T, 2, K, V, gate, seed)
            O, S = oracle(found, x, scale)
            for mode, C in (("recurrent", 1), ("parallel", 1), ("chunk", 4), ("chunk", T + 3)):
                o, S_T = _call(found, x, mode, C, scale)
                _expect(f"{mode} output, gate {gate}", _error(o, O), tolerance, errors)
                _expect(f"{mode} final state, gate {gate}", _error(S_T, S), tolerance, errors)
            _check_gradients(found, x, scale, gate, 100 * tolerance, errors)
            _check_packed(found, x, scale, gate, tolerance, errors)
            _check_steps(found, x, scale, gate, tolerance, errors)
            _check_slice_maps(found, x, scale, gate, tolerance, errors)
    _check_gradcheck(found, K, V, errors)
    return errors


def _gradients(rule, x: dict, mode: str, scale: float) -> dict[str, Tensor]:
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items() if t is not None}
    o, S = _call(rule, {**x, **leaves}, mode, 4, scale)
    weights = torch.linspace(-1.0, 1.0, o.numel(), dtype=o.dtype).view_as(o)
    ((o * weights).sum() + (S * S).sum()).backward()
    return {n: t.grad for n, t in leaves.items()}


def _check_gradients(rule, x, scale, gate, tolerance, errors) -> None:
    reference = _gradients(rule, x, "recurrent", scale)
    for mode in ("chunk", "parallel"):
        for name, grad in _gradients(rule, x, mode, scale).items():
            if grad is None or reference[name] is None:
                raise AssertionError(f"{mode} gradient of {name}, gate {gate}: missing")
            error = _error(grad, reference[name])
            _expect(f"{mode} gradient of {name}, gate {gate}", error, tolerance, errors)


def _check_packed(rule, x, scale, gate, tolerance, errors) -> None:
    """The two batch rows as packed sequences of T and T - 3 tokens, against each alone."""
    T = x["q"].shape[1]
    lengths = (T, T - 3)
    packed = {n: (None if t is None else t) for n, t in x.items()}
    for n, t in x.items():
        if t is not None and n != "S0":
            packed[n] = torch.cat([t[:1, : lengths[0]], t[1:, : lengths[1]]], dim=1)
    cu = torch.tensor([0, lengths[0], sum(lengths)])
    o, S = _call(rule, packed, "chunk", 4, scale, cu_seqlens=cu)
    for i, n in enumerate(lengths):
        alone = {m: (None if t is None else t[i : i + 1]) for m, t in x.items()}
        alone = {m: (t if t is None or m == "S0" else t[:, :n]) for m, t in alone.items()}
        o_i, S_i = _call(rule, alone, "chunk", 4, scale)
        piece = o[:, int(cu[i]) : int(cu[i + 1])]
        _expect(f"packed output, gate {gate}", _error(piece, o_i), tolerance, errors)
        _expect(f"packed final state, gate {gate}", _error(S[i : i + 1], S_i), tolerance, errors)


def _check_steps(rule, x, scale, gate, tolerance, errors) -> None:
    o_ref, S_ref = _call(rule, x, "recurrent", 1, scale)
    state = x["S0"].clone()
    T = x["q"].shape[1]
    for t in range(T):
        token = {n: x[n][:, t] for n in ("q", "k", "v")}
        g_t = None if x["g"] is None else x["g"][:, t]
        own = {spec.name: x[spec.name][:, t] for spec in rule.INPUTS}
        o_t = rule_step(rule.NAME, state, **token, g=g_t, scale=scale, **own)
        _expect(f"rule_step output, gate {gate}", _error(o_t, o_ref[:, t]), tolerance, errors)
    _expect(f"rule_step state, gate {gate}", _error(state, S_ref), tolerance, errors)


def _check_slice_maps(rule, x, scale, gate, tolerance, errors) -> None:
    """The first 5 tokens as one slice's map, folded into S_0; the rest run from it."""
    from linattn.distributed import maps  # context parallelism's maps, imported only here
    from linattn.ops.mechanism import Mechanism

    cut = 5
    first = {n: (t if t is None or n == "S0" else t[:, :cut]) for n, t in x.items()}
    rest = {n: (t if t is None or n == "S0" else t[:, cut:]) for n, t in x.items()}
    slot = rule.pack({spec.name: first[spec.name] for spec in rule.INPUTS}, torch.float64)
    M, N = maps.slice_map(
        first["k"], first["v"], slot, first["g"], Mechanism(rule.NAME, gate), chunk_size=4
    )
    S_cut = maps.apply(M, N, x["S0"])
    _, S_want = _call(rule, first, "recurrent", 1, scale)
    _expect(f"slice map, gate {gate}", _error(S_cut, S_want), tolerance, errors)
    o, S = _call(rule, {**rest, "S0": S_cut}, "chunk", 4, scale)
    o_all, S_all = _call(rule, x, "recurrent", 1, scale)
    _expect(f"slice map, then the rest, gate {gate}", _error(o, o_all[:, cut:]), tolerance, errors)
    _expect(f"slice map, final state, gate {gate}", _error(S, S_all), tolerance, errors)


def _check_gradcheck(rule, K: int, V: int, errors) -> None:
    x = make_inputs(rule, 1, 6, 1, K, V, "channel", seed=7)
    names = [n for n, t in x.items() if t is not None]

    def fn(*tensors):
        o, S = _call(rule, dict(zip(names, tensors, strict=True)), "chunk", 4, 0.5)
        return o, S

    leaves = tuple(x[n].detach().clone().requires_grad_(True) for n in names)
    if not torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-6, rtol=1e-5):
        raise AssertionError("gradcheck of the chunk form failed")
    errors["gradcheck"] = 0.0
