"""Which row of the mechanism table a call is: the rule and the gate, resolved once (spec 5, 7, 10;
docs/design.md, "The mechanism table").

The public op knows from its arguments which mechanism it runs: the additive rule (no ``beta``),
the delta rule (``beta`` given) or the generalized delta rule (``generalized_delta_rule``: its a
and b), and no gate, one log-decay per head (``g`` [B, T, H]) or one per key channel (``g``
[B, T, H, K]). It resolves them here once, from the public shapes (internally a per-head gate is
[B, H, T, 1], which a per-channel gate of K = 1 would look like), and passes the ``Mechanism``
down: the chunk terms, the state loop, the affine maps and context parallelism read it instead of
testing tensors for None or their last dimension for 1; ``rule`` is the rule
(``linattn.ops.rules``), ``rule_name`` its name (the ops' schema argument).

| rule     | gate    | mechanism                                     |
|----------|---------|-----------------------------------------------|
| additive | none    | linear attention                              |
| additive | head    | Mamba-2 / RetNet                              |
| additive | channel | GLA                                           |
| delta    | none    | DeltaNet                                      |
| delta    | head    | Gated DeltaNet                                |
| delta    | channel | Kimi Delta Attention (KDA)                    |
| dplr     | none    | IPLR: I + a b^T                               |
| dplr     | head    | exp(g) I + a b^T (Comba)                      |
| dplr     | channel | DPLR: Diag(exp g) + a b^T (RWKV-7, GDN-2)     |
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from linattn.ops import rules

GATES = ("none", "head", "channel")
RULES = rules.BUILT_IN  # the built-in rules, in the table's order (a user's follow: ``code``)


@dataclass(frozen=True)
class Mechanism:
    """A rule (registered in ``linattn.ops.rules``, by name) and a gate (one of ``GATES``)."""

    rule_name: str
    gate: str

    def __post_init__(self) -> None:
        rules.named(self.rule_name)  # a registered rule, else ValueError naming the rules
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")

    @classmethod
    def of(cls, beta: Tensor | None, g: Tensor | None, rule: str | None = None) -> Mechanism:
        """From the public arguments: beta [B, T, H] or None; g None, [B, T, H] or [B, T, H, K];
        ``rule`` where the op names it (else the built-in rule whose declared inputs are beta
        alone, or none: ``rules.taking``).
        """
        gate = "none" if g is None else "head" if g.dim() == 3 else "channel"
        if rule is None:
            rule = rules.taking(frozenset() if beta is None else frozenset({"beta"})).NAME
        return cls(rule, gate)

    @property
    def rule(self) -> rules.Rule:
        """The rule (``linattn.ops.rules``): its step, pseudo-values and their backward."""
        return rules.named(self.rule_name)

    @property
    def decays(self) -> bool:
        """Whether there is a gate at all (the chunk terms then have G, exp(G), D)."""
        return self.gate != "none"

    @property
    def code(self) -> int:
        """The row of the module's table (0-8 for the built-in rules, then a user's in the order
        registered): for descriptors that ranks exchange."""
        return 3 * rules.names().index(self.rule_name) + GATES.index(self.gate)
