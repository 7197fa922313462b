"""Which row of the mechanism table a call is: the rule and the gate, resolved once (spec 5, 7, 10;
docs/design.md, "The mechanism table").

The public op knows from its arguments which mechanism it runs: the additive rule (no ``beta``),
the delta rule (``beta`` given) or the generalized delta rule (``generalized_delta_rule``: its a
and b), and no gate, one log-decay per head (``g`` [B, T, H]) or one per key channel (``g``
[B, T, H, K]). It resolves them here once, from the public shapes (internally a per-head gate is
[B, H, T, 1], which a per-channel gate of K = 1 would look like), and passes the ``Mechanism``
down: the chunk terms, the state loop, the affine maps and context parallelism read it instead of
testing tensors for None or their last dimension for 1; ``rule`` is the rule's module
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
from types import ModuleType

from torch import Tensor

from linattn.ops import rules

GATES = ("none", "head", "channel")
RULES = ("additive", "delta", "dplr")  # the order of the table (``Mechanism.code``)


@dataclass(frozen=True)
class Mechanism:
    """A rule (one of ``RULES``, by name) and a gate (one of ``GATES``)."""

    rule_name: str
    gate: str

    def __post_init__(self) -> None:
        if self.rule_name not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {self.rule_name!r}")
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")

    @classmethod
    def of(cls, beta: Tensor | None, g: Tensor | None, rule: str | None = None) -> Mechanism:
        """From the public arguments: beta [B, T, H] or None; g None, [B, T, H] or [B, T, H, K];
        ``rule`` where the op names it (else the delta rule where beta is given, else additive).
        """
        gate = "none" if g is None else "head" if g.dim() == 3 else "channel"
        if rule is None:
            rule = "delta" if beta is not None else "additive"
        return cls(rule, gate)

    @property
    def rule(self) -> ModuleType:
        """The rule's module (``linattn.ops.rules``): its step, pseudo-values and their backward."""
        return rules.named(self.rule_name)

    @property
    def decays(self) -> bool:
        """Whether there is a gate at all (the chunk terms then have G, exp(G), D)."""
        return self.gate != "none"

    @property
    def code(self) -> int:
        """0-8, the row of the module's table (the order of its rows): for descriptors."""
        return 3 * RULES.index(self.rule_name) + GATES.index(self.gate)
