"""Throw invalid arguments of every kind at the new rules' entry points and count the outcomes.

    PYTHONPATH=src python benchmarks/fuzz_arguments.py [--seeds N] [--show KIND]

Entry points: linattn.ops' generalized_delta_rule, rwkv7, comba, gated_deltanet2, rwkv6,
gated_delta_product, recurrent_step (additive, delta, generalized and RWKV-6 steps), and their
linattn.compat names (fla's). Each starts from a valid call (small random tensors) and changes one
argument in one way: its type (a list, a number, a string, None), its dtype (integer, bool,
complex), its rank, its shape, its range (a gate > 0, beta outside [0, 2], ...), a non-finite
entry (NaN, Inf), aliasing (recurrent_step's ``out`` on the state), or packed sequences
(cu_seqlens of the wrong type, order or end). Each outcome is one of:

- clear: ValueError / TypeError (NotImplementedError for an option fla's kernels lack) whose
  message names the argument changed, as the user passed it;
- wrong-name: one of those errors naming something else;
- internal: any other exception (an AttributeError, a RuntimeError from inside torch, ...);
- accepted: no error.

Packed sequences with empty pieces (cu_seqlens [0, 2, 2, T], as fla accepts them) are valid:
they are run too, and counted apart (each must run, the empty sequence's final state its
initial state). The printed table has one row per entry point; every call that is not clear is
listed with its message (``--show`` picks the kinds listed).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F

import linattn.ops as L
from linattn import compat

B, T, H, K, V, N_H = 1, 6, 2, 4, 3, 2
NAMED_ERRORS = (ValueError, TypeError, NotImplementedError)


class Arg:
    """One argument of an entry point: its name as the user passes it, its valid value, and
    what kind of value it is (which changes apply)."""

    def __init__(self, name: str, value, kind: str = "tensor", **facts):
        self.name, self.value, self.kind, self.facts = name, value, kind, facts


def _rand(gen, *shape):
    return torch.randn(*shape, generator=gen)


def _unif(gen, *shape):
    return torch.rand(*shape, generator=gen)


def _unit(gen, *shape):
    return F.normalize(_rand(gen, *shape), dim=-1)


def entry_points(gen) -> dict[str, tuple[list[Arg], Callable]]:
    """name -> (its arguments, a function of them by name) for every entry point."""
    r, u, n = (lambda *s: _rand(gen, *s)), (lambda *s: _unif(gen, *s)), (lambda *s: _unit(gen, *s))
    out = {}

    def add(name, args, fn):
        out[name] = (args, fn)

    def seq_args(T=T):
        return [Arg("initial_state", r(B, H, K, V), nullable=True, state=True),
                Arg("scale", None, "scale"), Arg("output_final_state", True, "flag"),
                Arg("cu_seqlens", None, "cu_seqlens")]  # fmt: skip

    def ops_args():
        return seq_args() + [Arg("mode", "chunk", "mode"), Arg("chunk_size", 4, "chunk_size")]

    a = -n(B, T, H, K)
    gdr = [Arg("q", r(B, T, H, K)), Arg("k", n(B, T, H, K)), Arg("v", r(B, T, H, V)),
           Arg("a", a), Arg("b", -0.5 * a),
           Arg("g", -u(B, T, H, K), gate=True, nullable=True, either_rank=True)]  # fmt: skip
    add("ops.generalized_delta_rule", gdr + ops_args(), lambda x: L.generalized_delta_rule(**x))
    rw = [Arg("r", r(B, T, H, K), finite=True), Arg("w", -u(B, T, H, K), gate=True),
          Arg("k", n(B, T, H, K)), Arg("v", r(B, T, H, V)), Arg("a", -n(B, T, H, K)),
          Arg("b", n(B, T, H, K) * 0.5)]  # fmt: skip
    add("ops.rwkv7", rw + ops_args(), lambda x: L.rwkv7(**x))
    cb = [Arg("q", r(B, T, H, K)), Arg("k", n(B, T, H, K)), Arg("v", r(B, T, H, V)),
          Arg("p", n(B, T, H, K)), Arg("beta", u(B, T, H), beta=True),
          Arg("g", -u(B, T, H), gate=True, nullable=True)]  # fmt: skip
    add("ops.comba", cb + ops_args(), lambda x: L.comba(**x))
    g2 = [Arg("q", r(B, T, H, K)), Arg("k", n(B, T, H, K)), Arg("v", r(B, T, H, V)),
          Arg("g", -u(B, T, H, K), gate=True), Arg("b", u(B, T, H, K)),
          Arg("w", u(B, T, H, V))]  # fmt: skip
    add("ops.gated_deltanet2", g2 + ops_args(), lambda x: L.gated_deltanet2(**x))
    r6 = [Arg("q", r(B, T, H, K)), Arg("k", r(B, T, H, K)), Arg("v", r(B, T, H, V)),
          Arg("g", -u(B, T, H, K), gate=True, nullable=True, either_rank=True),
          Arg("u", r(H, K))]  # fmt: skip
    add("ops.rwkv6", r6 + ops_args(), lambda x: L.rwkv6(**x))
    dp = [Arg("q", r(B, T, H, K)), Arg("k", n(B, T * N_H, H, K)), Arg("v", r(B, T * N_H, H, V)),
          Arg("beta", 2 * u(B, T * N_H, H), beta=True),
          Arg("g", -u(B, T, H), gate=True, nullable=True),
          Arg("num_householder", N_H, "count")]  # fmt: skip
    add("ops.gated_delta_product", dp + ops_args(), lambda x: L.gated_delta_product(**x))

    def step_args(rule):
        args = [Arg("state", r(B, H, K, V), state=True, step_state=True), Arg("q", r(B, H, K)),
                Arg("k", n(B, H, K)), Arg("v", r(B, H, V)),
                Arg("g", -u(B, H), gate=True, nullable=True), Arg("scale", None, "scale"),
                Arg("out", None, "out")]  # fmt: skip
        if rule == "delta":
            args.append(Arg("beta", u(B, H), beta=True, nullable=True))
        elif rule == "dplr":
            sa = -n(B, H, K)
            args += [Arg("a", sa), Arg("b", -0.5 * sa)]
        elif rule == "bonus":
            args.append(Arg("bonus", r(H, K), nullable=True))
        return args

    def step(x):
        x = dict(x)
        S = x["state"]  # a fresh copy per call (the step writes it), a leaf kept as it is
        x["state"] = S.clone() if isinstance(S, torch.Tensor) and not S.requires_grad else S
        if isinstance(x.get("out"), str):  # aliasing: out on the state, or half over it
            n = x["state"].numel()
            memory = torch.zeros(2 * n)
            memory[:n] = x["state"].flatten()
            shape = x["state"].shape
            x["state"] = memory[:n].view(shape)
            x["out"] = (
                x["state"] if x["out"] == "state" else memory[n // 2 : n // 2 + n].view(shape)
            )
        return L.recurrent_step(**x)

    for rule in ("additive", "delta", "dplr", "bonus"):
        add(f"ops.recurrent_step[{rule}]", step_args(rule), step)

    # linattn.compat: fla's names and positional orders
    def fla_seq(T=T):
        return [Arg("initial_state", r(B, H, K, V), nullable=True, state=True),
                Arg("scale", None, "scale"), Arg("output_final_state", True, "flag"),
                Arg("cu_seqlens", None, "cu_seqlens")]  # fmt: skip

    a = -n(B, T, H, K)
    dplr = [Arg("q", r(B, T, H, K)), Arg("k", n(B, T, H, K)), Arg("v", r(B, T, H, V)),
            Arg("a", a), Arg("b", -0.5 * a), Arg("gk", -u(B, T, H, K), gate=True)]  # fmt: skip
    add(
        "compat.chunk_dplr_delta_rule",
        dplr + fla_seq(),
        lambda x: compat.chunk_dplr_delta_rule(**x),
    )
    add("compat.fused_recurrent_dplr_delta_rule", dplr + fla_seq(),
        lambda x: compat.fused_recurrent_dplr_delta_rule(**x))  # fmt: skip
    add("compat.chunk_iplr_delta_rule", dplr[:5] + fla_seq(),
        lambda x: compat.chunk_iplr_delta_rule(**x))  # fmt: skip
    add("compat.fused_recurrent_iplr_delta_rule", dplr[:5] + fla_seq(),
        lambda x: compat.fused_recurrent_iplr_delta_rule(**x))  # fmt: skip
    add("compat.chunk_rwkv7", rw + fla_seq(), lambda x: compat.chunk_rwkv7(**x))
    add("compat.fused_recurrent_rwkv7", rw + fla_seq(), lambda x: compat.fused_recurrent_rwkv7(**x))
    mul = rw[:4] + [Arg("kk", n(B, T, H, K)), Arg("a", 0.5 * u(B, T, H, K))]
    add("compat.fused_mul_recurrent_rwkv7", mul + fla_seq(),
        lambda x: compat.fused_mul_recurrent_rwkv7(**x))  # fmt: skip
    fcb = [Arg("q", r(B, T, H, K)), Arg("k", n(B, T, H, K)), Arg("v", r(B, T, H, V)),
           Arg("p", n(B, T, H, K), nullable=True), Arg("g", -u(B, T, H), gate=True, nullable=True),
           Arg("beta", u(B, T, H), beta=True, nullable=True)]  # fmt: skip
    add("compat.chunk_comba", fcb + fla_seq(), lambda x: compat.chunk_comba(**x))
    add(
        "compat.fused_recurrent_comba", fcb + fla_seq(), lambda x: compat.fused_recurrent_comba(**x)
    )
    add("compat.chunk_gdn2", g2 + fla_seq(), lambda x: compat.chunk_gdn2(**x))
    add("compat.fused_recurrent_gdn2", g2 + fla_seq(), lambda x: compat.fused_recurrent_gdn2(**x))
    fr6 = [Arg("r", r(B, T, H, K), finite=True), Arg("k", r(B, T, H, K)), Arg("v", r(B, T, H, V)),
           Arg("w", -u(B, T, H, K), gate=True), Arg("u", r(H, K))]  # fmt: skip
    add("compat.chunk_rwkv6", fr6 + fla_seq(), lambda x: compat.chunk_rwkv6(**x))
    add(
        "compat.fused_recurrent_rwkv6", fr6 + fla_seq(), lambda x: compat.fused_recurrent_rwkv6(**x)
    )
    fdp = [Arg("q", r(B, T, H, K)), Arg("k", n(B, T * N_H, H, K)), Arg("v", r(B, T * N_H, H, V)),
           Arg("g", -u(B, T, H), gate=True, nullable=True),
           Arg("beta", 2 * u(B, T * N_H, H), beta=True),
           Arg("num_householder", N_H, "count")]  # fmt: skip
    add("compat.chunk_gated_delta_product", fdp + fla_seq(),
        lambda x: compat.chunk_gated_delta_product(**x))  # fmt: skip
    return out


def _poison(x: torch.Tensor, value: float) -> torch.Tensor:
    y = x.clone()
    y.view(-1)[y.numel() // 2] = value
    return y


def changes(arg: Arg, entry: str) -> list[tuple[str, str, object]]:
    """(kind, what, the changed value) for one argument."""
    x, f = arg.value, arg.facts
    out: list[tuple[str, str, object]] = []
    if arg.kind == "tensor":
        out += [("type", "a list", x.tolist()), ("type", "a string", "x"),
                ("type", "a number", 0.5)]  # fmt: skip
        if not f.get("nullable"):
            out.append(("type", "None", None))
        for dtype in (torch.int64, torch.bool, torch.complex64):
            out.append(("dtype", str(dtype), x.to(dtype)))
        out.append(("rank", "one more dimension", x.unsqueeze(0)))
        if not f.get("either_rank"):  # a gate per head or per channel: both ranks valid
            out.append(("rank", "one dimension less", x[..., 0]))
        if x.dim() >= 1:
            out.append(("shape", "last size + 1", torch.cat([x, x[..., :1]], dim=-1)))
        if x.dim() >= 2 and not f.get("step_state"):
            out.append(("shape", "second size - 1", x[:, :-1] if x.shape[1] > 1 else x[:, :0]))
        if x.dim() == 4 and x.shape[2] > 1:
            out.append(("shape", "heads - 1", x[:, :, :-1]))
        out += [("non-finite", "NaN", _poison(x, math.nan)),
                ("non-finite", "+Inf", _poison(x, math.inf))]  # fmt: skip
        if f.get("gate"):
            out.append(("range", "a gate > 0", _poison(x, 0.5)))
        if f.get("beta"):
            out += [("range", "beta = 5", torch.full_like(x, 5.0)),
                    ("range", "beta = -3", torch.full_like(x, -3.0))]  # fmt: skip
        if f.get("state"):
            out.append(("non-finite", "-Inf", _poison(x, -math.inf)))
        if f.get("step_state"):  # updated in place: a leaf that requires grad cannot be
            out.append(("aliasing", "a leaf that requires grad", x.clone().requires_grad_()))
    elif arg.kind == "scale":
        out += [("type", "a string", "0.5"), ("type", "a bool", True), ("type", "a list", [0.5]),
                ("type", "a complex", 1j), ("non-finite", "NaN", math.nan),
                ("non-finite", "Inf", math.inf)]  # fmt: skip
    elif arg.kind == "flag":
        out += [("type", "a string", "yes"), ("type", "an int", 1)]
    elif arg.kind == "mode":
        out += [("range", "unknown", "fused"), ("type", "an int", 1)]
    elif arg.kind in ("chunk_size", "count"):
        out += [("range", "0", 0), ("range", "-2", -2), ("type", "a float", 2.0),
                ("type", "a string", "2"), ("type", "a bool", True)]  # fmt: skip
    elif arg.kind == "cu_seqlens":
        out += [("type", "a list", [0, 2, T]), ("dtype", "float", torch.tensor([0.0, 2.0, T])),
                ("rank", "2-D", torch.tensor([[0, 2, T]])),
                ("range", "decreasing", torch.tensor([0, 4, 2, T])),
                ("range", "not ending at T", torch.tensor([0, 2, T - 1])),
                ("range", "not starting at 0", torch.tensor([1, 2, T]))]  # fmt: skip
    elif arg.kind == "out":
        out += [("aliasing", "out = state", "state"),
                ("aliasing", "out half over the state", "half"),
                ("type", "a list", [0.0]),
                ("dtype", "float64", torch.zeros(B, H, K, V, dtype=torch.float64)),
                ("shape", "last size + 1", torch.zeros(B, H, K, V + 1))]  # fmt: skip
    return out


def _names_it(message: str, name: str) -> bool:
    """Whether ``message`` names the argument ``name`` (a whole word used as a name: "a must",
    "a, b", "`a`", ... and not the article of "a tensor")."""
    words = re.escape(name)
    pattern = rf"(^|[\s(`'\",]){words}($|[\s,:=.`'\")\[])"
    for m in re.finditer(pattern, message):
        after = message[m.end() :]
        if len(name) > 1 or m.start() == 0 and not m.group(1):
            return True
        before = message[: m.start() + len(m.group(1))]
        if re.match(
            r"(must|contains|is|and|come|,|;|=|\)|:|\]|`|')", after.lstrip()
        ) or before.endswith((",", "`", "'", "(", ", ")):
            return True
    return False


def outcome(fn, kwargs, name: str, others: tuple[str, ...] = ()) -> tuple[str, str]:
    """The outcome of ``fn(kwargs)`` with ``name`` changed; ``others``: the names that a
    message may give instead (a shape that disagrees with another argument's may name either)."""
    try:
        fn(kwargs)
    except NAMED_ERRORS as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        named = any(_names_it(str(e), n) for n in (name, *others))
        return ("clear" if named else "wrong-name"), f"{type(e).__name__}: {message}"
    except Exception as e:  # noqa: BLE001
        return "internal", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return "accepted", ""


def empty_pieces(entry: str, args: list[Arg], fn) -> tuple[str, str]:
    """cu_seqlens [0, 2, 2, T]: valid (fla takes it); the empty sequence keeps its state."""
    kwargs = {a.name: a.value for a in args}
    if "cu_seqlens" not in kwargs:
        return "n/a", ""
    S0 = kwargs["initial_state"]
    kwargs["initial_state"] = torch.cat([S0, S0 + 1, S0 - 1])
    kwargs["cu_seqlens"] = torch.tensor([0, 2, 2, T])
    try:
        _, S = fn(kwargs)
    except Exception as e:  # noqa: BLE001
        return "refused", f"{type(e).__name__}: {e}"
    if not torch.equal(S[1].float(), kwargs["initial_state"][1]):
        return "wrong", "the empty sequence's final state is not its initial state"
    return "ran", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="random valid calls per entry point")
    parser.add_argument("--show", nargs="*", default=["wrong-name", "internal", "accepted"])
    opts = parser.parse_args(argv)
    totals, rows, shown = Counter(), [], []
    pieces = Counter()
    for seed in range(opts.seeds):
        gen = torch.Generator().manual_seed(seed)
        for entry, (args, fn) in entry_points(gen).items():
            counts = Counter()
            valid = {a.name: a.value for a in args}
            try:
                fn(valid)
            except Exception as e:  # noqa: BLE001
                print(f"the valid call of {entry} fails: {type(e).__name__}: {e}")
                return 2
            for arg in args:
                for kind, what, value in changes(arg, entry):
                    kwargs = dict(valid)
                    kwargs[arg.name] = value
                    others = tuple(a.name for a in args) if kind in ("shape", "rank") else ()
                    result, message = outcome(fn, kwargs, arg.name, others)
                    counts[result] += 1
                    if result in opts.show and seed == 0:
                        shown.append(
                            f"  {result:10s} {entry} {arg.name} ({kind}: {what}): {message}"
                        )
            if seed == 0:
                rows.append((entry, counts))
            totals.update(counts)
            result, message = empty_pieces(entry, args, fn)
            pieces[result] += 1
            if result in ("refused", "wrong"):
                shown.append(f"  empty pieces {result}: {entry}: {message}")
    print(f"{'entry point (seed 0)':45s} {'clear':>6s} {'wrong-name':>11s} {'internal':>9s} "
          f"{'accepted':>9s}")  # fmt: skip
    for entry, c in rows:
        print(f"{entry:45s} {c['clear']:6d} {c['wrong-name']:11d} {c['internal']:9d} "
              f"{c['accepted']:9d}")  # fmt: skip
    print(f"\ninvalid calls over {opts.seeds} seeds: {sum(totals.values())}: clear "
          f"{totals['clear']}, wrong-name {totals['wrong-name']}, internal {totals['internal']}, "
          f"accepted {totals['accepted']}")  # fmt: skip
    print(f"valid calls with empty pieces (cu_seqlens [0, 2, 2, {T}]): ran {pieces['ran']}, "
          f"refused {pieces['refused']}, wrong {pieces['wrong']}")  # fmt: skip
    if shown:
        print("\nnot clear (seed 0):")
        print("\n".join(shown))
    bad = totals["wrong-name"] + totals["internal"] + totals["accepted"]
    return 1 if bad or pieces["refused"] or pieces["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
