"""``RuleMixer``: a layer for any registered rule, a user's included (docs/adding-a-mechanism.md).

    x -> q, k, v (short convolution + SiLU, q and k L2-normalised per head)
      -> the rule's inputs, one projection each, mapped into the range the rule declares
      -> the gate (none, one log-decay per head, one per key channel: ``DecayGate``)
      -> ``ops.rule_attention`` -> per-head RMSNorm * SiLU(output gate) -> output projection

A rule declares its per-token inputs (``Rule.INPUTS``: a name, a width of 1, K or V, a range);
this layer gives each a linear projection of x and maps it into that range:

    [low, high]      low + (high - low) sigmoid(z)     (the delta rule's beta in [0, 2]: 2 sigmoid)
    [low, inf)       low + softplus(z)
    (-inf, high]     high - softplus(z)
    unbounded        z

so that a rule written in one file trains in ``linattn.models.CausalLM`` with no layer of its own.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers.modules import DecayGate
from linattn.layers.recurrent import RecurrentMixer
from linattn.ops import rules
from linattn.ops.functional import l2norm

# The layer's gate kinds by the registry's names (``DecayGate``'s kinds: Mamba-2's per head, KDA's
# per key channel).
_DECAY_KINDS = {"none": None, "head": "scalar", "channel": "channel"}


def into_range(z: Tensor, spec: rules.Input) -> Tensor:
    """A projection z mapped into the declared range of ``spec`` (the module docstring)."""
    low, high = spec.low, spec.high
    if low is not None and high is not None:
        return low + (high - low) * z.sigmoid()
    if low is not None:
        return low + F.softplus(z)
    if high is not None:
        return high - F.softplus(z)
    return z


class RuleMixer(RecurrentMixer):
    """The memory of ``rule`` with ``gate`` as a token mixer.

    Args:
        d_model, n_heads: as ``RecurrentMixer`` (and its keyword arguments: head_dim, key_dim,
            num_v_heads, short_conv, conv_size, output_gate, chunk_size, norm_eps, ...).
        rule: a registered rule's name (``linattn.ops.rules``) or the registered ``Rule``.
        gate: "none", "head" (one log-decay per value head, Mamba-2's parametrisation) or
            "channel" (one per key channel, KDA's).
        qk_norm: L2-normalise q and k per head (as the delta-rule layers do; on by default, so
            that a rule whose transition is I - eps k k^T sees unit keys).
        decay_rank: the rank of the per-channel gate's projection (default: the value size).
        dt_init_range: the gates' initial step sizes (``DecayGate``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        rule: str | rules.Rule,
        gate: str = "none",
        qk_norm: bool = True,
        decay_rank: int | None = None,
        dt_init_range: tuple[float, float] = (1e-3, 1e-1),
        **kwargs,
    ) -> None:
        found = rules.resolve(rule)  # a registered rule, else the error names it
        if gate not in _DECAY_KINDS:
            raise ValueError(f"gate must be one of {tuple(_DECAY_KINDS)}, got {gate!r}")
        super().__init__(d_model, n_heads, **kwargs)
        self.rule_name, self.gate, self.qk_norm = found.NAME, gate, bool(qk_norm)
        HV, K, V = self.num_v_heads, self.key_dim, self.head_dim
        # One projection per declared input: [B, T, d_model] -> [B, T, HV * width]
        self.input_proj = nn.ModuleDict(
            {spec.name: nn.Linear(d_model, HV * spec.size(K, V)) for spec in found.INPUTS}
        )
        kind = _DECAY_KINDS[gate]
        self.decay = None
        if kind is not None:
            rank = V if decay_rank is None else decay_rank
            self.decay = DecayGate(d_model, HV, K, kind, rank=rank, dt_range=dt_init_range)

    @property
    def rule(self) -> rules.Rule:
        """The rule (looked up by name, so that a re-registered definition is the one run)."""
        return rules.named(self.rule_name)

    def rule_inputs(self, x: Tensor) -> dict[str, Tensor]:
        """The rule's inputs by name: [B, T, HV] for a width of 1, else [B, T, HV, width]."""
        B, T, _ = x.shape
        HV, K, V = self.num_v_heads, self.key_dim, self.head_dim
        inputs = {}
        for spec in self.rule.INPUTS:
            z = self.input_proj[spec.name](x)  # [B, T, HV * width]
            shape = (B, T, HV) if spec.width == "1" else (B, T, HV, spec.size(K, V))
            inputs[spec.name] = into_range(z, spec).view(shape)
        return inputs

    def recurrence(self, x, q, k, v, mode, S, keep):
        if self.qk_norm:
            q, k = l2norm(q), l2norm(k)
        g = None if self.decay is None else self.decay(x)  # [B, T, HV] or [B, T, HV, K]
        return ops.rule_attention(
            self.rule_name, q, k, v, g, mode=mode, chunk_size=self.chunk_size,
            initial_state=S, output_final_state=keep, **self.rule_inputs(x),
        )  # fmt: skip
