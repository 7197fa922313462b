"""Update rules, one module each, and the table of rules (docs/design.md, "Rules are modules").

Every mechanism of the mechanism table (docs/design.md) is ``S_t = A_t S_{t-1} + k_t w_t^T``,
read as ``o_t = S_t^T q_t``. Its gate (none, one log-decay per head, one per key channel) is the
diagonal part of A_t and is handled alike for every rule (the cumulative log-gates of
``_chunk_terms``); the rule is the rest: how a token's write reads the state, and so how a
chunk's pseudo-values U (what the chunk writes, ``S <- D S + Ke^T U``) come from its values. Each
rule is an instance of a ``Rule`` subclass (``base``: the typed interface, with what a rule
declares and defines), registered here by its name.

The chunk loop (``chunk``) and the terms (``_chunk_terms``) call these and nothing else of a rule:
a new rule is a new module here, or a file of the user's that calls ``register`` (see
docs/adding-a-mechanism.md); ``Mechanism.rule`` finds it by name (``named``). A rule whose chunk
writes along more vectors than its keys (the diagonal-plus-low-rank transition, ``dplr``,
whose chunk writes Ke^T V + Ae^T U_b) stacks them along the chunk's token axis in its
``pseudo_value_terms`` (Ke = [Ke; Ae], U = [V; U_b], A_qk = [A_qk, A_qa]), so that the loop's
three steps, and their gradient, stay as they are; its own inputs ab = [a | b] travel where beta
does.

| rule     | write u_t                 | pseudo-values U of a chunk (section 8)              |
|----------|---------------------------|-----------------------------------------------------|
| additive | v_t                       | V                                                   |
| delta    | beta_t (v_t - S^T k_t)    | (I + L)^{-1} diag(beta) (V - Kd S) = U0 - W S       |
| dplr     | v_t, and a_t along b_t^T S_{t-1} | [V; U_b], (I - A_ba) U_b = A_bk V + Bd S     |
| oblique  | v_t - S^T r_t (read key r)| (I + L_rk)^{-1} (V - Rd S) = U0 - W S               |
"""

from __future__ import annotations

import importlib
import pkgutil

from linattn.ops.rules import additive, delta, dplr, oblique
from linattn.ops.rules.base import Input, PseudoValueTerms, Rule, read

__all__ = [
    "Input",
    "PseudoValueTerms",
    "Rule",
    "additive",
    "delta",
    "dplr",
    "named",
    "oblique",
    "names",
    "read",
    "register",
    "resolve",
    "taking",
    "unregister",
]


def _built_in() -> dict[str, Rule]:
    """The rules of this package's modules (every module but ``base`` defines one, ``RULE``), in
    the order of their names: a new built-in rule is a new module, and no list to edit."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name != "base":
            rule = importlib.import_module(f"{__name__}.{info.name}").RULE
            found[rule.NAME] = rule
    return found


_RULES: dict[str, Rule] = _built_in()
BUILT_IN = tuple(_RULES)


def named(name: str) -> Rule:
    """The rule registered under ``name`` ("additive", "delta", "dplr", "oblique" or a user's)."""
    try:
        return _RULES[name]
    except (KeyError, TypeError):
        raise ValueError(f"rule must be one of {names()}, got {name!r}") from None


def resolve(rule: str | Rule) -> Rule:
    """The registered rule named ``rule``, or ``rule`` itself where it is the registered instance
    (an instance that is not the one registered under its name is refused)."""
    if isinstance(rule, Rule):
        if _RULES.get(rule.NAME) is not rule:
            raise ValueError(f"rule {rule.NAME!r} is not registered (linattn.ops.rules.register)")
        return rule
    if not isinstance(rule, str):
        raise TypeError(
            f"rule must be a rule's name or a registered Rule, got {type(rule).__name__}"
        )
    return named(rule)


def taking(inputs: frozenset[str]) -> Rule:
    """The built-in rule whose declared per-token inputs (``Rule.INPUTS``) are exactly
    ``inputs``: how ``recurrent_step`` and ``chunk_affine_map``, which take the built-in rules'
    inputs as keywords, resolve their rule once (a user's rule is named: ``rule_step``)."""
    for name in BUILT_IN:
        if frozenset(x.name for x in _RULES[name].INPUTS) == inputs:
            return _RULES[name]
    raise ValueError(f"no rule takes exactly the inputs {sorted(inputs)}")


def names() -> tuple[str, ...]:
    """Every registered rule's name: the built-in ones first, in the table's order."""
    return tuple(_RULES)


def register(rule: Rule, *, replace: bool = False) -> Rule:
    """Add a user's rule (an instance of a ``Rule`` subclass) under its ``NAME``; returns it.

    A registered rule runs every form of the chunk algebra on the PyTorch backend (the fused
    C++ kernels serve the built-in rules only); ``replace`` allows a new definition under a
    name registered before (a built-in rule is never replaced)."""
    if not isinstance(rule, Rule):
        raise TypeError(f"rule must be an instance of a linattn.ops.rules.Rule subclass, got "
                        f"{type(rule).__name__}")  # fmt: skip
    name = getattr(rule, "NAME", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"rule.NAME must be a name (an identifier), got {name!r}")
    if name in BUILT_IN or (name in _RULES and not replace):
        raise ValueError(f"a rule named {name!r} is registered already")
    if rule.FUSED:
        raise ValueError(f"rule {name!r}: FUSED is for the built-in rules, whose C++ kernels exist")
    _RULES[name] = rule
    return rule


def unregister(name: str) -> None:
    """Remove a user's rule (a built-in rule stays)."""
    if name in BUILT_IN:
        raise ValueError(f"the built-in rule {name!r} cannot be removed")
    _RULES.pop(named(name).NAME)
