"""Which row of DESIGN.md's table a call is: the rule and the gate, resolved once (spec 5, 7, 10).

The public op knows from its arguments which mechanism it runs: the additive rule (no ``beta``) or
the delta rule (``beta`` given), and no gate, one log-decay per head (``g`` [B, T, H]) or one per
key channel (``g`` [B, T, H, K]). It resolves them here once, from the public shapes (internally a
per-head gate is [B, H, T, 1], which a per-channel gate of K = 1 would look like), and passes the
``Mechanism`` down: the chunk terms, the state loop, the affine maps and context parallelism read
it instead of testing tensors for None or their last dimension for 1; ``rule`` is the rule's
module (``linattn.ops.rules``).

| rule     | gate    | mechanism                     |
|----------|---------|-------------------------------|
| additive | none    | linear attention              |
| additive | head    | Mamba-2 / RetNet              |
| additive | channel | GLA                           |
| delta    | none    | DeltaNet                      |
| delta    | head    | Gated DeltaNet                |
| delta    | channel | Kimi Delta Attention (KDA)    |
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from torch import Tensor

from linattn.ops import rules

GATES = ("none", "head", "channel")


@dataclass(frozen=True)
class Mechanism:
    """A rule (``delta``: the delta rule, else the additive rule) and a gate (one of ``GATES``)."""

    delta: bool
    gate: str

    @classmethod
    def of(cls, beta: Tensor | None, g: Tensor | None) -> Mechanism:
        """From the public arguments: beta [B, T, H] or None; g None, [B, T, H] or [B, T, H, K]."""
        gate = "none" if g is None else "head" if g.dim() == 3 else "channel"
        return cls(beta is not None, gate)

    @property
    def rule(self) -> ModuleType:
        """The rule's module (``linattn.ops.rules``): its step, pseudo-values and their backward."""
        return rules.of(self.delta)

    @property
    def decays(self) -> bool:
        """Whether there is a gate at all (the chunk terms then have G, exp(G), D)."""
        return self.gate != "none"

    @property
    def code(self) -> int:
        """0-5, the row of the module's table (the order of its rows): for descriptors."""
        return 3 * self.delta + GATES.index(self.gate)
